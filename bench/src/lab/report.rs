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

/// How the platform figure of a run was measured (see `crate::lab::platform`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProbeInfo {
    /// `fifo` (the machine's delays only) or `other` (SCHED_FIFO refused:
    /// also waiting behind other threads, weir's included).
    pub policy: crate::lab::platform::Policy,
    /// Time between the probe's ticks, microseconds.
    pub tick_us: u64,
    /// Wake-ups measured, summed over the cores.
    pub samples: u64,
    /// Probe threads, one per core used by the workers.
    pub cores: usize,
    /// Seconds the probe ran (from just before the job was built until
    /// it was joined).
    pub seconds: f64,
    /// Each probe thread: its core, p99 and samples (a core whose p99
    /// stands out is where the machine's delays landed).
    pub per_core: Vec<crate::lab::platform::CoreFigures>,
    /// Percentage of the probed cores' time the hypervisor took during
    /// the probe's run (`None`: unknown); see [`crate::lab::cpu_time`].
    pub steal_pct: Option<f64>,
    /// Percentage of the probed cores' time spent in interrupt handlers.
    pub irq_pct: Option<f64>,
    /// How long the workers waited behind other threads on their cores
    /// (the machine's delay a `fifo` probe cannot see; absent where
    /// `schedstat` is missing); see [`crate::lab::co_runners`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub co_runners: Option<crate::lab::co_runners::CoRunners>,
}

impl ProbeInfo {
    /// Describes a probe's result.
    pub fn of(p: &crate::lab::platform::PlatformResult) -> Self {
        ProbeInfo {
            policy: p.policy,
            tick_us: p.tick_us,
            samples: p.samples,
            cores: p.cores,
            seconds: p.seconds,
            per_core: p.per_core.clone(),
            steal_pct: p.cpu.and_then(|c| c.steal_pct()),
            irq_pct: p.cpu.and_then(|c| c.irq_pct()),
            co_runners: p.co_runners,
        }
    }

    /// `fifo, 200 µs ticks, 10234 samples on 2 cores; steal 0.0%,
    /// interrupts 0.4% of those cores' time; no 10 ms window lost over
    /// 100 µs to other threads`.
    pub fn describe(&self) -> String {
        let plural = if self.cores == 1 { "" } else { "s" };
        let mut s = if self.policy == crate::lab::platform::Policy::Spin {
            format!(
                "spin: a thread spinning alone on {} worker core{plural} right before the run ({:.1} s in all), {} \
                 gaps of 1 µs or more",
                self.cores, self.seconds, self.samples
            )
        } else {
            format!(
                "{}, {} µs ticks, {} samples on {} core{plural} during the run, preempting the workers (weir's \
                 figures include its cost)",
                self.policy.name(),
                self.tick_us,
                self.samples,
                self.cores,
            )
        };
        if let (Some(steal), Some(irq)) = (self.steal_pct, self.irq_pct) {
            s += &format!(
                "; steal {steal:.1}%, interrupts {irq:.1}% of {} time",
                if self.cores == 1 { "that core's" } else { "those cores'" }
            );
        }
        if let Some(c) = &self.co_runners {
            s += "; ";
            s += &c.describe();
        }
        s
    }
}

/// weir's latency minus the platform's in the same run, microseconds (can
/// be negative).
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Excess {
    /// weir p99 − platform p99.
    pub p99: f64,
    /// weir p99.9 − platform p99.9.
    pub p999: f64,
}

impl Excess {
    /// `weir` minus `platform`.
    pub fn of(weir: &Percentiles, platform: &Percentiles) -> Self {
        // Rounded to the nanosecond, the histograms' unit.
        let minus = |a: f64, b: f64| ((a - b) * 1e3).round() / 1e3;
        Excess {
            p99: minus(weir.p99, platform.p99),
            p999: minus(weir.p999, platform.p999),
        }
    }
}

/// Three percentiles of a small sample, in milliseconds.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Default)]
pub struct MsPercentiles {
    /// Median (nearest rank).
    pub p50: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

impl MsPercentiles {
    /// Percentiles of microsecond values, in milliseconds.
    pub fn from_us(mut v: Vec<u64>) -> Self {
        if v.is_empty() {
            return MsPercentiles::default();
        }
        v.sort_unstable();
        let rank = |q: f64| v[(((q * v.len() as f64).ceil() as usize).max(1) - 1).min(v.len() - 1)] as f64 / 1e3;
        MsPercentiles {
            p50: rank(0.50),
            p99: rank(0.99),
            max: *v.last().expect("non-empty") as f64 / 1e3,
        }
    }
}

/// Checkpoint figures of one run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CheckpointSummary {
    /// Checkpoints completed (including the final one).
    pub completed: u64,
    /// Checkpoints aborted.
    pub failed: u64,
    /// Trigger to durable manifest.
    pub duration_ms: MsPercentiles,
    /// Per checkpoint, the longest alignment of any task.
    pub alignment_ms: MsPercentiles,
    /// Operator state of the last completed checkpoint, bytes.
    pub state_bytes: u64,
    /// In-flight records stored, summed over all checkpoints, bytes.
    pub channel_state_bytes: u64,
}

