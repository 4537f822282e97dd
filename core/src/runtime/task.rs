//! Tasks: the unit a worker schedules. A task is one parallel instance of
//! a chain of fused operators, driven either by a source or by its input
//! rings.
//!
//! A task never blocks. One call of [`Task::poll`] does at most one batch
//! budget of work and returns; when its output is backpressured or its
//! input is empty it returns [`TaskPoll::Idle`] and the worker runs other
//! tasks or backs off. That is what lets several tasks share one worker
//! without deadlock, even when producer and consumer share it.
//!
//! With checkpointing on, a task also handles barriers (see
//! [`crate::checkpoint`] for the modes): a source task injects them when the
//! coordinator triggers a checkpoint; an input task aligns them, or lets
//! them overtake queued input (unaligned), recording the overtaken records
//! as channel state. A bounded job's tasks wait, after the final barrier,
//! for the final checkpoint to complete (sinks commit) before they forward
//! end-of-stream and finish.

use rtrb::Consumer;

use crate::checkpoint::channel::{decode_channel, ChannelRecorder, Replayed};
use crate::checkpoint::signals::Event;
use crate::checkpoint::snapshot::{complete, TaskSnapshot};
use crate::checkpoint::CheckpointMode;
use crate::clock;
use crate::data::Data;
use crate::error::BoxError;
use crate::runtime::collector::{Collector, Notice, RestoreCtx};
use crate::runtime::context::{SourceContext, TaskContext};
use crate::runtime::input_watermarks::{InputWatermarks, WatermarkUpdate};
use crate::runtime::message::{Barrier, Message};
use crate::runtime::source::{Source, SourcePoll};
use crate::watermark::{IDLE, MAX_WATERMARK, MIN_WATERMARK};

/// Records an unaligned task handles per turn while it waits for a
/// triggered checkpoint's barrier: bounds how long a slow chain delays
/// look-ahead (64 records at 20 µs each: about 1 ms).
const UNALIGNED_PROBE_BUDGET: usize = 64;

/// Records handed to the chain at a time by an input task; between slices
/// it checks the turn's time.
const SLICE: usize = 256;

/// Time after which an input task ends its turn early (200 µs): bounds how
/// long one task with a slow chain keeps the other tasks of its worker
/// (a source about to inject a barrier, say) waiting.
const TURN_QUANTUM_NS: u64 = 200_000;

/// What one scheduling turn of a task achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TaskPoll {
    /// Did some work; poll again soon.
    Progress,
    /// Could not do anything (no input, or output backpressured).
    Idle,
    /// Finished: end-of-stream was handed on; never poll again.
    Done,
}

pub(crate) trait Task: Send {
    fn poll(&mut self, ctx: &mut TaskContext) -> Result<TaskPoll, BoxError>;
    /// False for a task driven by a source that cannot seek back.
    fn replayable(&self) -> bool {
        true
    }
    /// Loads the task's state from a checkpoint before its first poll.
    fn restore(&mut self, r: &RestoreCtx<'_>, ctx: &mut TaskContext) -> Result<(), BoxError>;
    /// Opens the chain (sinks start their threads) before the workers
    /// start, after any restore.
    fn open(&mut self, ctx: &mut TaskContext) -> Result<(), BoxError>;
}

/// Lifecycle of a task; shared by both drivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    /// A source with no more records, still taking part in checkpoints
    /// until the final one (checkpointing on).
    Exhausted,
    /// The final barrier passed; waiting for the final checkpoint to
    /// complete before ending the stream.
    AwaitFinal(u64),
    /// End-of-stream was handed to the chain; waiting for output to drain.
    Draining,
    Done,
}

/// Passes checkpoint completions and aborts to the chain (sinks commit).
fn poll_notices<T>(chain: &mut dyn Collector<T>, ctx: &mut TaskContext) -> Result<(), BoxError> {
    let Some(ck) = &ctx.ckpt else { return Ok(()) };
    let completed = ck.signals.completed();
    let abort_seq = ck.signals.abort_seq();
    if abort_seq != ctx.abort_seq_seen {
        let aborted = ck.signals.aborted_after(ctx.abort_id_seen);
        ctx.abort_seq_seen = abort_seq;
        for id in aborted {
            ctx.abort_id_seen = ctx.abort_id_seen.max(id);
            chain.notify(Notice::Abort(id), ctx)?;
        }
    }
    if completed > ctx.notified {
        ctx.notified = completed;
        chain.notify(Notice::Complete(completed), ctx)?;
    }
    Ok(())
}

/// Passes a change of a task's combined input watermark to its chain.
fn forward_watermark<T>(
    chain: &mut dyn Collector<T>,
    update: WatermarkUpdate,
    ctx: &mut TaskContext,
) -> Result<(), BoxError> {
    match update {
        WatermarkUpdate::None => Ok(()),
        WatermarkUpdate::Advance(wm) | WatermarkUpdate::Active(wm) => chain.watermark(wm, ctx),
        WatermarkUpdate::Idle => chain.watermark(IDLE, ctx),
    }
}

/// The first steps of every turn: notices, then the phases that do not
/// read input. `Some` ends the turn with that result.
fn common_phase<T>(
    phase: &mut Phase,
    chain: &mut dyn Collector<T>,
    ctx: &mut TaskContext,
) -> Result<Option<TaskPoll>, BoxError> {
    poll_notices(chain, ctx)?;
    match *phase {
        Phase::Done => Ok(Some(TaskPoll::Done)),
        Phase::Draining => {
            if chain.flush(ctx)? {
                *phase = Phase::Done;
                Ok(Some(TaskPoll::Done))
            } else {
                ctx.output_blocked = true;
                Ok(Some(TaskPoll::Idle))
            }
        }
        Phase::AwaitFinal(id) => {
            if !chain.flush(ctx)? {
                ctx.output_blocked = true;
                return Ok(Some(TaskPoll::Idle));
            }
            if ctx.notified >= id {
                chain.finish(ctx)?;
                *phase = Phase::Draining;
                Ok(Some(TaskPoll::Progress))
            } else {
                Ok(Some(TaskPoll::Idle))
            }
        }
        Phase::Running | Phase::Exhausted => {
            if chain.flush(ctx)? {
                Ok(None)
            } else {
                ctx.output_blocked = true;
                Ok(Some(TaskPoll::Idle))
            }
        }
    }
}

