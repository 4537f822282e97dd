//! The bounds of every latency histogram weir keeps (processing, visibility,
//! syncs): one shape, so that histograms from any layer merge.

use hdrhistogram::Histogram;

/// Highest latency the histograms distinguish (one hour, in nanoseconds);
/// larger values are recorded as this value.
pub const LATENCY_MAX_NS: u64 = 3_600_000_000_000;

/// An empty latency histogram: 1 ns to [`LATENCY_MAX_NS`], 3 significant digits.
pub(crate) fn new_latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_MAX_NS, 3).expect("static histogram bounds are valid")
}