impl CheckpointSummary {
    /// Summarises a job's checkpoint statistics.
    pub fn from_stats(s: &weir_core::CheckpointStats) -> Self {
        CheckpointSummary {
            completed: s.completed,
            failed: s.failed,
            duration_ms: MsPercentiles::from_us(s.history.iter().map(|r| r.duration_us).collect()),
            alignment_ms: MsPercentiles::from_us(
                s.history
                    .iter()
                    .map(|r| r.tasks.iter().map(|t| t.alignment_us).max().unwrap_or(0))
                    .collect(),
            ),
            state_bytes: s.history.back().map_or(0, |r| r.state_bytes),
            channel_state_bytes: s.history.iter().map(|r| r.channel_state_bytes).sum(),
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
    /// Checkpoint mode: none, at-least-once, aligned, unaligned.
    pub mode: &'static str,
    /// Keyed state backend (mapped or heap).
    pub state: crate::lab::pipelines::StateBackend,
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
    /// Open loop: the first records, by schedule, left out of the latency
    /// figures as the warm-up (`--warmup-ms`); 0 closed loop.
    pub warmup_records: u64,
    /// Records that reached the sinks (checked against the expected count).
    pub sink_records: u64,
    /// Wall-clock seconds from job start to the last worker's exit.
    pub seconds: f64,
    /// `events / seconds`.
    pub events_per_sec: f64,
    /// `events_per_sec` divided by the workers that had a task to run
    /// (`min(workers, tasks)`): the per-core figure of a scaling sweep.
    pub events_per_sec_per_worker: f64,
    /// Stateless job: memory copy bandwidth measured just before the job
    /// in the same run, to read weir's bytes/s against.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub copy: Option<crate::lab::copy_probe::CopyBandwidth>,
    /// Keyed job, closed loop: the ring and map microbenchmarks measured
    /// just before the job in the same run, and the ceiling they give.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parts: Option<crate::lab::parts_probe::Parts>,
    /// Keyed, closed loop, a sweep over 1 and 2 workers: the scaling model
    /// fitted to both (on the second of the two runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scaling: Option<crate::lab::scaling_model::Model>,
    /// End-to-end latency, source emission (scheduled time when rated) to sink.
    pub latency_us: Percentiles,
    /// The sink records went through.
    pub sink: crate::lab::pipelines::SinkKind,
    /// From emission to visible in the sink's target (absent for `count`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub visible_latency_us: Option<Percentiles>,
    /// Checkpoint figures (absent when checkpointing is off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoints: Option<CheckpointSummary>,
    /// Open loop: the machine's own delay, by the run's platform method:
    /// `spin` (default), the wait of a record arriving at a random instant
    /// until a thread spinning alone on a worker core runs again, measured
    /// right before the run; `fifo`, how late a `SCHED_FIFO` thread on the
    /// workers' cores woke during the run (preempting them). Absent when
    /// off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub platform_us: Option<Percentiles>,
    /// How the platform figure was measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub platform_probe: Option<ProbeInfo>,
    /// Open loop: the workers' idle turns of a microsecond or more during
    /// the run ([`crate::lab::worker_gaps::Gaps`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_gaps: Option<crate::lab::worker_gaps::Gaps>,
    /// `latency_us` minus `platform_us` (p99 and p99.9).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub excess_us: Option<Excess>,
    /// weir's fsyncs in the run, with checkpoints.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fsyncs: Option<Syncs>,
    /// CPU seconds the metrics endpoint's threads spent, with
    /// `--metrics-addr` (what serving metrics cost the machine).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_endpoint_cpu_s: Option<f64>,
    /// `--fail-at-record`: what the one injected failure cost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure: Option<crate::lab::failure::FailureReport>,
    /// Keyed job: keyed operators one after another (`--stages`).
    pub stages: usize,
    /// What the run wrote per record (write calls, and pages made dirty
    /// for storage), from the process's I/O counters; absent where they
    /// cannot be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_writes: Option<crate::lab::disk_writes::DiskWrites>,
    /// Dedup mode: per task with inputs, its deduplication state in its last
    /// snapshot (bytes) and its upstream backup (bytes at the last snapshot,
    /// the most at a snapshot, and how often it outgrew its limit).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dedup: Option<Vec<DedupTask>>,
    /// Where and when.
    pub machine: Machine,
}

/// Syncs weir issued during one run (`fsync`, `fdatasync`, folder syncs).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Syncs {
    /// fsyncs and fdatasyncs issued by weir (SQLite's own not counted).
    pub count: u64,
    /// `count` divided by the checkpoints completed.
    pub per_checkpoint: f64,
    /// Median duration of one, microseconds.
    pub p50_us: f64,
    /// 99th percentile, microseconds.
    pub p99_us: f64,
}

impl Syncs {
    /// From the syncs of a run (`sync_stats().since(before)`) that
    /// completed `checkpoints`.
    pub fn of(d: &weir_core::disk::SyncStats, checkpoints: u64) -> Self {
        Syncs {
            count: d.count,
            per_checkpoint: if checkpoints > 0 {
                d.count as f64 / checkpoints as f64
            } else {
                0.0
            },
            p50_us: d.latency_ns.value_at_quantile(0.5) as f64 / 1e3,
            p99_us: d.latency_ns.value_at_quantile(0.99) as f64 / 1e3,
        }
    }
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
        "{:<10} {:<13} {:>3} {:>12} {:>8} {:>11} {:>11} {:>9} {:>9} {:>9} {:>9} {:>6} {:>9} {:>9}",
        "pipeline",
        "mode",
        "par",
        "events",
        "seconds",
        "events/s",
        "ev/s/worker",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "max µs",
        "ckpts",
        "ckpt p50",
        "ckpt p99"
    )
}

