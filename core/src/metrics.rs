//! Live and final metrics of a job: records and bytes per task, ring occupancy
//! (backpressure), where each task spends its time (busy, idle,
//! backpressured), source backlog and end-to-end latency.
//!
//! Tasks count in plain local integers and publish them with one relaxed
//! store per scheduling turn; sinks record latency into a task-local
//! histogram and merge it into the job's histogram at most every
//! [`LATENCY_PUBLISH_NS`] and when they finish. Nothing here takes a lock or
//! allocates per record.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_utils::CachePadded;
use hdrhistogram::Histogram;

/// How often (in nanoseconds) a sink merges its local latency histogram into
/// the job's shared one: often enough for live metrics, rare enough that
/// the lock never shows up in a profile.
pub const LATENCY_PUBLISH_NS: u64 = 100_000_000;

/// Highest latency the histograms distinguish (one hour, in nanoseconds);
/// larger values are recorded as this value.
pub const LATENCY_MAX_NS: u64 = 3_600_000_000_000;

pub(crate) fn new_latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_MAX_NS, 3).expect("static histogram bounds are valid")
}

/// Counters one task publishes; read by [`crate::JobHandle::metrics`].
#[derive(Debug)]
pub(crate) struct TaskCounters {
    pub(crate) name: String,
    pub(crate) subtask: usize,
    pub(crate) parallelism: usize,
    pub(crate) records_in: CachePadded<AtomicU64>,
    pub(crate) records_out: CachePadded<AtomicU64>,
    /// In-memory bytes of the records counted in `records_in` (see
    /// [`TaskMetrics::bytes_in`]).
    pub(crate) bytes_in: AtomicU64,
    /// In-memory bytes of the records counted in `records_out`.
    pub(crate) bytes_out: AtomicU64,
    /// Messages waiting in this task's input rings when it last looked.
    pub(crate) input_queued: AtomicU64,
    /// Total slots of this task's input rings (0 for a source).
    pub(crate) input_capacity: u64,
    /// Messages waiting in each input ring when the task last looked, in
    /// input order (empty for a source).
    pub(crate) channel_queued: Box<[AtomicU64]>,
    /// Time the task's turns did work, ns.
    pub(crate) busy_ns: AtomicU64,
    /// Time the task could not go on because its output was full, ns.
    pub(crate) backpressured_ns: AtomicU64,
    /// The rest of the task's time (no input, or waiting its turn), ns.
    pub(crate) idle_ns: AtomicU64,
    /// What a source has left to read ([`NO_BACKLOG`]: it does not know).
    pub(crate) backlog: AtomicU64,
}

/// The value of [`TaskCounters::backlog`] when the source does not know it.
pub(crate) const NO_BACKLOG: u64 = u64::MAX;

impl TaskCounters {
    pub(crate) fn new(name: String, subtask: usize, parallelism: usize, inputs: usize, ring_capacity: u64) -> Self {
        TaskCounters {
            name,
            subtask,
            parallelism,
            records_in: CachePadded::new(AtomicU64::new(0)),
            records_out: CachePadded::new(AtomicU64::new(0)),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            input_queued: AtomicU64::new(0),
            input_capacity: inputs as u64 * ring_capacity,
            channel_queued: (0..inputs).map(|_| AtomicU64::new(0)).collect(),
            busy_ns: AtomicU64::new(0),
            backpressured_ns: AtomicU64::new(0),
            idle_ns: AtomicU64::new(0),
            backlog: AtomicU64::new(NO_BACKLOG),
        }
    }

    fn snapshot(&self) -> TaskMetrics {
        TaskMetrics {
            name: self.name.clone(),
            subtask: self.subtask,
            parallelism: self.parallelism,
            records_in: self.records_in.load(Ordering::Relaxed),
            records_out: self.records_out.load(Ordering::Relaxed),
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
            input_queued: self.input_queued.load(Ordering::Relaxed),
            input_capacity: self.input_capacity,
            channel_queued: self.channel_queued.iter().map(|q| q.load(Ordering::Relaxed)).collect(),
            busy_ns: self.busy_ns.load(Ordering::Relaxed),
            backpressured_ns: self.backpressured_ns.load(Ordering::Relaxed),
            idle_ns: self.idle_ns.load(Ordering::Relaxed),
            backlog: Some(self.backlog.load(Ordering::Relaxed)).filter(|&b| b != NO_BACKLOG),
        }
    }
}

