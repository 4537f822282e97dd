//! Gaps in a thread's run: how long something else kept it from running
//! its loop, and what that costs a record arriving at a random instant.
//!
//! A latency percentile means little on its own on a virtual machine: the
//! hypervisor steals vCPUs, the kernel runs other threads on a core,
//! interrupts run. A probe thread that wakes on the workers' cores to
//! measure this takes those cores from the workers, and what it measures
//! is then partly its own cost (on these guests a `SCHED_FIFO` probe
//! waking every 200 µs raised weir's processing p99 at 200,000 records/s
//! from about 10 µs to about 22 µs). [`WorkerDelays`] holds gaps measured
//! without a probe, two ways:
//!
//! - **A worker's idle turns** ([`crate::JobMetrics::worker_delays`]). A
//!   worker reads the clock once per turn of its loop and once after each
//!   task's poll. A poll that found nothing to do, and the back-off between
//!   two turns (a spin hint or a `sched_yield`), take well under a
//!   microsecond when the core is the worker's own; a longer one is time
//!   the worker could not run. Those of [`GAP_FLOOR_NS`] or more are
//!   recorded (one comparison per turn otherwise); a park on purpose is
//!   not a gap. Polls that did work are not looked at: a delay in the
//!   middle of a batch counts as weir's own time. Not all of it is the
//!   machine's: weir's threads on other cores interrupt a worker too (a
//!   futex wake-up, a TLB shootdown), and where they share its core their
//!   slices count as gaps.
//! - **A thread spinning alone** (the benchmarks' platform figure, measured
//!   right before a run on the cores the workers will use): every interval
//!   between two of its clock readings of [`GAP_FLOOR_NS`] or more is the
//!   machine's, since nothing of weir's runs.
//!
//! From the gaps and the time observed, [`WorkerDelays::wait_at_quantile`]
//! gives the wait of a record that arrives at a uniformly random instant,
//! until the thread runs its loop again. A record landing in a gap of `g`
//! ns waits what is left of it, so `P(wait > x) = Σ max(0, g - x) /
//! observed`: for the spinning thread, the latency an engine that costs
//! nothing would show on this machine at that percentile.
//!
//! Nothing here allocates or locks per turn: a worker records into its
//! own histogram and merges it into the job's once, when it exits.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use hdrhistogram::Histogram;

use crate::runtime::metrics::LATENCY_MAX_NS;

/// Gaps shorter than this are not recorded: 1 µs. A spin round or a
/// `sched_yield` on an otherwise idle core takes well under it; a
/// percentile at or above it is exact without them.
pub const GAP_FLOOR_NS: u64 = 1_000;

/// The gaps of one or more workers over the time they were observed.
///
/// ```
/// use weir_core::WorkerDelays;
/// let mut d = WorkerDelays::new();
/// // One worker observed for 1 ms, kept from its core once for 100 µs.
/// d.add_gap(100_000);
/// d.add_observed(1_000_000);
/// // A record arriving at a random instant waited nothing 90% of the
/// // time, up to 100 µs otherwise.
/// assert_eq!(d.wait_at_quantile(0.5), 0);
/// assert!(d.wait_at_quantile(0.99) > 80_000);
/// assert_eq!(d.lost_ns(), 100_000);
/// ```
#[derive(Debug, Clone)]
pub struct WorkerDelays {
    gaps_ns: Histogram<u64>,
    lost_ns: u64,
    observed_ns: u64,
    workers: u64,
}

impl Default for WorkerDelays {
    fn default() -> Self {
        Self::new()
    }
}

impl WorkerDelays {
    /// Nothing observed yet.
    pub fn new() -> Self {
        WorkerDelays {
            gaps_ns: Histogram::new_with_bounds(1, LATENCY_MAX_NS, 3).expect("valid histogram bounds"),
            lost_ns: 0,
            observed_ns: 0,
            workers: 0,
        }
    }

    /// Records one gap of `ns` nanoseconds (clamped into the histogram's
    /// range). No allocation: the histogram's counts exist already.
    #[inline]
    pub fn add_gap(&mut self, ns: u64) {
        self.gaps_ns.saturating_record(ns.clamp(1, LATENCY_MAX_NS));
        self.lost_ns = self.lost_ns.saturating_add(ns);
    }

