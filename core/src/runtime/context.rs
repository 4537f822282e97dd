//! What a running task knows about itself, and the views of it that user
//! sources and sinks get.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::checkpoint::signals::TaskCheckpointing;
use crate::clock;
use crate::runtime::metrics::{LatencyRecorder, MetricsRegistry, TaskCounters};
use crate::threads::idle::{Parker, Waker};

/// Per-task runtime state threaded through every call of a chain.
///
/// Owned by exactly one worker thread; never shared.
pub(crate) struct TaskContext {
    pub(crate) subtask: usize,
    pub(crate) parallelism: usize,
    /// Names of the operators fused in this task, in chain order.
    pub(crate) ops: Arc<[String]>,
    /// Index into `ops` of the operator currently running user code; names
    /// the culprit when something fails.
    pub(crate) current_op: usize,
    pub(crate) records_in: u64,
    pub(crate) records_out: u64,
    /// In-memory bytes of the records in `records_in` and `records_out`:
    /// `size_of` the record type each, added with the count
    /// ([`TaskContext::count_in`], [`TaskContext::count_out`]).
    pub(crate) bytes_in: u64,
    pub(crate) bytes_out: u64,
    /// Clock reading of the current turn, taken lazily at most once per turn.
    pub(crate) turn_now_ns: Option<u64>,
    pub(crate) latency: LatencyRecorder,
    pub(crate) visible: LatencyRecorder,
    /// Told of every visibility the sink records ([`SinkContext::tap_visible`]).
    pub(crate) visible_tap: Option<VisibleTap>,
    pub(crate) counters: Arc<TaskCounters>,
    pub(crate) registry: Arc<MetricsRegistry>,
    /// Checkpointing, when on.
    pub(crate) ckpt: Option<TaskCheckpointing>,
    /// Latest completed checkpoint passed to the chain.
    pub(crate) notified: u64,
    /// Abort notices already passed to the chain.
    pub(crate) abort_seq_seen: u64,
    pub(crate) abort_id_seen: u64,
    /// Latest checkpoint this task has snapshotted (or restored from).
    pub(crate) last_barrier: u64,
    /// The parker of the worker that runs this task (none outside a job).
    pub(crate) parker: Option<Arc<Parker>>,
    /// Set by the task when its turn ended on full output (backpressure);
    /// cleared by the worker before each turn.
    pub(crate) output_blocked: bool,
    /// Dedup mode: a recovered task is being fed its predecessor's backup
    /// again (set by the input task while it replays).
    pub(crate) replaying_backup: bool,
    /// Set with a task's error when recovering the task alone cannot be
    /// exact (a replacement that did not emit again what its predecessor
    /// had): the whole job restarts instead.
    pub(crate) restart_whole_job: bool,
    /// Where the task's time went, ns: accounted by the worker per turn
    /// (see `job::TurnClock`), published with the counters.
    pub(crate) busy_ns: u64,
    pub(crate) backpressured_ns: u64,
    pub(crate) idle_ns: u64,
}

#[cfg(test)]
impl TaskContext {
    /// A context for unit tests: subtask 0 of 1, one operator named `op`,
    /// its counters sized for `inputs` input rings of `input_capacity`
    /// slots in all, registered alone.
    pub(crate) fn for_test(op: &str, inputs: usize, input_capacity: u64) -> (TaskContext, Arc<TaskCounters>) {
        let counters = Arc::new(TaskCounters::new("test".into(), 0, 1, inputs, input_capacity));
        let registry = Arc::new(MetricsRegistry::new(vec![counters.clone()]));
        let ctx = TaskContext::new(0, 1, vec![op.to_string()].into(), counters.clone(), registry);
        (ctx, counters)
    }
}

impl TaskContext {
    pub(crate) fn new(
        subtask: usize,
        parallelism: usize,
        ops: Arc<[String]>,
        counters: Arc<TaskCounters>,
        registry: Arc<MetricsRegistry>,
    ) -> Self {
        let (latency, visible) = (
            LatencyRecorder::new(&registry.latency),
            LatencyRecorder::new(&registry.visible),
        );
        Self::with_recorders(subtask, parallelism, ops, counters, registry, latency, visible)
    }

    fn with_recorders(
        subtask: usize,
        parallelism: usize,
        ops: Arc<[String]>,
        counters: Arc<TaskCounters>,
        registry: Arc<MetricsRegistry>,
        latency: LatencyRecorder,
        visible: LatencyRecorder,
    ) -> Self {
        TaskContext {
            subtask,
            parallelism,
            ops,
            current_op: 0,
            records_in: 0,
            records_out: 0,
            bytes_in: 0,
            bytes_out: 0,
            turn_now_ns: None,
            latency,
            visible,
            visible_tap: None,
            counters,
            registry,
            ckpt: None,
            notified: 0,
            abort_seq_seen: 0,
            abort_id_seen: 0,
            last_barrier: 0,
            parker: None,
            output_blocked: false,
            replaying_backup: false,
            restart_whole_job: false,
            busy_ns: 0,
            backpressured_ns: 0,
            idle_ns: 0,
        }
    }