/// The platform row under a run's [`row`]: the platform figure in the
/// latency columns; `None` when it was not measured.
pub fn platform_row(r: &BenchResult) -> Option<String> {
    let (l, probe) = (r.platform_us?, r.platform_probe.as_ref()?);
    Some(format!(
        "{:<10} {:<13} {:>3} {:>12} {:>8.3} {:>11} {:>11} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>6} {:>9} {:>9}",
        "platform",
        probe.policy.name(),
        "-",
        "-",
        probe.seconds,
        "-",
        "-",
        l.p50,
        l.p99,
        l.p999,
        l.max,
        "-",
        "-",
        "-"
    ))
}

/// `weir − platform: p99 +X µs, p99.9 +Y µs (platform: ...)`, then the
/// workers' idle turns; `None` when the platform was not measured.
pub fn excess_line(r: &BenchResult) -> Option<String> {
    let (e, probe) = (r.excess_us?, r.platform_probe.as_ref()?);
    let mut s = format!(
        "weir − platform: p99 {:+.1} µs, p99.9 {:+.1} µs (platform: {})",
        e.p99,
        e.p999,
        probe.describe()
    );
    if let Some(g) = &r.worker_gaps {
        s += &format!("\n    {}", g.describe());
    }
    Some(s)
}

/// `warm-up: the first N records (X ms of the schedule) ...`; `None`
/// without one.
pub fn warmup_line(r: &BenchResult) -> Option<String> {
    let rate = r.rate.filter(|_| r.warmup_records > 0)?;
    Some(format!(
        "warm-up: the first {} records ({:.0} ms of the schedule) ran but are not in the latency figures",
        r.warmup_records,
        r.warmup_records as f64 / rate * 1e3
    ))
}

/// `metrics endpoint: X ms of CPU over Y s on N cores = Z% of the machine`;
/// `None` when the endpoint was off.
pub fn endpoint_line(r: &BenchResult) -> Option<String> {
    let cpu = r.metrics_endpoint_cpu_s?;
    let cores = r.machine.cores.max(1) as f64;
    Some(format!(
        "metrics endpoint: {:.1} ms of CPU over {:.3} s on {} cores = {:.3}% of the machine",
        cpu * 1e3,
        r.seconds,
        r.machine.cores,
        100.0 * cpu / (r.seconds * cores)
    ))
}