    /// Adds `ns` of observed worker time (one worker's run).
    pub fn add_observed(&mut self, ns: u64) {
        self.observed_ns = self.observed_ns.saturating_add(ns);
        self.workers += 1;
    }

    /// Adds `other`'s gaps and observed time into these.
    pub fn merge(&mut self, other: &WorkerDelays) {
        // Same bounds on both sides: the addition cannot fail.
        let _ = self.gaps_ns.add(&other.gaps_ns);
        self.lost_ns = self.lost_ns.saturating_add(other.lost_ns);
        self.observed_ns = self.observed_ns.saturating_add(other.observed_ns);
        self.workers += other.workers;
    }

    /// Every recorded gap, nanoseconds.
    pub fn gaps_ns(&self) -> &Histogram<u64> {
        &self.gaps_ns
    }

    /// Gaps recorded (each at least [`GAP_FLOOR_NS`]).
    pub fn gaps(&self) -> u64 {
        self.gaps_ns.len()
    }

    /// The sum of the gaps: worker time the machine took.
    pub fn lost_ns(&self) -> u64 {
        self.lost_ns
    }

    /// The longest gap, nanoseconds (0 if none).
    pub fn longest_ns(&self) -> u64 {
        if self.gaps_ns.is_empty() {
            0
        } else {
            self.gaps_ns.max()
        }
    }

    /// Worker time observed, summed over the workers.
    pub fn observed_ns(&self) -> u64 {
        self.observed_ns
    }

    /// Worker runs merged in (one per worker per attempt).
    pub fn workers(&self) -> u64 {
        self.workers
    }