    /// A context of the same subtask for restoring its replacement off its
    /// worker (dedup recovery): the same names, counters, checkpointing and
    /// parker, its latency recorders detached
    /// ([`LatencyRecorder::detached`]: registered ones allocate histograms
    /// of the job's bounds, which took 6-10 ms on the failed task's worker,
    /// and stay in the job's hub).
    pub(crate) fn for_restore(&self) -> TaskContext {
        let mut ctx = TaskContext::with_recorders(
            self.subtask,
            self.parallelism,
            self.ops.clone(),
            self.counters.clone(),
            self.registry.clone(),
            LatencyRecorder::detached(),
            LatencyRecorder::detached(),
        );
        ctx.ckpt = self.ckpt.clone();
        ctx.parker = self.parker.clone();
        ctx
    }

    /// The clock, read at most once per scheduling turn.
    #[inline]
    pub(crate) fn now_ns(&mut self) -> u64 {
        *self.turn_now_ns.get_or_insert_with(clock::now_ns)
    }

    /// Counts `n` records of type `T` into the task (emitted, for a
    /// source): once per batch, never per record.
    #[inline]
    pub(crate) fn count_in<T>(&mut self, n: usize) {
        self.records_in += n as u64;
        self.bytes_in += (n * std::mem::size_of::<T>()) as u64;
    }

    /// Counts `n` records of type `T` out of the task (into its output
    /// rings, or written by its sink): once per batch.
    #[inline]
    pub(crate) fn count_out<T>(&mut self, n: usize) {
        self.records_out += n as u64;
        self.bytes_out += (n * std::mem::size_of::<T>()) as u64;
    }

    /// Called by the worker at the end of every turn: publish counters.
    #[inline]
    pub(crate) fn end_turn(&mut self) {
        self.counters.records_in.store(self.records_in, Ordering::Relaxed);
        self.counters.records_out.store(self.records_out, Ordering::Relaxed);
        self.counters.bytes_in.store(self.bytes_in, Ordering::Relaxed);
        self.counters.bytes_out.store(self.bytes_out, Ordering::Relaxed);
        self.counters.busy_ns.store(self.busy_ns, Ordering::Relaxed);
        self.counters
            .backpressured_ns
            .store(self.backpressured_ns, Ordering::Relaxed);
        self.counters.idle_ns.store(self.idle_ns, Ordering::Relaxed);
        if let Some(now) = self.turn_now_ns.take() {
            self.latency.maybe_publish(now);
            self.visible.maybe_publish(now);
        }
    }

    pub(crate) fn publish_latency(&mut self) {
        self.latency.publish();
        self.visible.publish();
    }

    pub(crate) fn operator_name(&self) -> &str {
        self.ops.get(self.current_op).map_or("?", String::as_str)
    }
}

/// What a [`crate::Source`] may ask of the runtime while it emits.
pub struct SourceContext<'a> {
    pub(crate) task: &'a mut TaskContext,
    /// A watermark (or [`crate::watermark::IDLE`]) to send after this poll's records.
    pub(crate) watermark: Option<i64>,
}

impl<'a> SourceContext<'a> {
    /// Index of this parallel source instance, `0..parallelism`.
    pub fn subtask(&self) -> usize {
        self.task.subtask
    }

    /// Number of parallel instances of this source.
    pub fn parallelism(&self) -> usize {
        self.task.parallelism
    }

    /// The current time on [`crate::clock`], read at most once per scheduling
    /// turn: stamp a whole batch with one reading.
    #[inline]
    pub fn now_ns(&mut self) -> u64 {
        self.task.now_ns()
    }

    /// Event time from the source itself: no record with a timestamp at or
    /// below `wm` (epoch milliseconds) will follow from this subtask. Sent
    /// downstream after the records of this poll; only the last call of a
    /// poll counts. For a source that knows more than a
    /// [`crate::operators::time::WatermarkStrategy`] placed after it can (one watermark
    /// per input partition, say); a strategy placed after the source
    /// replaces these watermarks with its own. Watermarks must not go back:
    /// a smaller one than before is ignored downstream.
    #[inline]
    pub fn emit_watermark(&mut self, wm: i64) {
        self.watermark = Some(wm.clamp(crate::watermark::MIN_WATERMARK, crate::watermark::MAX_WATERMARK - 1));
    }

    /// This subtask emits nothing for now: downstream tasks compute their
    /// watermark without it until its next [`SourceContext::emit_watermark`],
    /// which makes it active again. A source with nothing to read (no input
    /// partition) says so once, so that it never holds event time back.
    #[inline]
    pub fn mark_idle(&mut self) {
        self.watermark = Some(crate::watermark::IDLE);
    }

