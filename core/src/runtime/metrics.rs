//! Live and final metrics of a job: records and bytes per task, ring occupancy
//! (backpressure), where each task spends its time (busy, idle,
//! backpressured), source backlog and end-to-end latency.
//!
//! Tasks count in plain local integers and publish them with one relaxed
//! store per scheduling turn; sinks record latency into a task-local
//! histogram. At most every [`LATENCY_PUBLISH_NS`] a sink hands that
//! histogram over whole, by swapping it with a cleared spare in its
//! mailbox (a pointer swap under `try_lock`, never a wait); whoever reads
//! the job's latency merges and clears what was handed over. The worker
//! never merges or clears a histogram's ~270 KB of counts in steady state
//! (tens of µs a histogram, a stall at p99.9:
//! docs/design/architecture.md#metrics).
//! Nothing here takes a lock or allocates per record.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_utils::CachePadded;
use hdrhistogram::Histogram;

/// How often (in nanoseconds) a sink hands its local latency histogram over
/// to the job's readers: often enough for live metrics (a reader sees
/// samples at most this old, plus the time since its previous read), rare
/// enough that the hand-over never shows up in a profile.
pub const LATENCY_PUBLISH_NS: u64 = 100_000_000;

pub(crate) use crate::latency::new_latency_histogram;
pub use crate::latency::LATENCY_MAX_NS;

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
    /// Dedup mode: bytes of the channel positions in the last snapshot.
    pub(crate) dedup_state_bytes: AtomicU64,
    /// Dedup mode: the upstream backup at the last snapshot, and its most.
    pub(crate) backup_bytes: AtomicU64,
    pub(crate) backup_records: AtomicU64,
    pub(crate) backup_peak_bytes: AtomicU64,
    pub(crate) backup_overflows: AtomicU64,
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
            dedup_state_bytes: AtomicU64::new(0),
            backup_bytes: AtomicU64::new(0),
            backup_records: AtomicU64::new(0),
            backup_peak_bytes: AtomicU64::new(0),
            backup_overflows: AtomicU64::new(0),
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
            dedup_state_bytes: self.dedup_state_bytes.load(Ordering::Relaxed),
            backup_bytes: self.backup_bytes.load(Ordering::Relaxed),
            backup_records: self.backup_records.load(Ordering::Relaxed),
            backup_peak_bytes: self.backup_peak_bytes.load(Ordering::Relaxed),
            backup_overflows: self.backup_overflows.load(Ordering::Relaxed),
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
    /// Dedup mode: bytes of the task's deduplication state in its last
    /// snapshot: two positions per input channel, whatever the number of
    /// records (0 in the other modes and for sources).
    pub dedup_state_bytes: u64,
    /// Dedup mode: bytes of records the task kept in its upstream backup
    /// (taken since its last completed checkpoint) at its last snapshot.
    pub backup_bytes: u64,
    /// Dedup mode: records in the upstream backup at the last snapshot.
    pub backup_records: u64,
    /// Dedup mode: the most bytes the upstream backup held at a snapshot.
    pub backup_peak_bytes: u64,
    /// Dedup mode: times the upstream backup outgrew
    /// `CheckpointConfig::dedup_backup_limit` and let go of what it held
    /// (until the task's next snapshot, a failure of the task restarts the
    /// whole job instead of the task alone).
    pub backup_overflows: u64,
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
    /// The workers' idle turns of [`crate::GAP_FLOOR_NS`] or more: time
    /// something else (mostly the machine, partly weir's other threads)
    /// kept them from their loops while they waited for input, published
    /// by each worker as it exits (empty while they run); see
    /// [`crate::WorkerDelays`].
    pub worker_delays: crate::WorkerDelays,
}

/// State shared between the tasks and the [`crate::JobHandle`].
#[derive(Debug)]
pub(crate) struct MetricsRegistry {
    pub(crate) tasks: Vec<Arc<TaskCounters>>,
    /// Shared by every attempt of a job: restarts do not lose latency samples.
    pub(crate) latency: Arc<LatencyHub>,
    /// Visibility latency, shared the same way.
    pub(crate) visible: Arc<LatencyHub>,
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
        let latency_ns = self.latency.read();
        let visible_latency_ns = self.visible.read();
        JobMetrics {
            tasks: self.tasks.iter().map(|t| t.snapshot()).collect(),
            latency_ns,
            visible_latency_ns,
            checkpoints: Default::default(),
            worker_delays: Default::default(),
        }
    }
}