    /// The wait, in nanoseconds, at quantile `q` (0..=1) of a record that
    /// arrives at a uniformly random instant of the observed time, until
    /// its worker runs its loop again (see the module docs). 0 when
    /// nothing was observed.
    pub fn wait_at_quantile(&self, q: f64) -> u64 {
        let total = self.observed_ns as f64;
        if total <= 0.0 || self.gaps_ns.is_empty() {
            return 0;
        }
        // `over(x)`: the time during which a record would wait more than x.
        let over = |x: u64| -> f64 {
            self.gaps_ns
                .iter_recorded()
                .map(|v| {
                    // The bucket's middle: within 0.1% of each gap in it.
                    let g = self.gaps_ns.median_equivalent(v.value_iterated_to());
                    g.saturating_sub(x) as f64 * v.count_at_value() as f64
                })
                .sum()
        };
        let budget = (1.0 - q.clamp(0.0, 1.0)) * total;
        // The smallest x with over(x) <= budget; over() falls as x grows.
        let (mut lo, mut hi) = (0u64, self.gaps_ns.highest_equivalent(self.gaps_ns.max()));
        if over(0) <= budget {
            return 0;
        }
        while lo + 1 < hi {
            let mid = lo + (hi - lo) / 2;
            if over(mid) <= budget {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        hi
    }
}

/// The job's merged delays, shared by every attempt's workers.
#[derive(Debug, Default)]
pub(crate) struct DelayHub {
    merged: Mutex<WorkerDelays>,
    /// Gaps and observed time before this clock reading are left out
    /// (a benchmark's warm-up); 0: from the start.
    from_ns: AtomicU64,
}

impl DelayHub {
    /// Everything the workers that exited have published.
    pub(crate) fn read(&self) -> WorkerDelays {
        self.merged.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Leaves out what happens before clock reading `ns`.
    pub(crate) fn measure_from(&self, ns: u64) {
        self.from_ns.store(ns, Ordering::Relaxed);
    }
}

/// One worker's recorder: its own histogram, merged into the hub once.
pub(crate) struct DelayRecorder<'a> {
    hub: &'a DelayHub,
    local: WorkerDelays,
    start_ns: u64,
}

impl<'a> DelayRecorder<'a> {
    /// Starts observing at clock reading `start_ns`. Allocates the
    /// worker's histogram (once, before its loop).
    pub(crate) fn new(hub: &'a DelayHub, start_ns: u64) -> Self {
        DelayRecorder {
            hub,
            local: WorkerDelays::new(),
            start_ns,
        }
    }

    /// The worker backed off from clock reading `from` to `to`; `parked`
    /// if it parked on purpose meanwhile. One comparison unless it is a
    /// gap.
    #[inline]
    pub(crate) fn turn(&mut self, from: u64, to: u64, parked: bool) {
        let gap = to.saturating_sub(from);
        if gap >= GAP_FLOOR_NS && !parked {
            self.record(from, to);
        }
    }

    #[cold]
    fn record(&mut self, from: u64, to: u64) {
        let after = self.hub.from_ns.load(Ordering::Relaxed);
        if to > after {
            self.local.add_gap(to - from.max(after));
        }
    }

    /// The worker stops at clock reading `end_ns`: publishes its figures.
    pub(crate) fn finish(mut self, end_ns: u64) {
        let after = self.hub.from_ns.load(Ordering::Relaxed);
        self.local.add_observed(end_ns.saturating_sub(self.start_ns.max(after)));
        self.hub
            .merged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .merge(&self.local);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delays(gaps: &[u64], observed: u64) -> WorkerDelays {
        let mut d = WorkerDelays::new();
        for &g in gaps {
            d.add_gap(g);
        }
        d.add_observed(observed);
        d
    }

    /// One gap of 1 ms in 1 s: 0.1% of arrivals wait, uniformly up to
    /// 1 ms. P(wait > x) = (1 ms - x) / 1 s, so p99.95 is 0.5 ms.
    #[test]
    fn the_wait_is_what_is_left_of_the_gap_an_arrival_lands_in() {
        let d = delays(&[1_000_000], 1_000_000_000);
        assert_eq!(d.wait_at_quantile(0.99), 0);
        // At the edge, within the histogram's 0.1% of the gap.
        assert!(d.wait_at_quantile(0.999) <= 1_000);
        let p9995 = d.wait_at_quantile(0.9995);
        assert!((499_000..=501_000).contains(&p9995), "{p9995}");
        let top = d.wait_at_quantile(1.0);
        assert!((999_000..=1_001_000).contains(&top), "{top}");
    }

    #[test]
    fn many_short_gaps_weigh_by_their_time() {
        // 10,000 gaps of 10 µs in 1 s: 10% of the time is lost.
        let d = delays(&vec![10_000; 10_000], 1_000_000_000);
        assert_eq!(d.wait_at_quantile(0.5), 0);
        // P(wait > x) = 0.1 * (10 µs - x) / 10 µs = 0.01 at x = 9 µs.
        let p99 = d.wait_at_quantile(0.99);
        assert!((8_950..=9_050).contains(&p99), "{p99}");
        assert_eq!(d.lost_ns(), 100_000_000);
        assert_eq!(d.gaps(), 10_000);
        assert_eq!(d.longest_ns(), d.gaps_ns().highest_equivalent(10_000));
    }

    #[test]
    fn nothing_observed_is_no_wait() {
        assert_eq!(WorkerDelays::new().wait_at_quantile(0.99), 0);
        assert_eq!(delays(&[], 1_000).wait_at_quantile(0.99), 0);
    }

    #[test]
    fn merging_pools_the_workers_time() {
        let mut a = delays(&[1_000_000], 1_000_000_000);
        a.merge(&delays(&[], 1_000_000_000));
        assert_eq!(a.workers(), 2);
        assert_eq!(a.observed_ns(), 2_000_000_000);
        // Half the share of lost time: the 99.95th is now at the gap's edge.
        assert!(a.wait_at_quantile(0.9995) <= 1_000);
        assert!(a.wait_at_quantile(0.99975) > 400_000);
    }

    #[test]
    fn the_recorder_skips_parks_short_backoffs_and_what_precedes_the_start() {
        let hub = DelayHub::default();
        let mut r = DelayRecorder::new(&hub, 0);
        r.turn(0, 500, false); // a spin: not a gap
        r.turn(1_000, 101_000, true); // parked on purpose
        r.turn(200_000, 250_000, false); // 50 µs gap
        r.finish(1_000_000);
        let d = hub.read();
        assert_eq!((d.gaps(), d.lost_ns(), d.observed_ns()), (1, 50_000, 1_000_000));

        let hub = DelayHub::default();
        hub.measure_from(220_000);
        let mut r = DelayRecorder::new(&hub, 0);
        r.turn(100_000, 150_000, false); // before: left out
        r.turn(200_000, 250_000, false); // straddles: 30 µs counted
        r.finish(1_220_000);
        let d = hub.read();
        assert_eq!((d.gaps(), d.lost_ns(), d.observed_ns()), (1, 30_000, 1_000_000));
    }
}