/// Runs the chain's part of a barrier and hands the snapshot to the
/// asynchronous writer (or keeps it, for an unaligned snapshot still
/// recording channel state).
fn snapshot_chain<T>(
    chain: &mut dyn Collector<T>,
    barrier: Barrier,
    mut snap: TaskSnapshot,
    ctx: &mut TaskContext,
) -> Result<TaskSnapshot, BoxError> {
    // Completions signalled before this checkpoint was triggered are
    // visible now (the barrier's path orders them): pass them on first, so
    // an incremental state snapshot builds on the latest completed one.
    poll_notices(chain, ctx)?;
    let t0 = clock::now_ns();
    snap.alignment_ns = t0.saturating_sub(snap.first_barrier_ns);
    chain.barrier(barrier, &mut snap, ctx)?;
    snap.sync_ns = clock::now_ns().saturating_sub(t0);
    ctx.last_barrier = barrier.id;
    Ok(snap)
}

fn new_snapshot(ctx: &TaskContext, barrier: &Barrier, first_barrier_ns: u64) -> TaskSnapshot {
    let (group, inline_max) = ctx.ckpt.as_ref().map_or((0, 0), |c| (c.group, c.inline_max));
    let mut s = TaskSnapshot::new(barrier.id, group, ctx.subtask, ctx.parallelism, inline_max);
    s.first_barrier_ns = first_barrier_ns;
    s
}

fn send_snapshot(snap: TaskSnapshot, ctx: &TaskContext) {
    if let Some(ck) = &ctx.ckpt {
        complete(snap, ck);
    }
}

/// A task whose chain starts at a source.
pub(crate) struct SourceTask<T, S> {
    source: S,
    chain: Box<dyn Collector<T>>,
    batch: Vec<T>,
    batch_size: usize,
    phase: Phase,
    /// Latest completed checkpoint passed to [`Source::checkpoint_complete`].
    source_notified: u64,
}

impl<T, S> SourceTask<T, S> {
    pub(crate) fn new(source: S, chain: Box<dyn Collector<T>>, batch_size: usize) -> Self {
        SourceTask {
            source,
            chain,
            batch: Vec::with_capacity(batch_size),
            batch_size,
            phase: Phase::Running,
            source_notified: 0,
        }
    }
}

impl<T: Send, S: Source<T>> SourceTask<T, S> {
    /// Tells the source of checkpoints completed since the last call.
    fn notify_source(&mut self, ctx: &mut TaskContext) -> Result<(), BoxError> {
        if ctx.notified > self.source_notified {
            self.source_notified = ctx.notified;
            ctx.current_op = 0;
            self.source.checkpoint_complete(ctx.notified)?;
        }
        Ok(())
    }

    /// Injects the barriers of every checkpoint triggered since the last
    /// one, between two batches: the offset taken here is exactly where
    /// the barrier sits in the stream.
    fn inject_barriers(&mut self, ctx: &mut TaskContext) -> Result<bool, BoxError> {
        let Some(ck) = &ctx.ckpt else { return Ok(false) };
        let triggered = ck.signals.triggered();
        if triggered <= ctx.last_barrier {
            return Ok(false);
        }
        // Only ids the coordinator triggered in this attempt (the task's
        // numbering starts at its first id, see `job::prepare`).
        debug_assert!(ctx.last_barrier + 1 >= ck.signals.first_id);
        let mode = ck.signals.mode;
        let final_id = ck.signals.final_id();
        let trigger_ns: Vec<(u64, u64)> = (ctx.last_barrier + 1..=triggered)
            .map(|id| (id, ck.signals.trigger_ns(id)))
            .collect();
        for (id, trigger_ns) in trigger_ns {
            let barrier = Barrier {
                id,
                trigger_ns,
                // The final barrier follows the last record: nothing is in
                // flight behind it, so it is always handled aligned.
                unaligned: mode == CheckpointMode::Unaligned && id != final_id,
                is_final: id == final_id,
            };
            let mut snap = new_snapshot(ctx, &barrier, clock::now_ns());
            snap.is_final = barrier.is_final;
            ctx.current_op = 0;
            snap.state.source_offset = Some(self.source.checkpoint_offset(id));
            let snap = snapshot_chain(&mut *self.chain, barrier, snap, ctx)?;
            send_snapshot(snap, ctx);
            if barrier.is_final {
                self.phase = Phase::AwaitFinal(id);
                break;
            }
        }
        Ok(true)
    }
}

impl<T: Send, S: Source<T>> Task for SourceTask<T, S> {
    fn replayable(&self) -> bool {
        self.source.is_replayable()
    }

    fn poll(&mut self, ctx: &mut TaskContext) -> Result<TaskPoll, BoxError> {
        // Barriers first, even when output is backpressured: an unaligned
        // barrier overtakes the staged records (reserved ring slots), an
        // aligned one queues behind them.
        let mut injected = false;
        if matches!(self.phase, Phase::Running | Phase::Exhausted) {
            poll_notices(&mut *self.chain, ctx)?;
            injected = self.inject_barriers(ctx)?;
        }
        let phase = common_phase(&mut self.phase, &mut *self.chain, ctx)?;
        self.notify_source(ctx)?;
        if let Some(p) = phase {
            return Ok(if injected && p == TaskPoll::Idle {
                TaskPoll::Progress
            } else {
                p
            });
        }
        if self.phase != Phase::Running {
            // Exhausted, or the final barrier just went out.
            return Ok(if injected { TaskPoll::Progress } else { TaskPoll::Idle });
        }
        ctx.current_op = 0;
        let mut sctx = SourceContext::new(ctx);
        let status = self.source.poll(&mut self.batch, self.batch_size, &mut sctx)?;
        let watermark = sctx.watermark;
        let emitted = self.batch.len();
        if let Some(left) = self.source.backlog() {
            ctx.counters.backlog.store(
                left.min(crate::runtime::metrics::NO_BACKLOG - 1),
                std::sync::atomic::Ordering::Relaxed,
            );
        }
        ctx.count_in::<T>(emitted);
        if emitted > 0 {
            self.chain.collect(&mut self.batch, ctx)?;
            self.batch.clear();
        }
        if let Some(wm) = watermark {
            // The source's own event time, behind its records.
            self.chain.watermark(wm, ctx)?;
        }
        if emitted == 0 && status != SourcePoll::Done {
            // Nothing to emit: a watermark generator may declare idleness.
            self.chain.tick(ctx)?;
        }
        match status {
            SourcePoll::Done => {
                // End of input: event time is complete, so every window and
                // timer downstream fires before the final checkpoint.
                self.chain.watermark(MAX_WATERMARK, ctx)?;
                if let Some(ck) = &ctx.ckpt {
                    // Stay to take part in checkpoints until the final one.
                    ck.send(Event::SourceExhausted { task: ck.task });
                    self.phase = Phase::Exhausted;
                } else {
                    self.chain.finish(ctx)?;
                    self.phase = Phase::Draining;
                }
                Ok(TaskPoll::Progress)
            }
            SourcePoll::Ready if emitted > 0 || injected => Ok(TaskPoll::Progress),
            SourcePoll::Ready | SourcePoll::Idle => Ok(if injected { TaskPoll::Progress } else { TaskPoll::Idle }),
        }
    }