/// One table row.
pub fn row(r: &BenchResult) -> String {
    let l = &r.latency_us;
    let (n, c50, c99) = match &r.checkpoints {
        Some(c) => (
            c.completed.to_string(),
            format!("{:.2}ms", c.duration_ms.p50),
            format!("{:.2}ms", c.duration_ms.p99),
        ),
        None => ("-".into(), "-".into(), "-".into()),
    };
    format!(
        "{:<10} {:<13} {:>3} {:>12} {:>8.3} {:>11} {:>11} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>6} {:>9} {:>9}",
        r.pipeline,
        r.mode,
        r.parallelism,
        r.events,
        r.seconds,
        si(r.events_per_sec),
        si(r.events_per_sec_per_worker),
        l.p50,
        l.p99,
        l.p999,
        l.max,
        n,
        c50,
        c99
    )
}

/// The parts line under a keyed closed-loop run's [`row`]: the ring and
/// map rates measured in the same run, the ceiling they give, and weir's
/// events/s as a fraction of it; `None` when not measured.
pub fn parts_line(r: &BenchResult) -> Option<String> {
    let p = r.parts.as_ref()?;
    let m = |v: f64| v / 1e6;
    Some(format!(
        "parts, measured now: ring {:.0} M rec/s ({}), FxHashMap {:.0} M upd/s, weir's mapped store {:.0} M upd/s \
         ({} keys): ceiling {:.0} M ev/s on {} core{}; weir reached {:.0}% of it",
        m(p.ring_items_per_sec),
        ring_place(p),
        m(p.map_updates_per_sec),
        m(p.mapped_updates_per_sec),
        p.keys,
        m(p.limit_events_per_sec),
        p.threads,
        if p.threads == 1 { "" } else { "s" },
        if p.limit_events_per_sec > 0.0 {
            100.0 * r.events_per_sec / p.limit_events_per_sec
        } else {
            0.0
        }
    ))
}

/// Where the parts line's ring ran: on one core, or between cores 0 and 1
/// with the handoff between them at that moment (the host's state); and
/// when the job's records do not go through it, that it is off the path.
fn ring_place(p: &crate::lab::parts_probe::Parts) -> String {
    if !p.ring_on_path {
        return "one core; not on this job's path: its one keyed subtask takes each batch by reference".to_string();
    }
    match (p.threads, p.handoff_ns) {
        (0 | 1, _) => "one core".to_string(),
        (_, Some(h)) => format!("core 0 to core 1, one-way handoff {h:.0} ns"),
        (_, None) => "core 0 to core 1".to_string(),
    }
}

/// The copy-bandwidth line under a stateless run's [`row`]: weir's bytes/s
/// (32-byte records) as a fraction of a `memcpy` of the generator's batch
/// and of main memory, measured in the same run; `None` when not measured.
pub fn copy_line(r: &BenchResult) -> Option<String> {
    let c = r.copy.as_ref()?;
    let weir = r.events_per_sec * crate::lab::copy_probe::RECORD_BYTES as f64;
    Some(format!(
        "weir moves {:.2} GB/s of records: {:.0}% of memcpy of {} KiB batches ({:.2} GB/s), \
         {:.0}% of memcpy of 64 MiB buffers ({:.2} GB/s), {} thread{} copying",
        weir / 1e9,
        100.0 * weir / c.batch_bytes_per_sec,
        c.batch_bytes / 1024,
        c.batch_bytes_per_sec / 1e9,
        100.0 * weir / c.dram_bytes_per_sec,
        c.dram_bytes_per_sec / 1e9,
        c.threads,
        if c.threads == 1 { "" } else { "s" }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parts_line_names_the_handoff_of_a_run_on_two_cores() {
        let mut p = crate::lab::parts_probe::Parts {
            threads: 2,
            keys: 10_000,
            ring_items_per_sec: 250e6,
            map_updates_per_sec: 300e6,
            mapped_updates_per_sec: 230e6,
            limit_events_per_sec: 180e6,
            ring_on_path: true,
            handoff_ns: Some(36.4),
        };
        assert_eq!(ring_place(&p), "core 0 to core 1, one-way handoff 36 ns");
        p.handoff_ns = None;
        assert_eq!(ring_place(&p), "core 0 to core 1");
        p.threads = 1;
        assert_eq!(ring_place(&p), "one core");
        p.ring_on_path = false;
        assert!(ring_place(&p).contains("not on this job's path"));
    }
}

/// One task's deduplication figures (dedup mode).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DedupTask {
    /// The task's chain and subtask.
    pub task: String,
    /// Bytes of its channel positions in its last snapshot.
    pub state_bytes: u64,
    /// Bytes in its upstream backup at its last snapshot, and the most.
    pub backup_bytes: u64,
    /// The most bytes its backup held at a snapshot.
    pub backup_peak_bytes: u64,
    /// Times its backup outgrew its limit.
    pub backup_overflows: u64,
}
