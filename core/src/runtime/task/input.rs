//! The input task: a chain driven by its input rings ([`Inbox`]). A turn
//! reads the inputs in rotation, a chunk of each ring at a time, and hands
//! records on in slices, watermarks in order between them; a control
//! message ends the read of its input, and a barrier goes to the task's
//! barrier handling ([`super::gate`]). After a restore, the channel state
//! an unaligned checkpoint recorded is fed to the chain first ([`Replay`]).

use rtrb::Consumer;

use crate::checkpoint::channel::{decode_channel, Replayed};
use crate::checkpoint::CheckpointMode;
use crate::clock;
use crate::data::Data;
use crate::error::BoxError;
use crate::runtime::collector::{Collector, RestoreCtx};
use crate::runtime::context::TaskContext;
use crate::runtime::input_watermarks::InputWatermarks;
use crate::runtime::message::Message;
use crate::watermark::MIN_WATERMARK;

use super::gate::Gate;
use super::{common_phase, forward_watermark, poll_notices, Phase, Task, TaskPoll};

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

/// One input channel of a task.
pub(crate) struct Inbox<T> {
    pub(super) ring: Consumer<Message<T>>,
    /// The producer's worker, woken after reads if it sleeps (it may be
    /// waiting for room in this ring).
    wake: Option<std::sync::Arc<crate::threads::idle::Parker>>,
    pub(super) ended: bool,
    /// Aligned mode: this input delivered the barrier being aligned and is
    /// paused until every input has.
    pub(super) blocked: bool,
    /// Messages at the front of the ring already looked at by look-ahead
    /// (and, while recording, encoded as channel state).
    pub(super) scanned: usize,
    /// A barrier found by look-ahead that is still in the ring; reading it
    /// later must not handle it twice.
    pub(super) ahead: Option<u64>,
    /// Id of the latest barrier this input delivered or look-ahead found.
    pub(super) delivered: u64,
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

    #[inline]
    pub(super) fn has(&self, id: u64) -> bool {
        self.ended || self.delivered >= id
    }
}
/// A task whose chain starts at its input rings.
pub(crate) struct InputTask<T> {
    pub(super) inputs: Vec<Inbox<T>>,
    pub(super) chain: Box<dyn Collector<T>>,
    batch: Vec<T>,
    batch_size: usize,
    /// Input to read first next turn: rotates for fairness between inputs.
    next_input: usize,
    open_inputs: usize,
    phase: Phase,
    pub(super) gate: Gate,
    /// Restored channel state, fed to the chain before any live input
    /// (`None` once fed: the normal path checks one discriminant).
    replay: Option<Box<Replay<T>>>,
    /// Event time of each input; the minimum goes to the chain.
    pub(super) watermarks: InputWatermarks,
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
