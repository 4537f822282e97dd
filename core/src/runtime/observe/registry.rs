//! What the endpoint shows: the job's counters read from aside, the rates
//! and recent history derived from them, and their two renderings
//! (Prometheus text exposition and JSON).
//!
//! The tasks publish plain counters (`crate::runtime::metrics`); a sampler thread
//! reads them once a second into this registry, which keeps the rates of
//! the last second (busy, backpressured and idle time per second, records
//! per second), a bounded series for the live page, and cumulative
//! checkpoint histograms. A request reads the counters afresh, so a scrape
//! at the end of a job sees the job's final figures.

use std::collections::VecDeque;
use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde_json::{json, Value};

use crate::checkpoint::CheckpointStats;
use crate::runtime::metrics::JobMetrics;

/// Points of the live page's series: one per sample, five minutes.
pub(crate) const SERIES_POINTS: usize = 300;
/// Checkpoints listed in `/api/job` (the newest; the counters cover all).
pub(crate) const API_CHECKPOINTS: usize = 500;

/// Upper bounds of the time histograms, seconds.
const TIME_BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];
/// Upper bounds of the latency histograms, seconds.
const LATENCY_BUCKETS: [f64; 19] = [
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
];
/// Upper bounds of the size histograms, bytes: 1 KiB to 4 GiB by fours.
const SIZE_BUCKETS: [f64; 12] = [
    1024.0,
    4096.0,
    16384.0,
    65536.0,
    262144.0,
    1048576.0,
    4194304.0,
    16777216.0,
    67108864.0,
    268435456.0,
    1073741824.0,
    4294967296.0,
];

/// A chain of the job graph.
#[derive(Debug, Clone)]
pub(crate) struct ChainInfo {
    pub(crate) operators: Vec<String>,
    pub(crate) parallelism: usize,
    /// Input rings of each subtask (0: a source chain).
    pub(crate) input_rings: usize,
}

/// The job graph as the endpoint describes it.
#[derive(Debug, Clone)]
pub(crate) struct GraphInfo {
    pub(crate) job: String,
    pub(crate) chains: Vec<ChainInfo>,
    /// `(producer chain, consumer chain)` per exchange.
    pub(crate) edges: Vec<(usize, usize)>,
    pub(crate) ring_capacity: usize,
    /// Checkpointing mode name, if on.
    pub(crate) checkpoint_mode: Option<&'static str>,
}

impl GraphInfo {
    /// The chain of every task, in the order of [`JobMetrics::tasks`].
    fn task_chains(&self) -> Vec<usize> {
        self.chains
            .iter()
            .enumerate()
            .flat_map(|(c, ch)| std::iter::repeat_n(c, ch.parallelism))
            .collect()
    }

    fn is_sink_chain(&self, c: usize) -> bool {
        !self.edges.iter().any(|&(from, _)| from == c)
    }
}