/// The job-wide latency histograms, shared by all attempts.
#[derive(Debug, Clone, Default)]
pub(crate) struct LatencyPair {
    pub(crate) processing: Arc<LatencyHub>,
    pub(crate) visible: Arc<LatencyHub>,
}

/// Where one sink task's recorder hands its histogram over to readers.
///
/// Invariants: `full` holds samples no reader has merged yet; `spare` is a
/// cleared histogram waiting for the recorder's next hand-over. A recorder
/// and its mailbox own exactly two histograms between them (one of them
/// possibly in a reader's hands while it merges), so nothing is allocated
/// after the recorder is made.
#[derive(Debug)]
struct Mailbox {
    full: Option<Box<Histogram<u64>>>,
    spare: Option<Box<Histogram<u64>>>,
}

/// One of a job's latency histograms (processing or visibility): the merged
/// samples, and the mailboxes of the recorders that feed it.
#[derive(Debug)]
pub(crate) struct LatencyHub {
    merged: Mutex<Histogram<u64>>,
    mailboxes: Mutex<Vec<Arc<Mutex<Mailbox>>>>,
}

impl Default for LatencyHub {
    fn default() -> Self {
        LatencyHub {
            merged: Mutex::new(new_latency_histogram()),
            mailboxes: Mutex::new(Vec::new()),
        }
    }
}