    fn open(&mut self, ctx: &mut TaskContext) -> Result<(), BoxError> {
        self.chain.open(ctx)
    }

    fn restore(&mut self, r: &RestoreCtx<'_>, ctx: &mut TaskContext) -> Result<(), BoxError> {
        let own = r.own.ok_or_else(|| {
            format!(
                "checkpoint {}: a source's offsets cannot be redistributed; restore with the same source parallelism",
                r.checkpoint
            )
        })?;
        if let Some(offset) = &own.source_offset {
            ctx.current_op = 0;
            self.source.seek(offset)?;
        }
        ctx.last_barrier = r.checkpoint;
        self.source_notified = r.checkpoint;
        self.chain.restore(r, ctx)
    }
}

/// One input channel of a task.
pub(crate) struct Inbox<T> {
    ring: Consumer<Message<T>>,
    /// The producer's worker, woken after reads if it sleeps (it may be
    /// waiting for room in this ring).
    wake: Option<std::sync::Arc<crate::threads::idle::Parker>>,
    ended: bool,
    /// Aligned mode: this input delivered the barrier being aligned and is
    /// paused until every input has.
    blocked: bool,
    /// Messages at the front of the ring already looked at by look-ahead
    /// (and, while recording, encoded as channel state).
    scanned: usize,
    /// A barrier found by look-ahead that is still in the ring; reading it
    /// later must not handle it twice.
    ahead: Option<u64>,
    /// Id of the latest barrier this input delivered or look-ahead found.
    delivered: u64,
    /// A same-worker channel: where each batch handed over by reference
    /// goes back, emptied, to its producer's pool.
    returns: Option<crate::runtime::message::BatchReturn<T>>,
}

/// Hands `batch` to `chain` when it holds records, counting them in, and
/// leaves it empty.
fn hand_on<T>(batch: &mut Vec<T>, chain: &mut dyn Collector<T>, ctx: &mut TaskContext) -> Result<(), BoxError> {
    if batch.is_empty() {
        return Ok(());
    }
    ctx.count_in::<T>(batch.len());
    chain.collect(batch, ctx)?;
    batch.clear();
    Ok(())
}

impl<T> Drop for Inbox<T> {
    /// Frees the batches still in the ring: a batch message's box has no
    /// drop glue of its own ([`Message::Batch`]).
    fn drop(&mut self) {
        while let Ok(m) = self.ring.pop() {
            if let Message::Batch(records) = m {
                drop(std::mem::ManuallyDrop::into_inner(records));
            }
        }
    }
}

impl<T> Inbox<T> {
    pub(crate) fn new(
        ring: Consumer<Message<T>>,
        wake: Option<std::sync::Arc<crate::threads::idle::Parker>>,
        returns: Option<crate::runtime::message::BatchReturn<T>>,
    ) -> Self {
        Inbox {
            ring,
            wake,
            returns,
            ended: false,
            blocked: false,
            scanned: 0,
            ahead: None,
            delivered: 0,
        }
    }

    fn has(&self, id: u64) -> bool {
        self.ended || self.delivered >= id
    }
}

/// Barrier handling of a task with inputs: an explicit state machine.
///
/// - `Idle` -> `Collecting` (aligned, at-least-once, and the final barrier
///   in every mode) at the first barrier; -> `Idle` once every input
///   delivered it (snapshot taken then).
/// - `Idle` -> `Recording` (unaligned, or an aligned checkpoint past its
///   alignment timeout, or a barrier flagged unaligned; never the final
///   barrier) with the snapshot taken at once; -> `Idle` once the barrier
///   was found in every input.
/// - `Recording(n)`, a newer barrier `m` that is not the final one: `n` is
///   declined (subsumed) and `m` is recorded instead.
/// - `Recording(n)`, the final barrier `f` read on input `i`: `i` is
///   blocked and `f` waits (`final_waiting`) while `n` goes on recording;
///   once `n` was found in every input it is acknowledged and the task
///   goes to `Collecting(f)`.
/// - `Recording(n)` while an input that has not delivered `n` shows the
///   final barrier next (so `n` never comes there): `n` is declined, and
///   the task goes to `Collecting(f)` if `f` was waiting, else to `Idle`
///   (`f` is read in order later).
///
/// Invariants: the final checkpoint is never taken unaligned (records it
/// overtook would reach the sinks after their final pre-commit;
/// docs/design/checkpoints.md#barrier-flow). Its snapshot is taken only by
/// `complete_collecting`, once
/// the final barrier was read, in order, on every input, so every record
/// before it was processed and the barrier it forwards queues behind
/// every staged record; look-ahead never claims a final barrier.
enum Gate {
    Idle,
    Collecting {
        barrier: Barrier,
        first_ns: u64,
    },
    Recording {
        snap: Box<TaskSnapshot>,
        /// Per input, the records and watermarks recorded so far.
        buffers: Vec<ChannelRecorder>,
        /// The final barrier, read on some inputs (now blocked) while this
        /// checkpoint was still recording, and when it first arrived: it is
        /// collected, aligned, once this checkpoint is done or given up.
        final_waiting: Option<(Barrier, u64)>,
    },
}