/// A cumulative histogram with fixed bucket bounds.
#[derive(Debug, Clone)]
struct Buckets {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Buckets {
    fn new(bounds: &'static [f64]) -> Self {
        Buckets {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, v: f64) {
        for (b, c) in self.bounds.iter().zip(&mut self.counts) {
            if v <= *b {
                *c += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }
}

/// Per-task figures of the last sample period.
#[derive(Debug, Clone, Copy, Default)]
struct TaskRates {
    busy_ms_per_s: f64,
    backpressured_ms_per_s: f64,
    idle_ms_per_s: f64,
    records_in_per_s: f64,
    records_out_per_s: f64,
}

/// One point of the live page's series.
#[derive(Debug, Clone, Copy)]
struct Point {
    /// Seconds since the endpoint started.
    t: f64,
    source_records_per_s: f64,
    sink_records_per_s: f64,
    latency_p50_us: f64,
    latency_p99_us: f64,
    visible_p99_us: f64,
}

/// The sampler's state; locked by the sampler and the request handlers
/// only (never by a worker).
pub(crate) struct Registry {
    pub(crate) graph: GraphInfo,
    task_chain: Vec<usize>,
    /// The previous sample: clock ns and per-task counters.
    prev: Option<(u64, Vec<[u64; 5]>)>,
    rates: Vec<TaskRates>,
    series: VecDeque<Point>,
    /// The latency histograms at the previous sample (for the percentiles
    /// of the last period).
    prev_latency: Option<(Histogram<u64>, Histogram<u64>)>,
    started_ns: u64,
    /// Completed checkpoints already in the histograms.
    absorbed: u64,
    duration: Buckets,
    alignment: Buckets,
    state_size: Buckets,
    channel_size: Buckets,
}

impl Registry {
    pub(crate) fn new(graph: GraphInfo, now_ns: u64) -> Self {
        let task_chain = graph.task_chains();
        Registry {
            graph,
            task_chain,
            prev: None,
            rates: Vec::new(),
            series: VecDeque::with_capacity(SERIES_POINTS),
            prev_latency: None,
            started_ns: now_ns,
            absorbed: 0,
            duration: Buckets::new(&TIME_BUCKETS),
            alignment: Buckets::new(&TIME_BUCKETS),
            state_size: Buckets::new(&SIZE_BUCKETS),
            channel_size: Buckets::new(&SIZE_BUCKETS),
        }
    }

    /// Takes one sample: the rates since the previous one and a point of
    /// the series.
    pub(crate) fn sample(&mut self, m: &JobMetrics, now_ns: u64) {
        self.absorb_checkpoints(&m.checkpoints);
        let counts: Vec<[u64; 5]> = m
            .tasks
            .iter()
            .map(|t| [t.busy_ns, t.backpressured_ns, t.idle_ns, t.records_in, t.records_out])
            .collect();
        let mut point = Point {
            t: now_ns.saturating_sub(self.started_ns) as f64 / 1e9,
            source_records_per_s: 0.0,
            sink_records_per_s: 0.0,
            latency_p50_us: 0.0,
            latency_p99_us: 0.0,
            visible_p99_us: 0.0,
        };
        if let Some((prev_ns, prev)) = &self.prev {
            let dt = now_ns.saturating_sub(*prev_ns) as f64;
            // A restart brings new tasks (counting from zero): no rates then.
            if dt > 0.0 && prev.len() == counts.len() {
                self.rates = counts
                    .iter()
                    .zip(prev)
                    .map(|(c, p)| {
                        let d = |k: usize| c[k].saturating_sub(p[k]) as f64;
                        TaskRates {
                            busy_ms_per_s: d(0) / dt * 1e3,
                            backpressured_ms_per_s: d(1) / dt * 1e3,
                            idle_ms_per_s: d(2) / dt * 1e3,
                            records_in_per_s: d(3) / dt * 1e9,
                            records_out_per_s: d(4) / dt * 1e9,
                        }
                    })
                    .collect();
                for (k, r) in self.rates.iter().enumerate() {
                    let chain = self.task_chain.get(k).copied().unwrap_or(usize::MAX);
                    let Some(info) = self.graph.chains.get(chain) else {
                        continue;
                    };
                    if info.input_rings == 0 {
                        point.source_records_per_s += r.records_in_per_s;
                    }
                    if self.graph.is_sink_chain(chain) {
                        point.sink_records_per_s += r.records_out_per_s;
                    }
                }
            }
        }
        if let Some((lp, vp)) = &self.prev_latency {
            point.latency_p50_us = delta_quantile(&m.latency_ns, lp, 0.5);
            point.latency_p99_us = delta_quantile(&m.latency_ns, lp, 0.99);
            point.visible_p99_us = delta_quantile(&m.visible_latency_ns, vp, 0.99);
        }
        self.prev_latency = Some((m.latency_ns.clone(), m.visible_latency_ns.clone()));
        self.prev = Some((now_ns, counts));
        if self.series.len() == SERIES_POINTS {
            self.series.pop_front();
        }
        self.series.push_back(point);
    }

    /// Adds the checkpoints completed since the last call to the histograms.
    pub(crate) fn absorb_checkpoints(&mut self, s: &CheckpointStats) {
        let new = s.completed.saturating_sub(self.absorbed);
        let available = (new as usize).min(s.history.len());
        for r in s.history.iter().skip(s.history.len() - available) {
            self.duration.observe(r.duration_us as f64 / 1e6);
            let align = r.tasks.iter().map(|t| t.alignment_us).max().unwrap_or(0);
            self.alignment.observe(align as f64 / 1e6);
            self.state_size.observe(r.state_bytes as f64);
            self.channel_size.observe(r.channel_state_bytes as f64);
        }
        self.absorbed = s.completed;
    }

    /// The Prometheus text exposition (format 0.0.4) of `m`.
    pub(crate) fn prometheus(&self, m: &JobMetrics, finished: bool, now_ns: u64) -> String {
        let mut out = String::with_capacity(16 * 1024);
        let job = escape(&self.graph.job);
        let o = &mut out;
        head(o, "weir_up", "gauge", "1 while the job runs, 0 once it has ended.");
        let _ = writeln!(o, "weir_up{{job=\"{job}\"}} {}", u8::from(!finished));
        head(o, "weir_uptime_seconds", "gauge", "Seconds since the endpoint started.");
        let uptime = now_ns.saturating_sub(self.started_ns) as f64 / 1e9;
        let _ = writeln!(o, "weir_uptime_seconds{{job=\"{job}\"}} {uptime}");
        task_counters(o, &job, m);
        self.task_rates(o, &job, m);
        self.channels(o, &job, m);
        checkpoint_counters(o, &job, m);
        self.checkpoint_histograms(o, &job);
        latency_histograms(o, &job, m);
        out
    }

    /// Each task's rates over the last sample period.
    fn task_rates(&self, o: &mut String, job: &str, m: &JobMetrics) {
        type RateField = (&'static str, &'static str, fn(&TaskRates) -> f64);
        let rate_fields: [RateField; 5] = [
            ("weir_task_busy_time_ms_per_second", "Busy milliseconds per second over the last sample period (Flink's busyTimeMsPerSecond).", |r| r.busy_ms_per_s),
            ("weir_task_backpressured_time_ms_per_second", "Backpressured milliseconds per second over the last sample period (Flink's backPressuredTimeMsPerSecond).", |r| r.backpressured_ms_per_s),
            ("weir_task_idle_time_ms_per_second", "Idle milliseconds per second over the last sample period (Flink's idleTimeMsPerSecond).", |r| r.idle_ms_per_s),
            ("weir_task_records_in_per_second", "Records in per second over the last sample period.", |r| r.records_in_per_s),
            ("weir_task_records_out_per_second", "Records out per second over the last sample period.", |r| r.records_out_per_s),
        ];
        for (name, help, get) in rate_fields {
            head(o, name, "gauge", help);
            for (t, r) in m.tasks.iter().zip(&self.rates) {
                let _ = writeln!(o, "{name}{{{}}} {}", task_labels(job, t), get(r));
            }
        }
    }

    /// Each input ring's queue, the rings' capacity, the sources' backlog.
    fn channels(&self, o: &mut String, job: &str, m: &JobMetrics) {
        head(
            o,
            "weir_channel_queued",
            "gauge",
            "Messages queued in one input ring (channel) of a task.",
        );
        for t in &m.tasks {
            for (i, q) in t.channel_queued.iter().enumerate() {
                let _ = writeln!(o, "weir_channel_queued{{{},input=\"{i}\"}} {q}", task_labels(job, t));
            }
        }
        head(
            o,
            "weir_channel_capacity",
            "gauge",
            "Slots of every input ring (channel).",
        );
        let _ = writeln!(o, "weir_channel_capacity{{job=\"{job}\"}} {}", self.graph.ring_capacity);
        head(o, "weir_source_backlog", "gauge", "What a source has left to read, where it knows (files: bytes; Kafka: records behind the partitions' end; in-memory sources: records).");
        for t in &m.tasks {
            if let Some(b) = t.backlog {
                let _ = writeln!(o, "weir_source_backlog{{{}}} {b}", task_labels(job, t));
            }
        }
    }

    /// The histograms of completed checkpoints.
    fn checkpoint_histograms(&self, o: &mut String, job: &str) {
        let histos = [
            (
                "weir_checkpoint_duration_seconds",
                "Checkpoint duration, trigger to durable manifest.",
                &self.duration,
            ),
            (
                "weir_checkpoint_alignment_seconds",
                "Longest barrier alignment of any task in a checkpoint.",
                &self.alignment,
            ),
            (
                "weir_checkpoint_state_bytes",
                "Operator state size of a checkpoint.",
                &self.state_size,
            ),
            (
                "weir_checkpoint_channel_state_bytes",
                "In-flight records stored by a checkpoint (unaligned mode).",
                &self.channel_size,
            ),
        ];
        for (name, help, b) in histos {
            head(o, name, "histogram", help);
            write_buckets(o, name, job, b);
        }
    }

    /// The JSON of `/api/job`: the graph, tasks, checkpoints and series.
    pub(crate) fn json(&self, m: &JobMetrics, finished: bool, now_ns: u64) -> Value {
        let c = &m.checkpoints;
        let restarts: Vec<Value> = c
            .restarts
            .iter()
            .map(|r| json!({"attempt": r.attempt, "error": r.error, "restored_from": r.restored_from}))
            .collect();
        let series: Vec<Value> = self
            .series
            .iter()
            .map(|p| {
                json!({"t": p.t, "source_records_per_s": p.source_records_per_s,
                       "sink_records_per_s": p.sink_records_per_s, "latency_p50_us": p.latency_p50_us,
                       "latency_p99_us": p.latency_p99_us, "visible_p99_us": p.visible_p99_us})
            })
            .collect();
        json!({
            "job": self.graph.job,
            "running": !finished,
            "uptime_s": now_ns.saturating_sub(self.started_ns) as f64 / 1e9,
            "graph": self.graph_json(),
            "tasks": self.tasks_json(m),
            "checkpoints": self.checkpoints_json(c),
            "restarts": restarts,
            "latency": {"processing": summary(&m.latency_ns), "visible": summary(&m.visible_latency_ns)},
            "series": series,
        })
    }

    /// The job graph: its chains and the edges between them.
    fn graph_json(&self) -> Value {
        let chains: Vec<Value> = self
            .graph
            .chains
            .iter()
            .enumerate()
            .map(|(i, c)| {
                json!({
                    "id": i,
                    "name": c.operators.join(" -> "),
                    "operators": c.operators,
                    "parallelism": c.parallelism,
                    "input_rings": c.input_rings,
                })
            })
            .collect();
        let edges: Vec<Value> = self
            .graph
            .edges
            .iter()
            .map(|&(from, to)| json!({"from": from, "to": to}))
            .collect();
        json!({"chains": chains, "edges": edges, "ring_capacity": self.graph.ring_capacity})
    }

    /// Each task's counters and rates.
    fn tasks_json(&self, m: &JobMetrics) -> Vec<Value> {
        m.tasks
            .iter()
            .enumerate()
            .map(|(k, t)| {
                let r = self.rates.get(k).copied().unwrap_or_default();
                json!({
                    "chain": self.task_chain.get(k),
                    "name": t.name,
                    "subtask": t.subtask,
                    "parallelism": t.parallelism,
                    "records_in": t.records_in,
                    "records_out": t.records_out,
                    "bytes_in": t.bytes_in,
                    "bytes_out": t.bytes_out,
                    "busy_ns": t.busy_ns,
                    "backpressured_ns": t.backpressured_ns,
                    "idle_ns": t.idle_ns,
                    "busy_ms_per_s": r.busy_ms_per_s,
                    "backpressured_ms_per_s": r.backpressured_ms_per_s,
                    "idle_ms_per_s": r.idle_ms_per_s,
                    "records_in_per_s": r.records_in_per_s,
                    "records_out_per_s": r.records_out_per_s,
                    "input_queued": t.input_queued,
                    "input_capacity": t.input_capacity,
                    "channel_queued": t.channel_queued,
                    "backlog": t.backlog,
                })
            })
            .collect()
    }

    /// The checkpoints' counts, and the latest completed and failed ones.
    fn checkpoints_json(&self, c: &CheckpointStats) -> Value {
        let skip = c.history.len().saturating_sub(API_CHECKPOINTS);
        let history: Vec<Value> = c
            .history
            .iter()
            .skip(skip)
            .map(|r| {
                json!({
                    "id": r.id,
                    "status": "completed",
                    "is_final": r.is_final,
                    "trigger_unix_ms": r.trigger_unix_ms,
                    "trigger_ms": r.trigger_ms,
                    "acked_us": r.acked_us,
                    "duration_us": r.duration_us,
                    "alignment_us": r.tasks.iter().map(|t| t.alignment_us).max().unwrap_or(0),
                    "state_bytes": r.state_bytes,
                    "channel_state_bytes": r.channel_state_bytes,
                    "tasks": r.tasks.iter().map(|t| json!({
                        "task": t.task, "subtask": t.subtask, "sync_us": t.sync_us, "async_us": t.async_us,
                        "alignment_us": t.alignment_us, "state_bytes": t.state_bytes,
                        "channel_state_bytes": t.channel_state_bytes,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let skip = c.failures.len().saturating_sub(API_CHECKPOINTS);
        let failures: Vec<Value> = c
            .failures
            .iter()
            .skip(skip)
            .map(|f| {
                json!({"id": f.id, "status": "failed", "trigger_unix_ms": f.trigger_unix_ms,
                       "duration_us": f.duration_us, "reason": f.reason})
            })
            .collect();
        json!({
            "mode": self.graph.checkpoint_mode,
            "completed": c.completed,
            "failed": c.failed,
            "subsumed": c.subsumed,
            "in_progress": c.in_progress,
            "latest_completed": c.latest_completed(),
            "restored_from": c.restored_from,
            "history": history,
            "failures": failures,
        })
    }
}

/// Each task's counters and input gauges.
fn task_counters(o: &mut String, job: &str, m: &JobMetrics) {
    type TaskField = (&'static str, &'static str, &'static str, fn(&crate::TaskMetrics) -> f64);
    let task_fields: [TaskField; 10] = [
        (
            "weir_task_records_in_total",
            "counter",
            "Records that entered the task (emitted, for a source).",
            |t| t.records_in as f64,
        ),
        (
            "weir_task_records_out_total",
            "counter",
            "Records that left the task (written, for a sink).",
            |t| t.records_out as f64,
        ),
        (
            "weir_task_bytes_in_total",
            "counter",
            "In-memory bytes of the records that entered the task: records times the size of their type (inline size, no heap data; nothing is serialized).",
            |t| t.bytes_in as f64,
        ),
        (
            "weir_task_bytes_out_total",
            "counter",
            "In-memory bytes of the records that left the task: records times the size of their type (inline size, no heap data; nothing is serialized).",
            |t| t.bytes_out as f64,
        ),
        (
            "weir_task_busy_seconds_total",
            "counter",
            "Time the task did work.",
            |t| t.busy_ns as f64 / 1e9,
        ),
        (
            "weir_task_backpressured_seconds_total",
            "counter",
            "Time the task waited for room in its output.",
            |t| t.backpressured_ns as f64 / 1e9,
        ),
        (
            "weir_task_idle_seconds_total",
            "counter",
            "Time the task had no input or waited for its worker.",
            |t| t.idle_ns as f64 / 1e9,
        ),
        (
            "weir_task_input_queued",
            "gauge",
            "Messages queued in the task's input rings.",
            |t| t.input_queued as f64,
        ),
        (
            "weir_task_input_capacity",
            "gauge",
            "Slots of the task's input rings.",
            |t| t.input_capacity as f64,
        ),
        (
            "weir_task_input_occupancy",
            "gauge",
            "Fraction of the task's input ring slots in use (near 1: the task is the bottleneck).",
            |t| t.input_occupancy(),
        ),
    ];
    for (name, kind, help, get) in task_fields {
        head(o, name, kind, help);
        for t in &m.tasks {
            let _ = writeln!(o, "{name}{{{}}} {}", task_labels(job, t), get(t));
        }
    }
}

/// The job's restarts and its checkpoints' counts.
fn checkpoint_counters(o: &mut String, job: &str, m: &JobMetrics) {
    let c = &m.checkpoints;
    let job_counters: [(&str, &str, &str, f64); 7] = [
        (
            "weir_job_restarts_total",
            "counter",
            "Restarts of the job after a task failure.",
            c.restarts.len() as f64,
        ),
        (
            "weir_checkpoints_completed_total",
            "counter",
            "Checkpoints completed.",
            c.completed as f64,
        ),
        (
            "weir_checkpoints_failed_total",
            "counter",
            "Checkpoints aborted (failed, declined or timed out).",
            c.failed as f64,
        ),
        (
            "weir_checkpoints_subsumed_total",
            "counter",
            "Checkpoints given up because a newer one completed first.",
            c.subsumed as f64,
        ),
        (
            "weir_checkpoints_in_progress",
            "gauge",
            "Checkpoints triggered and not yet completed or aborted.",
            c.in_progress as f64,
        ),
        (
            "weir_checkpoint_latest_completed_id",
            "gauge",
            "Id of the latest completed checkpoint (0: none).",
            c.latest_completed().unwrap_or(0) as f64,
        ),
        (
            "weir_corruptions_detected_total",
            "counter",
            "Bytes on disk that failed their check and that this process went on without (each logged at warn with file and offset); a start after a crash may count a torn last write of the WAL.",
            crate::storage::corruption::detected() as f64,
        ),
    ];
    for (name, kind, help, v) in job_counters {
        head(o, name, kind, help);
        let _ = writeln!(o, "{name}{{job=\"{job}\"}} {v}");
    }
}

/// The end-to-end latency histograms.
fn latency_histograms(o: &mut String, job: &str, m: &JobMetrics) {
    let latencies = [
        (
            "weir_processing_latency_seconds",
            "End-to-end latency, source emission to sink.",
            &m.latency_ns,
        ),
        (
            "weir_visibility_latency_seconds",
            "Latency until a record is visible in the sink's target (committed).",
            &m.visible_latency_ns,
        ),
    ];
    for (name, help, h) in latencies {
        head(o, name, "histogram", help);
        let mut b = Buckets::new(&LATENCY_BUCKETS);
        for (bound, count) in b.bounds.iter().zip(&mut b.counts) {
            *count = h.count_between(0, (bound * 1e9) as u64);
        }
        b.count = h.len();
        b.sum = h.mean() * h.len() as f64 / 1e9;
        write_buckets(o, name, job, &b);
    }
}

/// Percentiles of a latency histogram, µs.
fn summary(h: &Histogram<u64>) -> Value {
    let q = |p: f64| h.value_at_quantile(p) as f64 / 1e3;
    json!({"count": h.len(), "p50_us": q(0.5), "p90_us": q(0.9), "p99_us": q(0.99),
           "p999_us": q(0.999), "max_us": h.max() as f64 / 1e3})
}

/// A quantile (µs) of the values recorded between two readings of a
/// histogram that only grows; 0 if none.
fn delta_quantile(now: &Histogram<u64>, before: &Histogram<u64>, q: f64) -> f64 {
    if now.len() <= before.len() {
        return 0.0;
    }
    let mut d = now.clone();
    // Same bounds, and `before` is an earlier state of `now`: cannot fail.
    if d.subtract(before).is_err() {
        return 0.0;
    }
    d.value_at_quantile(q) as f64 / 1e3
}

/// Appends the endpoint's own CPU time (see [`super::cpu`]) for `job`.
pub(crate) fn endpoint_cpu(o: &mut String, job: &str, seconds: f64) {
    head(
        o,
        "weir_metrics_endpoint_cpu_seconds_total",
        "counter",
        "CPU time the metrics endpoint's own threads spent (sampling and serving).",
    );
    let _ = writeln!(
        o,
        "weir_metrics_endpoint_cpu_seconds_total{{job=\"{}\"}} {seconds}",
        escape(job)
    );
}

fn head(o: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(o, "# HELP {name} {help}");
    let _ = writeln!(o, "# TYPE {name} {kind}");
}

fn task_labels(job: &str, t: &crate::TaskMetrics) -> String {
    format!("job=\"{job}\",task=\"{}\",subtask=\"{}\"", escape(&t.name), t.subtask)
}

fn write_buckets(o: &mut String, name: &str, job: &str, b: &Buckets) {
    for (bound, count) in b.bounds.iter().zip(&b.counts) {
        let _ = writeln!(o, "{name}_bucket{{job=\"{job}\",le=\"{bound}\"}} {count}");
    }
    let _ = writeln!(o, "{name}_bucket{{job=\"{job}\",le=\"+Inf\"}} {}", b.count);
    let _ = writeln!(o, "{name}_sum{{job=\"{job}\"}} {}", b.sum);
    let _ = writeln!(o, "{name}_count{{job=\"{job}\"}} {}", b.count);
}

/// Escapes a label value (backslash, double quote, newline).
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative() {
        let mut b = Buckets::new(&TIME_BUCKETS);
        b.observe(0.003);
        b.observe(100.0);
        b.observe(1000.0);
        assert_eq!(b.counts[0], 0);
        assert_eq!(b.counts[2], 1); // le 0.005
        assert_eq!(*b.counts.last().unwrap(), 2); // le 300
        assert_eq!(b.count, 3);
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