    pub(crate) fn new(task: &'a mut TaskContext) -> Self {
        SourceContext { task, watermark: None }
    }
}

/// Told of records becoming visible: `(subtask, now_ns, emitted_ns,
/// count)`; see [`SinkContext::tap_visible`].
pub type VisibleTap = Arc<dyn Fn(usize, u64, u64, u64) + Send + Sync>;

/// What a [`crate::Sink`] may ask of the runtime while it writes.
pub struct SinkContext<'a> {
    pub(crate) task: &'a mut TaskContext,
}

impl SinkContext<'_> {
    /// Index of this parallel sink instance, `0..parallelism`.
    pub fn subtask(&self) -> usize {
        self.task.subtask
    }

    /// Number of parallel instances of this sink.
    pub fn parallelism(&self) -> usize {
        self.task.parallelism
    }

    /// The current time on [`crate::clock`], read at most once per scheduling
    /// turn.
    #[inline]
    pub fn now_ns(&mut self) -> u64 {
        self.task.now_ns()
    }

    /// Wakes this sink's worker when it parked: give it to the sink's own
    /// threads ([`crate::threads::io_thread::IoThread::set_waker`]) so that the
    /// worker calls [`crate::Sink::ready`] again as soon as they free room.
    pub fn waker(&self) -> Waker {
        Waker::new(self.task.parker.clone())
    }

    /// Records the end-to-end latency of one record emitted at `emitted_ns`
    /// (a [`crate::clock::now_ns`] reading taken by the source).
    #[inline]
    pub fn record_latency(&mut self, emitted_ns: u64) {
        self.record_latency_n(emitted_ns, 1);
    }

    /// Records `count` records emitted at the same instant: sources stamp
    /// whole batches with one clock reading, so runs of equal stamps are
    /// common and cost one histogram update.
    #[inline]
    pub fn record_latency_n(&mut self, emitted_ns: u64, count: u64) {
        let now = self.task.now_ns();
        self.task.latency.record_n(now.saturating_sub(emitted_ns), count);
    }

    /// Records that a record emitted at `emitted_ns` became visible to
    /// readers of the sink's target now (for a transactional sink: when its
    /// transaction committed). This is the latency users of exactly-once
    /// output experience.
    #[inline]
    pub fn record_visible_latency(&mut self, emitted_ns: u64) {
        self.record_visible_latency_n(emitted_ns, 1);
    }

    /// [`SinkContext::record_visible_latency`] for `count` records with the
    /// same emission time.
    #[inline]
    pub fn record_visible_latency_n(&mut self, emitted_ns: u64, count: u64) {
        let now = self.task.now_ns();
        self.task.visible.record_n(now.saturating_sub(emitted_ns), count);
        if let Some(tap) = &self.task.visible_tap {
            tap(self.task.subtask, now, emitted_ns, count);
        }
    }

    /// Has `tap` told of every visibility this task's sink records from now
    /// on ([`SinkContext::record_visible_latency_n`]), as `tap(subtask,
    /// now_ns, emitted_ns, count)`; `None` removes it. For a timeline of
    /// when output became visible (a dashboard, `weir bench
    /// --fail-at-record`'s figures through a failure), beside the
    /// histogram the job's metrics keep. It runs on the worker, once per
    /// run of records with one stamp: it must be quick and must not block.
    /// A task rebuilt after a failure starts without one; set it again in
    /// [`crate::Sink::open`] or at the first write.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use std::sync::Arc;
    /// use weir_core::harness::Harness;
    /// use weir_core::{BoxError, Sink, SinkContext};
    ///
    /// /// Makes every record visible at once, and counts them in a tap.
    /// struct Visible(Arc<AtomicU64>);
    /// impl Sink<u64> for Visible {
    ///     fn write(&mut self, batch: &mut Vec<u64>, ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
    ///         let seen = self.0.clone();
    ///         ctx.tap_visible(Some(Arc::new(move |_subtask, _now, _emitted, n| {
    ///             seen.fetch_add(n, Ordering::Relaxed);
    ///         })));
    ///         for &stamp in batch.iter() {
    ///             ctx.record_visible_latency(stamp);
    ///         }
    ///         batch.clear();
    ///         Ok(())
    ///     }
    /// }
    ///
    /// let seen = Arc::new(AtomicU64::new(0));
    /// let mut h = Harness::new(0, 1);
    /// h.write_sink(&mut Visible(seen.clone()), &mut vec![1, 2, 3]).unwrap();
    /// assert_eq!(seen.load(Ordering::Relaxed), 3);
    /// ```
    pub fn tap_visible(&mut self, tap: Option<VisibleTap>) {
        self.task.visible_tap = tap;
    }
}