/// What look-ahead found in an input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    Nothing,
    /// A newer barrier, claimed (`Inbox::ahead`): the caller handles it now.
    Barrier(Barrier),
    /// The final barrier is next: never claimed; look-ahead stopped in
    /// front of it, and the task reads it in order with the data.
    Final,
}

/// A task whose chain starts at its input rings.
pub(crate) struct InputTask<T> {
    inputs: Vec<Inbox<T>>,
    chain: Box<dyn Collector<T>>,
    batch: Vec<T>,
    batch_size: usize,
    /// Input to read first next turn: rotates for fairness between inputs.
    next_input: usize,
    open_inputs: usize,
    phase: Phase,
    gate: Gate,
    /// Restored channel state, fed to the chain before any live input
    /// (`None` once fed: the normal path checks one discriminant).
    replay: Option<Box<Replay<T>>>,
    /// Event time of each input; the minimum goes to the chain.
    watermarks: InputWatermarks,
}

impl<T> InputTask<T> {
    pub(crate) fn new(inputs: Vec<Inbox<T>>, chain: Box<dyn Collector<T>>, batch_size: usize) -> Self {
        assert!(!inputs.is_empty(), "an input task needs at least one input ring");
        let open_inputs = inputs.len();
        InputTask {
            inputs,
            chain,
            batch: Vec::with_capacity(batch_size),
            batch_size,
            next_input: 0,
            open_inputs,
            phase: Phase::Running,
            gate: Gate::Idle,
            replay: None,
            watermarks: InputWatermarks::new(open_inputs),
        }
    }
}

impl<T: Data> InputTask<T> {
    fn mode(ctx: &TaskContext) -> Option<CheckpointMode> {
        ctx.ckpt.as_ref().map(|c| c.signals.mode)
    }

    /// Looks at the messages of `inbox` not scanned yet, up to the first
    /// barrier newer than its last one; encodes records into `buffer` when
    /// recording. Consumes nothing. Returns the barrier found, if any.
    fn scan(
        inbox: &mut Inbox<T>,
        mut buffer: Option<&mut ChannelRecorder>,
        records: &mut u64,
    ) -> Result<Found, BoxError> {
        if inbox.ended || inbox.ahead.is_some() {
            return Ok(Found::Nothing);
        }
        let available = inbox.ring.slots();
        if available <= inbox.scanned {
            return Ok(Found::Nothing);
        }
        let mut found = Found::Nothing;
        let mut pos = inbox.scanned;
        {
            // Peek only: the chunk is never committed, so scanning consumes nothing.
            let chunk = inbox
                .ring
                .read_chunk(available)
                .expect("slots() promised this many readable messages");
            let (a, b) = chunk.as_slices();
            while pos < available {
                let m = if pos < a.len() { &a[pos] } else { &b[pos - a.len()] };
                pos += 1;
                match m {
                    Message::Data(r) => {
                        if let Some(buf) = buffer.as_deref_mut() {
                            buf.record(r)?;
                            *records += 1;
                        }
                    }
                    Message::Batch(batch) => {
                        if let Some(buf) = buffer.as_deref_mut() {
                            for r in batch.iter() {
                                buf.record(r)?;
                            }
                            *records += batch.len() as u64;
                        }
                    }
                    // Recorded in place: replayed between the same records
                    // after a restore, so event time after it is what it
                    // would have been.
                    Message::Watermark(wm) => {
                        if let Some(buf) = buffer.as_deref_mut() {
                            buf.watermark(*wm);
                        }
                    }
                    Message::Barrier(bar) if bar.id > inbox.delivered => {
                        if bar.is_final {
                            // The final barrier is handled aligned, when read:
                            // stop in front of it without claiming it.
                            pos -= 1;
                            found = Found::Final;
                            break;
                        }
                        found = Found::Barrier(*bar);
                        break;
                    }
                    _ => {}
                }
            }
        }
        inbox.scanned = pos;
        if let Found::Barrier(bar) = found {
            inbox.ahead = Some(bar.id);
            inbox.delivered = bar.id;
        }
        Ok(found)
    }

    /// Takes an unaligned snapshot now, for `barrier`, and starts recording
    /// in-flight records: everything queued before the barrier in inputs
    /// that have not consumed it, and what arrives there until it shows up.
    fn start_unaligned(&mut self, barrier: Barrier, first_ns: u64, ctx: &mut TaskContext) -> Result<(), BoxError> {
        assert!(!barrier.is_final, "the final checkpoint is never taken unaligned");
        debug_assert!(matches!(self.gate, Gate::Idle));
        let barrier = Barrier {
            unaligned: true,
            ..barrier
        };
        let mut snap = new_snapshot(ctx, &barrier, first_ns);
        // Event time at the snapshot; the channel state recorded below
        // holds the watermarks that follow it.
        snap.state.input_event_time = Some(self.watermarks.checkpoint());
        let mut snap = snapshot_chain(&mut *self.chain, barrier, snap, ctx)?;
        let mut buffers = vec![ChannelRecorder::default(); self.inputs.len()];
        let mut records = 0;
        let mut final_next = false;
        for (inbox, buffer) in self.inputs.iter_mut().zip(buffers.iter_mut()) {
            inbox.blocked = false;
            let consumed = inbox.ahead.is_none() && inbox.delivered >= barrier.id;
            if inbox.ended || consumed {
                continue;
            }
            // Rescan from the front, encoding, up to the barrier if present.
            inbox.scanned = 0;
            inbox.ahead = None;
            inbox.delivered = inbox.delivered.min(barrier.id - 1);
            final_next |= Self::scan(inbox, Some(buffer), &mut records)? == Found::Final;
        }
        snap.state.channel_records += records;
        self.gate = Gate::Recording {
            snap: Box::new(snap),
            buffers,
            final_waiting: None,
        };
        if final_next {
            return self.give_up_recording(
                "the final barrier came first on an input: this checkpoint's barrier never will".into(),
                ctx,
            );
        }
        self.finish_recording_if_done(ctx)
    }