impl LatencyHub {
    /// Every sample handed over or published so far. Merges what the
    /// recorders handed over (on the reader's thread, not a worker's).
    pub(crate) fn read(&self) -> Histogram<u64> {
        let mut mailboxes = self.mailboxes.lock().unwrap_or_else(|p| p.into_inner());
        for mailbox in mailboxes.iter() {
            let full = mailbox.lock().unwrap_or_else(|p| p.into_inner()).full.take();
            if let Some(mut h) = full {
                // Same bounds on both sides: add cannot fail.
                let _ = self.merged.lock().unwrap_or_else(|p| p.into_inner()).add(&*h);
                h.reset();
                mailbox.lock().unwrap_or_else(|p| p.into_inner()).spare = Some(h);
            }
        }
        // A recorder that is gone has published its last samples itself
        // (`LatencyRecorder::publish`); its mailbox is now empty.
        mailboxes.retain(|m| Arc::strong_count(m) > 1);
        drop(mailboxes);
        self.merged.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A sink task's local latency histogram and its publishing schedule.
#[derive(Debug)]
pub(crate) struct LatencyRecorder {
    local: Box<Histogram<u64>>,
    mailbox: Arc<Mutex<Mailbox>>,
    hub: Arc<LatencyHub>,
    last_publish_ns: u64,
    dirty: bool,
}

impl LatencyRecorder {
    /// A recorder feeding `hub`: allocates its two histograms (their counts
    /// are only touched when recorded or cleared) and registers its mailbox.
    pub(crate) fn new(hub: &Arc<LatencyHub>) -> Self {
        let mailbox = Arc::new(Mutex::new(Mailbox {
            full: None,
            spare: Some(Box::new(new_latency_histogram())),
        }));
        hub.mailboxes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(mailbox.clone());
        LatencyRecorder {
            local: Box::new(new_latency_histogram()),
            mailbox,
            hub: hub.clone(),
            last_publish_ns: 0,
            dirty: false,
        }
    }

    /// A recorder that feeds no job's histogram, registered nowhere, with
    /// the smallest histograms (what it would record is dropped): for a
    /// context that records nothing (a replacement's restore off its
    /// worker). Three histograms of the job's bounds took 6-10 ms to make
    /// on a worker here.
    pub(crate) fn detached() -> Self {
        let tiny = || Histogram::new_with_bounds(1, 2, 1).expect("static histogram bounds are valid");
        let hub = Arc::new(LatencyHub {
            merged: Mutex::new(tiny()),
            mailboxes: Mutex::new(Vec::new()),
        });
        LatencyRecorder {
            local: Box::new(tiny()),
            mailbox: Arc::new(Mutex::new(Mailbox {
                full: None,
                spare: Some(Box::new(tiny())),
            })),
            hub,
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

    /// Hands the local histogram over if the publish period has passed: a
    /// pointer swap with the mailbox's spare. Never waits: when a reader
    /// holds the mailbox, or still has the previous hand-over unmerged, the
    /// samples stay local and the hand-over is tried a period later.
    #[inline]
    pub(crate) fn maybe_publish(&mut self, now_ns: u64) {
        if !self.dirty || now_ns.saturating_sub(self.last_publish_ns) < LATENCY_PUBLISH_NS {
            return;
        }
        self.last_publish_ns = now_ns;
        let Ok(mut mailbox) = self.mailbox.try_lock() else {
            return;
        };
        if mailbox.full.is_some() {
            return;
        }
        if let Some(spare) = mailbox.spare.take() {
            mailbox.full = Some(std::mem::replace(&mut self.local, spare));
            self.dirty = false;
        }
    }

    /// Merges everything local into the job's histogram, on this thread:
    /// for a task that finishes or stops, not for steady state.
    pub(crate) fn publish(&mut self) {
        if !self.dirty {
            return;
        }
        // Same bounds on both sides: add cannot fail.
        let _ = self
            .hub
            .merged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .add(&*self.local);
        self.local.reset();
        self.dirty = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorder_publishes_everything_once() {
        let hub = Arc::new(LatencyHub::default());
        let mut r = LatencyRecorder::new(&hub);
        r.record_n(1_000, 5);
        r.record_n(u64::MAX, 1); // clamped, not lost
        r.maybe_publish(1); // too early: last publish at 0
        assert_eq!(hub.read().len(), 0);
        r.maybe_publish(LATENCY_PUBLISH_NS);
        assert_eq!(hub.read().len(), 6);
        r.publish(); // nothing new
        assert_eq!(hub.read().len(), 6);
        assert_eq!(hub.read().count_at(LATENCY_MAX_NS), 1, "clamped to the highest value");
    }

    /// While a reader has not merged the last hand-over, or holds the
    /// mailbox, the recorder keeps its samples and hands them over later:
    /// nothing is lost or counted twice, and no third histogram is made.
    #[test]
    fn a_hand_over_that_cannot_happen_keeps_the_samples_local() {
        let hub = Arc::new(LatencyHub::default());
        let mut r = LatencyRecorder::new(&hub);
        let period = LATENCY_PUBLISH_NS;
        r.record_n(10, 1);
        r.maybe_publish(period); // handed over, no reader yet
        r.record_n(20, 2);
        r.maybe_publish(2 * period); // the mailbox is still full
        assert!(r.dirty, "the second period's samples stayed local");
        {
            let held = r.mailbox.clone();
            let _guard = held.lock().unwrap(); // a reader holds the mailbox
            r.maybe_publish(3 * period); // must not wait
            assert!(r.dirty);
        }
        assert_eq!(hub.read().len(), 1, "only the first hand-over merged");
        r.record_n(30, 4);
        r.maybe_publish(4 * period);
        assert!(!r.dirty);
        assert_eq!(hub.read().len(), 7);
        {
            let m = r.mailbox.lock().unwrap();
            assert!(m.full.is_none() && m.spare.as_ref().is_some_and(|h| h.is_empty()));
        }
        r.record_n(40, 8);
        r.publish(); // the task ends: merged on its own thread
        let h = hub.read();
        assert_eq!(h.len(), 15);
        assert_eq!(
            (h.count_at(10), h.count_at(20), h.count_at(30), h.count_at(40)),
            (1, 2, 4, 8)
        );
    }

    /// A worker's hand-over never touches the merged histogram: it goes
    /// on while a reader holds that lock (with the old merge-on-publish
    /// it would wait here until the test gave up).
    #[test]
    fn a_hand_over_does_not_wait_for_the_merged_histogram() {
        let hub = Arc::new(LatencyHub::default());
        let mut r = LatencyRecorder::new(&hub);
        r.record_n(5, 3);
        let guard = hub.merged.lock().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let worker = std::thread::spawn(move || {
            r.maybe_publish(LATENCY_PUBLISH_NS);
            tx.send(()).unwrap();
            r
        });
        let handed_over = rx.recv_timeout(std::time::Duration::from_secs(10));
        drop(guard);
        let r = worker.join().unwrap();
        assert!(handed_over.is_ok(), "the hand-over waited for the merged histogram");
        assert_eq!(hub.read().len(), 3);
        drop(r);
        assert_eq!(hub.read().len(), 3);
        assert!(
            hub.mailboxes.lock().unwrap().is_empty(),
            "a dropped recorder's mailbox is pruned"
        );
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