/// A point-in-time view of one task (one parallel instance of a chain).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskMetrics {
    /// The chain's operators, joined by ` -> `.
    pub name: String,
    /// Index of this parallel instance.
    pub subtask: usize,
    /// Parallelism of the chain.
    pub parallelism: usize,
    /// Records that entered the task (emitted, for a source).
    pub records_in: u64,
    /// Records that left the task (written, for a sink).
    pub records_out: u64,
    /// In-memory size of the records counted in `records_in`: each record
    /// counts `size_of` its type (for a source, the type it emits; else
    /// the element type of the task's input rings). Records move between
    /// tasks as typed values, never serialized, so this is the inline size
    /// of what went through the rings: padding included, heap data a record
    /// points to (a `String`'s text, a `Vec`'s elements) not. Flink's
    /// `numBytesIn` counts serialized bytes instead; weir has none.
    pub bytes_in: u64,
    /// In-memory size of the records counted in `records_out`, as for
    /// `bytes_in`: the element type of the task's output rings, or the
    /// record type its sink writes.
    pub bytes_out: u64,
    /// Messages queued in the task's input rings when last observed.
    pub input_queued: u64,
    /// Total capacity of the task's input rings (0 for a source).
    pub input_capacity: u64,
    /// Messages queued in each input ring (one ring per upstream subtask,
    /// in input order) when last observed; each ring holds
    /// `input_capacity / channel_queued.len()` messages.
    pub channel_queued: Vec<u64>,
    /// Time the task spent doing work, ns (Flink's busy time).
    pub busy_ns: u64,
    /// Time the task could not go on because its output rings (or its
    /// sink's target) were full, ns (Flink's backpressured time).
    pub backpressured_ns: u64,
    /// Time the task had nothing to do or waited for its worker, ns.
    /// `busy_ns + backpressured_ns + idle_ns` is the task's running time.
    pub idle_ns: u64,
    /// For a source that knows it ([`crate::Source::backlog`]): what it has
    /// left to read, in the unit the source documents (bytes of a file,
    /// records behind a partition's end).
    pub backlog: Option<u64>,
}

impl TaskMetrics {
    /// Fraction of input ring slots in use, 0.0 to 1.0: near 1.0 means this
    /// task is the bottleneck (its producers are backpressured).
    pub fn input_occupancy(&self) -> f64 {
        if self.input_capacity == 0 {
            0.0
        } else {
            self.input_queued as f64 / self.input_capacity as f64
        }
    }
}

/// A point-in-time view of a job.
#[derive(Debug, Clone)]
pub struct JobMetrics {
    /// One entry per task of the current attempt, in graph order.
    pub tasks: Vec<TaskMetrics>,
    /// End-to-end (processing) latency in nanoseconds, from emission at the
    /// source to the sink, as recorded by sinks through
    /// [`crate::SinkContext::record_latency`].
    pub latency_ns: Histogram<u64>,
    /// Visibility latency in nanoseconds, from emission to the moment a
    /// reader of the sink's target can see the record (committed), as
    /// recorded by sinks through [`crate::SinkContext::record_visible_latency`].
    pub visible_latency_ns: Histogram<u64>,
    /// Checkpoints completed and failed, their history, and restarts.
    pub checkpoints: crate::checkpoint::CheckpointStats,
}

/// State shared between the tasks and the [`crate::JobHandle`].
#[derive(Debug)]
pub(crate) struct MetricsRegistry {
    pub(crate) tasks: Vec<Arc<TaskCounters>>,
    /// Shared by every attempt of a job: restarts do not lose latency samples.
    pub(crate) latency: Arc<Mutex<Histogram<u64>>>,
    /// Visibility latency, shared the same way.
    pub(crate) visible: Arc<Mutex<Histogram<u64>>>,
}

impl MetricsRegistry {
    pub(crate) fn new(tasks: Vec<Arc<TaskCounters>>) -> Self {
        Self::with_latency(tasks, LatencyPair::default())
    }

    pub(crate) fn with_latency(tasks: Vec<Arc<TaskCounters>>, latency: LatencyPair) -> Self {
        MetricsRegistry {
            tasks,
            latency: latency.processing,
            visible: latency.visible,
        }
    }

    /// Records emitted by the source tasks (those without input rings).
    pub(crate) fn records_emitted(&self) -> u64 {
        self.tasks
            .iter()
            .filter(|t| t.input_capacity == 0)
            .map(|t| t.records_in.load(Ordering::Relaxed))
            .sum()
    }

    pub(crate) fn snapshot(&self) -> JobMetrics {
        let latency_ns = self.latency.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let visible_latency_ns = self.visible.lock().unwrap_or_else(|p| p.into_inner()).clone();
        JobMetrics {
            tasks: self.tasks.iter().map(|t| t.snapshot()).collect(),
            latency_ns,
            visible_latency_ns,
            checkpoints: Default::default(),
        }
    }
}

/// The job-wide latency histograms, shared by all attempts.
#[derive(Debug, Clone)]
pub(crate) struct LatencyPair {
    pub(crate) processing: Arc<Mutex<Histogram<u64>>>,
    pub(crate) visible: Arc<Mutex<Histogram<u64>>>,
}

impl Default for LatencyPair {
    fn default() -> Self {
        LatencyPair {
            processing: Arc::new(Mutex::new(new_latency_histogram())),
            visible: Arc::new(Mutex::new(new_latency_histogram())),
        }
    }
}

/// A sink task's local latency histogram and its publishing schedule.
#[derive(Debug)]
pub(crate) struct LatencyRecorder {
    local: Histogram<u64>,
    last_publish_ns: u64,
    dirty: bool,
}