    /// Ends recording once the barrier was found in every input; then
    /// collects a final barrier that waited behind it.
    fn finish_recording_if_done(&mut self, ctx: &mut TaskContext) -> Result<(), BoxError> {
        let Gate::Recording { snap, .. } = &self.gate else {
            return Ok(());
        };
        let id = snap.id();
        if !self.inputs.iter().all(|i| i.has(id)) {
            return Ok(());
        }
        let Gate::Recording {
            mut snap,
            buffers,
            final_waiting,
        } = std::mem::replace(&mut self.gate, Gate::Idle)
        else {
            unreachable!("matched above");
        };
        for (i, b) in buffers.into_iter().enumerate() {
            let state = &mut snap.state;
            b.store_into(i as u32, &mut state.input_channels, &mut state.input_channel_watermarks);
        }
        send_snapshot(*snap, ctx);
        if let Some((barrier, first_ns)) = final_waiting {
            self.gate = Gate::Collecting { barrier, first_ns };
            self.complete_collecting(ctx)?;
        }
        Ok(())
    }

    /// Gives up the checkpoint being recorded, which can no longer complete
    /// here, declining it. A final barrier waiting behind it is collected
    /// now (-> `Collecting`); otherwise -> `Idle`.
    fn give_up_recording(&mut self, reason: String, ctx: &mut TaskContext) -> Result<(), BoxError> {
        let Gate::Recording {
            snap, final_waiting, ..
        } = std::mem::replace(&mut self.gate, Gate::Idle)
        else {
            return Ok(());
        };
        if let Some(ck) = &ctx.ckpt {
            ck.send(Event::Decline {
                id: snap.id(),
                task: ck.task,
                reason,
            });
        }
        if let Some((barrier, first_ns)) = final_waiting {
            self.gate = Gate::Collecting { barrier, first_ns };
            self.complete_collecting(ctx)?;
        }
        Ok(())
    }

    /// Unaligned look-ahead: while a checkpoint is triggered but not taken
    /// here, look for its barrier in every input; while recording, encode
    /// what arrived before the barrier.
    fn look_ahead(&mut self, ctx: &mut TaskContext) -> Result<(), BoxError> {
        match &mut self.gate {
            Gate::Idle => {
                let triggered = ctx.ckpt.as_ref().map_or(0, |c| c.signals.triggered());
                if triggered <= ctx.last_barrier {
                    return Ok(());
                }
                let mut records = 0;
                for i in 0..self.inputs.len() {
                    // A final barrier found next is left for the read (aligned).
                    if let Found::Barrier(bar) = Self::scan(&mut self.inputs[i], None, &mut records)? {
                        return self.start_unaligned(bar, clock::now_ns(), ctx);
                    }
                }
                Ok(())
            }
            Gate::Recording { snap, buffers, .. } => {
                let id = snap.id();
                let mut records = 0;
                let mut newer = None;
                let mut final_next = false;
                for (inbox, buffer) in self.inputs.iter_mut().zip(buffers.iter_mut()) {
                    if !inbox.has(id) {
                        match Self::scan(inbox, Some(buffer), &mut records)? {
                            Found::Barrier(bar) if bar.id > id => newer = Some(bar),
                            Found::Final => final_next = true,
                            Found::Barrier(_) | Found::Nothing => {}
                        }
                    }
                }
                snap.state.channel_records += records;
                if final_next {
                    // This input will never deliver checkpoint `id` (nor a
                    // newer one found elsewhere): only the final one is left.
                    if let (Some(bar), Some(ck)) = (newer, &ctx.ckpt) {
                        ck.send(Event::Decline {
                            id: bar.id,
                            task: ck.task,
                            reason: "the final barrier came first on an input: this checkpoint's barrier never will"
                                .into(),
                        });
                    }
                    return self.give_up_recording(
                        "the final barrier came first on an input: this checkpoint's barrier never will".into(),
                        ctx,
                    );
                }
                if let Some(bar) = newer {
                    return self.subsume(bar, ctx);
                }
                self.finish_recording_if_done(ctx)
            }
            Gate::Collecting { .. } => Ok(()),
        }
    }

    /// A newer barrier (not the final one) reached this task while it was
    /// still recording an older checkpoint's channel state (that checkpoint
    /// was aborted, or is being overtaken): give the older one up, declining
    /// it, and take the newer one, as a newer checkpoint subsumes an older
    /// one. If the final barrier already waits behind the older one, the
    /// newer one cannot complete here either (it did not come before the
    /// final one on that input): both are declined and the final one is
    /// collected.
    fn subsume(&mut self, barrier: Barrier, ctx: &mut TaskContext) -> Result<(), BoxError> {
        debug_assert!(!barrier.is_final, "a final barrier waits, it never subsumes");
        let final_waiting = matches!(
            self.gate,
            Gate::Recording {
                final_waiting: Some(_),
                ..
            }
        );
        let reason = format!(
            "subsumed by checkpoint {} before its channel state was complete",
            barrier.id
        );
        if final_waiting {
            if let Some(ck) = &ctx.ckpt {
                ck.send(Event::Decline {
                    id: barrier.id,
                    task: ck.task,
                    reason: "the final barrier came before it on an input".into(),
                });
            }
            return self.give_up_recording(reason, ctx);
        }
        self.give_up_recording(reason, ctx)?;
        for inbox in &mut self.inputs {
            if inbox.ahead.is_some_and(|a| a < barrier.id) {
                inbox.ahead = None;
            }
        }
        self.start_unaligned(barrier, clock::now_ns(), ctx)
    }

    /// Handles `barrier` from input `i` once more, after the gate was reset.
    fn on_barrier_again(&mut self, i: usize, barrier: Barrier, ctx: &mut TaskContext) -> Result<(), BoxError> {
        self.inputs[i].delivered = barrier.id - 1;
        self.on_barrier(i, barrier, ctx)
    }

