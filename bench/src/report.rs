//! One benchmark result: the table row and the JSON object.

use hdrhistogram::Histogram;
use serde::Serialize;

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest value.
    pub max: f64,
}

impl Percentiles {
    /// Percentiles of a nanosecond histogram, in microseconds.
    pub fn from_ns(h: &Histogram<u64>) -> Self {
        let us = |v: u64| v as f64 / 1000.0;
        Percentiles {
            p50: us(h.value_at_quantile(0.50)),
            p99: us(h.value_at_quantile(0.99)),
            p999: us(h.value_at_quantile(0.999)),
            max: us(h.max()),
        }
    }
}

/// Where and when a result was measured.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// Cores available to this process.
    pub cores: usize,
    /// CPU model, from /proc/cpuinfo where available.
    pub cpu: String,
    /// Seconds since the Unix epoch at the end of the run.
    pub unix_time: u64,
}

impl Machine {
    /// Describes this machine now.
    pub fn here() -> Self {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split(':').nth(1))
                    .map(|m| m.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        Machine {
            cores: weir_core::available_cores(),
            cpu,
            unix_time: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }
}

/// One run of `weir bench`, as written to JSON.
#[derive(Debug, Clone, Serialize)]
pub struct BenchResult {
    /// `stateless` or `keyed`.
    pub pipeline: &'static str,
    /// Checkpoint mode; `none` until checkpointing exists.
    pub mode: &'static str,
    /// Parallelism of every operator.
    pub parallelism: usize,
    /// Worker threads.
    pub workers: usize,
    /// Distinct keys.
    pub keys: u64,
    /// Target rate (open loop) or null (closed loop).
    pub rate: Option<f64>,
    /// Records generated.
    pub events: u64,
    /// Records that reached the sinks (checked against the expected count).
    pub sink_records: u64,
    /// Wall-clock seconds from job start to the last worker's exit.
    pub seconds: f64,
    /// `events / seconds`.
    pub events_per_sec: f64,
    /// End-to-end latency, source emission (scheduled time when rated) to sink.
    pub latency_us: Percentiles,
    /// Where and when.
    pub machine: Machine,
}

/// Formats a rate like `54.3 M`.
pub fn si(v: f64) -> String {
    if v >= 1e9 {
        format!("{:.2} G", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.1} M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1} k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// The table header matching [`row`].
pub fn header() -> String {
    format!(
        "{:<10} {:<6} {:>3} {:>12} {:>8} {:>11} {:>9} {:>9} {:>9} {:>9}",
        "pipeline", "mode", "par", "events", "seconds", "events/s", "p50 µs", "p99 µs", "p99.9 µs", "max µs"
    )
}

/// One table row.
pub fn row(r: &BenchResult) -> String {
    let l = &r.latency_us;
    format!(
        "{:<10} {:<6} {:>3} {:>12} {:>8.3} {:>11} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
        r.pipeline,
        r.mode,
        r.parallelism,
        r.events,
        r.seconds,
        si(r.events_per_sec),
        l.p50,
        l.p99,
        l.p999,
        l.max
    )
}