impl LatencyRecorder {
    pub(crate) fn new() -> Self {
        LatencyRecorder {
            local: new_latency_histogram(),
            last_publish_ns: 0,
            dirty: false,
        }
    }

    #[inline]
    pub(crate) fn record_n(&mut self, latency_ns: u64, count: u64) {
        let v = latency_ns.clamp(1, LATENCY_MAX_NS);
        // Cannot fail: the value is clamped into the histogram's bounds.
        let _ = self.local.record_n(v, count);
        self.dirty = true;
    }

    /// Merges into the shared histogram if the publish period has passed.
    #[inline]
    pub(crate) fn maybe_publish(&mut self, now_ns: u64, shared: &Mutex<Histogram<u64>>) {
        if self.dirty && now_ns.saturating_sub(self.last_publish_ns) >= LATENCY_PUBLISH_NS {
            self.last_publish_ns = now_ns;
            self.publish(shared);
        }
    }

    pub(crate) fn publish(&mut self, shared: &Mutex<Histogram<u64>>) {
        if !self.dirty {
            return;
        }
        let mut h = shared.lock().unwrap_or_else(|p| p.into_inner());
        // Same bounds on both sides: add cannot fail.
        let _ = h.add(&self.local);
        self.local.reset();
        self.dirty = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorder_publishes_everything_once() {
        let shared = Mutex::new(new_latency_histogram());
        let mut r = LatencyRecorder::new();
        r.record_n(1_000, 5);
        r.record_n(u64::MAX, 1); // clamped, not lost
        r.maybe_publish(1, &shared); // too early: last publish at 0
        assert_eq!(shared.lock().unwrap().len(), 0);
        r.maybe_publish(LATENCY_PUBLISH_NS, &shared);
        assert_eq!(shared.lock().unwrap().len(), 6);
        r.publish(&shared); // nothing new
        assert_eq!(shared.lock().unwrap().len(), 6);
    }

    /// Bytes are counted per batch as records times the size of the record
    /// type at each end of a task: the source's type in, the ring's or the
    /// sink's type out; a `String` counts its inline 24 bytes, not its text.
    #[test]
    fn bytes_are_records_times_the_size_of_their_type() {
        use std::mem::size_of;
        use std::sync::{Arc, Mutex};
        type Wide = (u64, [u8; 24]);
        assert_eq!((size_of::<u64>(), size_of::<Wide>(), size_of::<String>()), (8, 32, 24));
        const N: u64 = 5_000;
        let items: Arc<Vec<u64>> = Arc::new((0..N).collect());
        let out = Arc::new(Mutex::new(Vec::new()));
        let sink_out = out.clone();
        let p = crate::Pipeline::new("bytes");
        // Two chains: [nums -> map] (u64 in, Wide out to the key_by ring)
        // and [process -> filter -> collect] (Wide in, String written), two
        // subtasks each.
        p.source("nums", 2, move |i, n| crate::VecSource::new(items.clone(), i, n))
            .map(|v: u64| (v, [v as u8; 24]))
            .key_by(|r: &Wide| r.0 % 7)
            .process_heap(|_k: &u64, seen: &mut u64, r: Wide, out| {
                *seen += 1;
                out.emit(format!("{}-{}", r.0, r.1[23]));
            })
            .filter(|s: &String| s.len().is_multiple_of(2))
            .sink("collect", move |_| crate::CollectSink::new(sink_out.clone()));
        let config = crate::RuntimeConfig {
            batch_size: 64, // many batches, some partial
            ..crate::RuntimeConfig::default()
        };
        let tasks = p.run(config).unwrap().join().unwrap().metrics.tasks;
        let written = out.lock().unwrap().len() as u64;
        assert!(written > 0 && written < N, "the filter keeps some: {written}");
        let (sources, rest): (Vec<_>, Vec<_>) = tasks.iter().partition(|t| t.name.starts_with("nums"));
        assert_eq!(sources.len(), 2);
        assert_eq!(sources.iter().map(|t| t.records_in).sum::<u64>(), N);
        for t in &sources {
            assert!(t.records_in > 0, "{}", t.name);
            assert_eq!(t.records_out, t.records_in, "{}", t.name);
            assert_eq!(t.bytes_in, t.records_in * 8, "{}: u64 emitted", t.name);
            assert_eq!(t.bytes_out, t.records_out * 32, "{}: Wide into the ring", t.name);
        }
        assert_eq!(rest.len(), 2, "two keyed subtasks with their sinks");
        assert_eq!(rest.iter().map(|t| t.records_in).sum::<u64>(), N);
        assert_eq!(rest.iter().map(|t| t.records_out).sum::<u64>(), written);
        for t in &rest {
            assert_eq!(t.bytes_in, t.records_in * 32, "{}: Wide out of the ring", t.name);
            assert_eq!(
                t.bytes_out,
                t.records_out * 24,
                "{}: Strings written, inline size only",
                t.name
            );
        }
    }

    #[test]
    fn occupancy_of_source_is_zero() {
        let c = TaskCounters::new("src".into(), 0, 1, 0, 2048);
        assert_eq!(c.snapshot().input_occupancy(), 0.0);
    }
}