    /// A barrier read from input `i`, in order with its data.
    fn on_barrier(&mut self, i: usize, barrier: Barrier, ctx: &mut TaskContext) -> Result<(), BoxError> {
        let mode = Self::mode(ctx).ok_or("a barrier reached a job without checkpointing")?;
        let inbox = &mut self.inputs[i];
        if inbox.ahead == Some(barrier.id) {
            // Found earlier by look-ahead and handled then.
            inbox.ahead = None;
            return Ok(());
        }
        if barrier.id <= ctx.last_barrier {
            // An older barrier still queued behind the one look-ahead went
            // on to find (a newer unaligned checkpoint started before this
            // input was read up to it): its checkpoint is taken already.
            return Ok(());
        }
        let before = inbox.delivered;
        inbox.delivered = inbox.delivered.max(barrier.id);
        // The final checkpoint is always collected aligned: its barrier is
        // never forwarded flagged unaligned.
        debug_assert!(!(barrier.is_final && barrier.unaligned), "an unaligned final barrier");
        let barrier = if barrier.is_final {
            Barrier {
                unaligned: false,
                ..barrier
            }
        } else {
            barrier
        };
        match &mut self.gate {
            Gate::Recording {
                snap, final_waiting, ..
            } if barrier.is_final && barrier.id > snap.id() => {
                // Not a newer checkpoint to subsume the recorded one with: the
                // final one waits, aligned, until the recorded one is done.
                let recorded = snap.id();
                final_waiting.get_or_insert((barrier, clock::now_ns()));
                self.inputs[i].blocked = true;
                if before < recorded {
                    // The recorded checkpoint's barrier never came on this input.
                    return self.give_up_recording(
                        "the final barrier came first on an input: this checkpoint's barrier never will".into(),
                        ctx,
                    );
                }
                self.finish_recording_if_done(ctx)
            }
            Gate::Recording { snap, .. } if barrier.id > snap.id() => self.subsume(barrier, ctx),
            Gate::Recording { .. } => Ok(()),
            Gate::Idle if !barrier.is_final && (barrier.unaligned || mode == CheckpointMode::Unaligned) => {
                self.start_unaligned(barrier, clock::now_ns(), ctx)
            }
            Gate::Idle => {
                if mode == CheckpointMode::Aligned || barrier.is_final {
                    self.inputs[i].blocked = true;
                }
                self.gate = Gate::Collecting {
                    barrier,
                    first_ns: clock::now_ns(),
                };
                self.complete_collecting(ctx)
            }
            Gate::Collecting { barrier: b, .. } if barrier.id > b.id => {
                // The older checkpoint was given up elsewhere (aborted) before
                // its barrier reached every input here: decline it and
                // collect the newer one, starting with this input.
                let old = b.id;
                if let Some(ck) = &ctx.ckpt {
                    ck.send(Event::Decline {
                        id: old,
                        task: ck.task,
                        reason: format!("subsumed by checkpoint {} before alignment completed", barrier.id),
                    });
                }
                for inbox in &mut self.inputs {
                    inbox.blocked = false;
                }
                self.gate = Gate::Idle;
                self.on_barrier_again(i, barrier, ctx)
            }
            Gate::Collecting { barrier: b, first_ns } => {
                if barrier.id != b.id {
                    // An older barrier behind a newer checkpoint: already given up.
                    return Ok(());
                }
                if barrier.unaligned && !b.is_final {
                    // An upstream task went unaligned: so does this one.
                    let (b, first) = (*b, *first_ns);
                    self.gate = Gate::Idle;
                    return self.start_unaligned(b, first, ctx);
                }
                if mode == CheckpointMode::Aligned || barrier.is_final {
                    self.inputs[i].blocked = true;
                }
                self.complete_collecting(ctx)
            }
        }
    }

    /// Aligned / at-least-once: snapshot once every input delivered the barrier.
    fn complete_collecting(&mut self, ctx: &mut TaskContext) -> Result<(), BoxError> {
        let Gate::Collecting { barrier, first_ns } = self.gate else {
            return Ok(());
        };
        if !self.inputs.iter().all(|i| i.has(barrier.id)) {
            return Ok(());
        }
        // Every input delivered the barrier in order: nothing overtook it,
        // and it goes out behind everything staged (aligned).
        debug_assert!(!barrier.unaligned, "a collected barrier is aligned");
        self.gate = Gate::Idle;
        let mut snap = new_snapshot(ctx, &barrier, first_ns);
        snap.is_final = barrier.is_final;
        // Event time at the snapshot, when it is the barrier's: not in
        // at-least-once mode, whose inputs went on past the barrier (their
        // watermarks from after it would make the replayed records late);
        // event time then starts again from the beginning after a restore.
        if Self::mode(ctx).is_some_and(|m| m.is_exactly_once()) {
            snap.state.input_event_time = Some(self.watermarks.checkpoint());
        }
        let snap = snapshot_chain(&mut *self.chain, barrier, snap, ctx)?;
        for inbox in &mut self.inputs {
            inbox.blocked = false;
        }
        // After the final barrier only end-of-stream follows; the task
        // waits for the final checkpoint once it has read it on every input.
        send_snapshot(snap, ctx);
        Ok(())
    }

    /// Aligned mode with an alignment timeout: past it (counted from the
    /// checkpoint's trigger), the checkpoint continues unaligned here.
    fn check_alignment_timeout(&mut self, ctx: &mut TaskContext) -> Result<(), BoxError> {
        let Gate::Collecting { barrier, first_ns } = self.gate else {
            return Ok(());
        };
        let timeout = ctx.ckpt.as_ref().map_or(0, |c| c.signals.alignment_timeout_ns);
        if timeout == 0 || barrier.is_final || clock::now_ns().saturating_sub(barrier.trigger_ns) < timeout {
            return Ok(());
        }
        self.gate = Gate::Idle;
        self.start_unaligned(barrier, first_ns, ctx)
    }

    /// Feeds at most a batch of restored channel state to the chain, with
    /// the watermarks between the records, as if read from the inputs.
    fn feed_replay(&mut self, ctx: &mut TaskContext) -> Result<(), BoxError> {
        let Some(replay) = self.replay.as_mut() else {
            return Ok(());
        };
        Self::replay_watermarks(replay, &mut self.watermarks, &mut *self.chain, ctx)?;
        let next_mark = replay.marks.front().map_or(usize::MAX, |m| m.0 - replay.fed);
        let n = replay.records.len().min(self.batch_size).min(next_mark);
        if n > 0 {
            self.batch.extend(replay.records.drain(..n));
            replay.fed += n;
            ctx.count_in::<T>(n);
            self.chain.collect(&mut self.batch, ctx)?;
            self.batch.clear();
            Self::replay_watermarks(replay, &mut self.watermarks, &mut *self.chain, ctx)?;
        }
        if replay.records.is_empty() && replay.marks.is_empty() {
            self.replay = None;
        }
        Ok(())
    }

    /// Hands on the replayed watermarks due before the next record.
    fn replay_watermarks(
        replay: &mut Replay<T>,
        watermarks: &mut InputWatermarks,
        chain: &mut dyn Collector<T>,
        ctx: &mut TaskContext,
    ) -> Result<(), BoxError> {
        while let Some(&(at, input, wm)) = replay.marks.front() {
            if at > replay.fed {
                break;
            }
            replay.marks.pop_front();
            let update = watermarks.on_watermark(input, wm);
            forward_watermark(chain, update, ctx)?;
        }
        Ok(())
    }
}

impl<T: Data> Task for InputTask<T> {
    fn poll(&mut self, ctx: &mut TaskContext) -> Result<TaskPoll, BoxError> {
        let mode = Self::mode(ctx);
        if self.phase == Phase::Running && self.replay.is_none() {
            // Before the backpressure check: an unaligned barrier is found
            // and forwarded (overtaking staged output) even while this
            // task's output is blocked.
            if mode == Some(CheckpointMode::Unaligned) || matches!(self.gate, Gate::Recording { .. }) {
                poll_notices(&mut *self.chain, ctx)?;
                self.look_ahead(ctx)?;
            } else if mode == Some(CheckpointMode::Aligned) {
                self.check_alignment_timeout(ctx)?;
            }
        }
        if let Some(p) = common_phase(&mut self.phase, &mut *self.chain, ctx)? {
            return Ok(p);
        }
        if self.replay.is_some() {
            self.feed_replay(ctx)?;
            return Ok(TaskPoll::Progress);
        }
        let mut budget = self.batch_size;
        if mode == Some(CheckpointMode::Unaligned) && matches!(self.gate, Gate::Idle) {
            let triggered = ctx.ckpt.as_ref().map_or(0, |c| c.signals.triggered());
            if triggered > ctx.last_barrier {
                // A barrier is on its way: take small steps so that
                // look-ahead (once per turn) finds it soon even when the
                // chain is slow per record.
                budget = budget.min(UNALIGNED_PROBE_BUDGET);
            }
        }
        let mut progressed = false;
        let mut queued = 0u64;
        let n_inputs = self.inputs.len();
        let turn_start = clock::now_ns();
        for k in 0..n_inputs {
            if self.phase != Phase::Running {
                break;
            }
            let i = (self.next_input + k) % n_inputs;
            let recording_id = match &self.gate {
                Gate::Recording { snap, .. } => Some(snap.id()),
                _ => None,
            };
            if recording_id.is_some() {
                // Everything readable must be recorded before it is consumed.
                self.look_ahead(ctx)?;
            }
            let inbox = &mut self.inputs[i];
            let available = inbox.ring.slots();
            queued += available as u64;
            if let Some(q) = ctx.counters.channel_queued.get(i) {
                q.store(available as u64, std::sync::atomic::Ordering::Relaxed);
            }
            if inbox.ended || inbox.blocked {
                continue;
            }
            let mut n = available.min(budget);
            if matches!(recording_id, Some(id) if !inbox.has(id)) {
                // Only what look-ahead has recorded.
                n = n.min(inbox.scanned);
            }
            if n == 0 {
                continue;
            }
            progressed = true;
            let mut control = None;
            let mut consumed = 0;
            let mut out_of_time = false;
            let mut failed = None;
            {
                let mut chunk = inbox
                    .ring
                    .read_chunk(n)
                    .expect("slots() promised n readable slots and only this consumer reads");
                // The chunk is read as its two slices, a run of records at a
                // time: each message is moved out (an `End` left in its
                // slot, which has nothing to drop) and the chunk's first
                // `consumed` slots are committed at the end, so the loop
                // per record is a tag check, a move and a write behind the
                // batch's last record (the chunk's iterator would cost a
                // branch and an index per item, a push a capacity check).
                let (first, second) = chunk.as_mut_slices();
                'parts: for part in [first, second] {
                    let mut j = 0;
                    while j < part.len() {
                        // Records up to the end of the slice handed on.
                        let end = part.len().min(j + (SLICE - self.batch.len()));
                        let start = j;
                        // Room for the run once, then each record written
                        // behind the last without a capacity check.
                        self.batch.reserve(end - j);
                        let (base, mut len) = (self.batch.as_mut_ptr(), self.batch.len());
                        while j < end {
                            if !matches!(part[j], Message::Data(_)) {
                                break;
                            }
                            if let Message::Data(record) = std::mem::replace(&mut part[j], Message::End) {
                                // SAFETY: `len` is below the capacity
                                // reserved for `end - start` more records,
                                // one per iteration; the slot is
                                // uninitialised and covered by the length
                                // set below, before anything else reads
                                // or drops the batch (nothing here panics).
                                unsafe { base.add(len).write(record) };
                                len += 1;
                            }
                            j += 1;
                        }
                        // SAFETY: the records up to `len` were written above.
                        unsafe { self.batch.set_len(len) };
                        consumed += j - start;
                        if self.batch.len() == SLICE {
                            // Hand on a slice, then see whether the turn
                            // has used its time: a slow chain must not
                            // keep the worker's other tasks waiting.
                            ctx.count_in::<T>(SLICE);
                            if let Err(e) = self.chain.collect(&mut self.batch, ctx) {
                                failed = Some(e);
                                break 'parts;
                            }
                            self.batch.clear();
                            if clock::now_ns().saturating_sub(turn_start) > TURN_QUANTUM_NS {
                                out_of_time = true;
                                break 'parts;
                            }
                            continue;
                        }
                        if j == part.len() {
                            break;
                        }
                        let message = std::mem::replace(&mut part[j], Message::End);
                        j += 1;
                        consumed += 1;
                        match message {
                            Message::Batch(records) => {
                                let mut records = std::mem::ManuallyDrop::into_inner(records);
                                // A batch handed over by reference: the records
                                // before it first, then the batch itself, whose
                                // emptied box goes back to the producer.
                                if let Err(e) = hand_on(&mut self.batch, &mut *self.chain, ctx) {
                                    failed = Some(e);
                                    break 'parts;
                                }
                                let result = hand_on(&mut records, &mut *self.chain, ctx);
                                records.clear();
                                if let Some(back) = inbox.returns.as_mut() {
                                    // The pool's ring holds every box of the
                                    // channel, so there is room.
                                    let returned = back.push(records);
                                    debug_assert!(returned.is_ok(), "a pool holds every box of its channel");
                                }
                                if let Err(e) = result {
                                    failed = Some(e);
                                    break 'parts;
                                }
                                if clock::now_ns().saturating_sub(turn_start) > TURN_QUANTUM_NS {
                                    out_of_time = true;
                                    break 'parts;
                                }
                            }
                            Message::Watermark(wm) => {
                                // In order with the data: hand on the records
                                // before it, then the watermark, and read on.
                                if let Err(e) = hand_on(&mut self.batch, &mut *self.chain, ctx) {
                                    failed = Some(e);
                                    break 'parts;
                                }
                                let update = self.watermarks.on_watermark(i, wm);
                                if let Err(e) = forward_watermark(&mut *self.chain, update, ctx) {
                                    failed = Some(e);
                                    break 'parts;
                                }
                            }
                            other => {
                                // Stop here: what follows the control message
                                // stays in the ring (an aligned input may block).
                                control = Some(other);
                                break 'parts;
                            }
                        }
                    }
                }
                chunk.commit(consumed);
            }
            if let Some(e) = failed {
                return Err(e);
            }
            inbox.scanned = inbox.scanned.saturating_sub(consumed);
            if let Some(w) = &inbox.wake {
                w.wake();
            }
            budget -= consumed;
            ctx.count_in::<T>(self.batch.len());
            if !self.batch.is_empty() {
                self.chain.collect(&mut self.batch, ctx)?;
                self.batch.clear();
            }
            let flushed = out_of_time || self.chain.flush(ctx)?;
            if !flushed {
                ctx.output_blocked = true;
            }
            if out_of_time || !flushed {
                // Out of time, or output backpressured: read no more this
                // turn (the collector contract).
                budget = 0;
            }
            match control {
                Some(Message::End) => {
                    self.inputs[i].ended = true;
                    self.open_inputs -= 1;
                    let update = self.watermarks.on_end(i);
                    forward_watermark(&mut *self.chain, update, ctx)?;
                    self.complete_collecting(ctx)?;
                    self.finish_recording_if_done(ctx)?;
                }
                Some(Message::Barrier(b)) => self.on_barrier(i, b, ctx)?,
                Some(Message::Watermark(_) | Message::Data(_) | Message::Batch(_)) | None => {}
            }
            if budget == 0 {
                break;
            }
        }
        if !progressed && self.phase == Phase::Running {
            // No input this turn: processing-time timers and idleness
            // detection still need to run.
            self.chain.tick(ctx)?;
        }
        self.next_input = (self.next_input + 1) % n_inputs;
        ctx.counters
            .input_queued
            .store(queued, std::sync::atomic::Ordering::Relaxed);
        if self.open_inputs == 0 && self.phase == Phase::Running {
            match ctx.ckpt.as_ref().map(|c| c.signals.final_id()) {
                Some(final_id) if final_id > 0 => self.phase = Phase::AwaitFinal(final_id),
                _ => {
                    self.chain.finish(ctx)?;
                    self.phase = Phase::Draining;
                }
            }
            return Ok(TaskPoll::Progress);
        }
        Ok(if progressed { TaskPoll::Progress } else { TaskPoll::Idle })
    }

    fn open(&mut self, ctx: &mut TaskContext) -> Result<(), BoxError> {
        self.chain.open(ctx)
    }

    fn restore(&mut self, r: &RestoreCtx<'_>, ctx: &mut TaskContext) -> Result<(), BoxError> {
        ctx.last_barrier = r.checkpoint;
        for inbox in &mut self.inputs {
            inbox.delivered = r.checkpoint;
        }
        // Event time as at the snapshot, when known (see `RestoreCtx::watermark`).
        let mut watermark = MIN_WATERMARK;
        match r.own {
            Some(own) => {
                for (i, _) in own.input_channels.iter() {
                    if *i as usize >= self.inputs.len() {
                        return Err(format!("checkpoint {}: input channel {i} does not exist", r.checkpoint).into());
                    }
                }
                for (i, _) in own.input_channel_watermarks.iter() {
                    if *i as usize >= self.inputs.len() {
                        return Err(format!("checkpoint {}: input channel {i} does not exist", r.checkpoint).into());
                    }
                }
                if let Some(time) = &own.input_event_time {
                    if self.watermarks.restore(time) {
                        watermark = time.emitted;
                    }
                }
                let mut replay = Replay {
                    records: Vec::new(),
                    marks: std::collections::VecDeque::new(),
                    fed: 0,
                };
                // Channel by channel, each in its order: one of the orders
                // in which the task could have read them.
                for i in 0..self.inputs.len() {
                    let bytes = own
                        .input_channels
                        .iter()
                        .find(|(c, _)| *c as usize == i)
                        .map_or(&[][..], |(_, b)| b);
                    let marks = own
                        .input_channel_watermarks
                        .iter()
                        .find(|(c, _)| *c as usize == i)
                        .map_or(&[][..], |(_, w)| w);
                    let entries = decode_channel::<T>(bytes, marks)
                        .map_err(|e| format!("checkpoint {}: input channel {i}: {e}", r.checkpoint))?;
                    for e in entries {
                        match e {
                            Replayed::Record(record) => replay.records.push(record),
                            Replayed::Watermark(wm) => replay.marks.push_back((replay.records.len(), i, wm)),
                        }
                    }
                }
                if !replay.records.is_empty() || !replay.marks.is_empty() {
                    self.replay = Some(Box::new(replay));
                }
            }
            None => {
                if r.all.iter().any(|s| !s.input_channels.is_empty()) {
                    return Err(format!(
                        "checkpoint {} holds in-flight records of an unaligned checkpoint; \
                         restore it at the same parallelism",
                        r.checkpoint
                    )
                    .into());
                }
            }
        }
        self.chain.restore(&r.with_watermark(watermark), ctx)
    }
}

/// Restored input channel state still to be fed to the chain.
struct Replay<T> {
    /// The records of every input channel, channel after channel.
    records: Vec<T>,
    /// Watermarks to hand on: (records of `records` fed before it, input
    /// channel, watermark), in order.
    marks: std::collections::VecDeque<(usize, usize, i64)>,
    /// Records fed so far.
    fed: usize,
}

#[cfg(test)]
#[path = "task_tests.rs"]
mod tests;
