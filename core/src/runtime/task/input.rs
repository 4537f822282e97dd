//! The input task: a chain driven by its input rings ([`Inbox`]). A turn
//! reads the inputs in rotation, a chunk of each ring at a time, and hands
//! records on in slices, watermarks in order between them; a control
//! message ends the read of its input, and a barrier goes to the task's
//! barrier handling ([`super::gate`]). After a restore, the channel state
//! an unaligned checkpoint recorded is fed to the chain first ([`Replay`]).

use std::mem::ManuallyDrop;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use rtrb::Consumer;

use crate::checkpoint::channel::{decode_channel, Replayed};
use crate::checkpoint::snapshot::TaskState;
use crate::clock;
use crate::data::Data;
use crate::error::BoxError;
use crate::runtime::collector::{Collector, RestoreCtx};
use crate::runtime::context::TaskContext;
use crate::runtime::input_watermarks::InputWatermarks;
use crate::runtime::message::{BatchReturn, Message};
use crate::threads::idle::Parker;
use crate::watermark::MIN_WATERMARK;

use super::dedup::{Backup, Positions, POSITIONS_OP};
use super::gate::Gate;
use super::{common_phase, forward_watermark, Phase, Task, TaskPoll};
use crate::checkpoint::CheckpointMode;

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
    wake: Option<Arc<Parker>>,
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
    /// Data records taken out of the ring so far: the position of the
    /// next one in this channel (dedup mode's record id, [`super::dedup`]).
    pub(super) records: u64,
    /// `(barrier id, records)`: the latest barrier read from this input,
    /// and how many records it had delivered before it.
    pub(super) at_barrier: (u64, u64),
    /// A same-worker channel: where each batch handed over by reference
    /// goes back, emptied, to its producer's pool.
    returns: Option<BatchReturn<T>>,
}

impl<T> Drop for Inbox<T> {
    /// Frees the batches still in the ring: a batch message's box has no
    /// drop glue of its own ([`Message::Batch`]).
    fn drop(&mut self) {
        while let Ok(m) = self.ring.pop() {
            if let Message::Batch(records) = m {
                drop(ManuallyDrop::into_inner(records));
            }
        }
    }
}

impl<T> Inbox<T> {
    pub(crate) fn new(ring: Consumer<Message<T>>, wake: Option<Arc<Parker>>, returns: Option<BatchReturn<T>>) -> Self {
        Inbox {
            ring,
            wake,
            returns,
            ended: false,
            blocked: false,
            scanned: 0,
            ahead: None,
            delivered: 0,
            records: 0,
            at_barrier: (0, 0),
        }
    }

    /// Whether this input delivered barrier `id` (or ended, so never will).
    #[inline]
    pub(super) fn has(&self, id: u64) -> bool {
        self.ended || self.delivered >= id
    }
}

/// Hands `batch` to `chain` when it holds records, counting them in, and
/// leaves it empty.
#[inline]
fn hand_on<T>(batch: &mut Vec<T>, chain: &mut dyn Collector<T>, ctx: &mut TaskContext) -> Result<(), BoxError> {
    if batch.is_empty() {
        return Ok(());
    }
    ctx.count_in::<T>(batch.len());
    chain.collect(batch, ctx)?;
    batch.clear();
    Ok(())
}

/// Dedup mode: keeps `records` of input `input` in the backup before the
/// chain sees them; `end` is the channel position after the last one.
#[inline]
fn keep<T: Data>(backup: &mut Option<Box<Backup>>, input: usize, end: u64, records: &[T]) -> Result<(), BoxError> {
    match backup {
        Some(b) => b.records(input, end - records.len() as u64, records),
        None => Ok(()),
    }
}

/// A batch handed over by reference: the records of `batch` before it
/// first, then the batch itself, whose emptied box goes back to the
/// producer through `returns`.
#[inline]
#[allow(clippy::box_collection)]
fn hand_on_batch<T>(
    records: ManuallyDrop<Box<Vec<T>>>,
    batch: &mut Vec<T>,
    chain: &mut dyn Collector<T>,
    returns: Option<&mut BatchReturn<T>>,
    ctx: &mut TaskContext,
) -> Result<(), BoxError> {
    let mut records = ManuallyDrop::into_inner(records);
    hand_on(batch, chain, ctx)?;
    let result = hand_on(&mut records, chain, ctx);
    records.clear();
    if let Some(back) = returns {
        // The pool's ring holds every box of the channel, so there is room.
        let returned = back.push(records);
        debug_assert!(returned.is_ok(), "a pool holds every box of its channel");
    }
    result
}

/// Moves the run of data records at `part[from..end]` behind the last
/// record of `batch`, up to the first other message; returns the index
/// where the run stopped (`end`, or that message's).
///
/// Each message is moved out (an `End` left in its slot, which has nothing
/// to drop), so the loop per record is a tag check, a move and a write
/// behind the batch's last record (a chunk's iterator would cost a branch
/// and an index per item, a push a capacity check).
#[inline]
fn move_records<T>(part: &mut [Message<T>], from: usize, end: usize, batch: &mut Vec<T>) -> usize {
    // Room for the run once, then each record written behind the last
    // without a capacity check.
    batch.reserve(end - from);
    let (base, mut len) = (batch.as_mut_ptr(), batch.len());
    let mut j = from;
    while j < end {
        if !matches!(part[j], Message::Data(_)) {
            break;
        }
        if let Message::Data(record) = std::mem::replace(&mut part[j], Message::End) {
            // SAFETY: `len` is below the capacity reserved for
            // `end - from` more records, one per iteration; the slot is
            // uninitialised and covered by the length set below, before
            // anything else reads or drops the batch (nothing here panics).
            unsafe { base.add(len).write(record) };
            len += 1;
        }
        j += 1;
    }
    // SAFETY: the records up to `len` were written above.
    unsafe { batch.set_len(len) };
    j
}

/// Whether the turn that started at `turn_start` has used its time.
#[inline]
fn out_of_time(turn_start: u64) -> bool {
    clock::now_ns().saturating_sub(turn_start) > TURN_QUANTUM_NS
}

/// A read chunk of a ring that commits its first `consumed` slots when
/// dropped, unwinding included.
struct Committing<'a, T> {
    chunk: Option<rtrb::chunks::ReadChunk<'a, Message<T>>>,
    consumed: usize,
}

impl<T> Drop for Committing<'_, T> {
    fn drop(&mut self) {
        if let Some(c) = self.chunk.take() {
            c.commit(self.consumed);
        }
    }
}

/// What one read of an input did.
struct Read<T> {
    /// Messages taken out of the ring.
    consumed: usize,
    /// The control message the read stopped at (taken out of the ring).
    control: Option<Message<T>>,
    /// The read stopped because the turn used its time.
    out_of_time: bool,
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
    /// Dedup mode: what the task took since its last completed
    /// checkpoint, to recover alone ([`super::dedup`]).
    pub(super) backup: Option<Box<Backup>>,
    /// Dedup mode, after a restore: per input, the replayed records still
    /// to drop (empty once none are left).
    pub(super) skips: Vec<u64>,
    /// The id (input, position) of the backed-up record being fed again
    /// after a recovery, one at a time: named if it fails again.
    replaying: Option<(u32, u64, u64)>,
}

/// The input side of a failed dedup task, moved into its replacement: the
/// rings with what they hold, and the backup. (Not the inputs' event time:
/// the replacement starts from the restored checkpoint's and replays the
/// watermarks in the backup.)
struct Transplant<T> {
    inputs: Vec<Inbox<T>>,
    backup: Option<Box<Backup>>,
    /// Replayed records still to drop (after an earlier whole-job
    /// restore): the restored state holds them too.
    skips: Vec<u64>,
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
            backup: None,
            skips: Vec::new(),
            replaying: None,
        }
    }
}

impl<T: Data> InputTask<T> {
    /// How many messages to read from input `i` this turn, at most
    /// `budget` (0: none); adds what its ring holds to `queued`. While a
    /// checkpoint records channel state, everything readable is recorded
    /// first, and only what was recorded is read.
    #[inline]
    fn readable(
        &mut self,
        i: usize,
        budget: usize,
        queued: &mut u64,
        ctx: &mut TaskContext,
    ) -> Result<usize, BoxError> {
        if self.skips.get(i).is_some_and(|&k| k > 0) {
            // Dedup: an input still dropping replayed records is read by
            // `drop_replayed`.
            return Ok(0);
        }
        let recording_id = self.gate.recording();
        if recording_id.is_some() {
            // Everything readable must be recorded before it is consumed.
            self.look_ahead(ctx)?;
        }
        let inbox = &mut self.inputs[i];
        let available = inbox.ring.slots();
        *queued += available as u64;
        if let Some(q) = ctx.counters.channel_queued.get(i) {
            q.store(available as u64, Ordering::Relaxed);
        }
        if inbox.ended || inbox.blocked {
            return Ok(0);
        }
        let mut n = available.min(budget);
        if matches!(recording_id, Some(id) if !inbox.has(id)) {
            // Only what look-ahead has recorded.
            n = n.min(inbox.scanned);
        }
        Ok(n)
    }

    /// Reads the first `n` messages of input `i`: data records go to the
    /// chain in slices of [`SLICE`], batches and watermarks in order with
    /// them. Stops at a control message (barrier or end-of-stream, returned
    /// to the caller, what follows it stays in the ring: an aligned input
    /// may block) or when the turn is out of time. Records of the last
    /// slice may stay in `self.batch`.
    #[inline]
    fn read_input(&mut self, i: usize, n: usize, turn_start: u64, ctx: &mut TaskContext) -> Result<Read<T>, BoxError> {
        debug_assert!(self.batch.is_empty(), "every read starts with an empty batch");
        let inbox = &mut self.inputs[i];
        let mut read = Read {
            consumed: 0,
            control: None,
            out_of_time: false,
        };
        let mut failed = None;
        {
            // Commits what was taken even when the chain panics midway: a
            // slot whose message was moved out must never be read again
            // (it holds an `End` in its place), and a dedup task's rings
            // outlive its chain ([`super::dedup`]).
            let mut chunk = Committing {
                chunk: Some(
                    inbox
                        .ring
                        .read_chunk(n)
                        .expect("slots() promised n readable slots and only this consumer reads"),
                ),
                consumed: 0,
            };
            // The chunk is read as its two slices, a run of records at a
            // time (`move_records`), and its first `consumed` slots are
            // committed at the end.
            let (first, second) = chunk.chunk.as_mut().expect("set above").as_mut_slices();
            'parts: for part in [first, second] {
                let mut j = 0;
                while j < part.len() {
                    // Records up to the end of the slice handed on.
                    let end = part.len().min(j + (SLICE - self.batch.len()));
                    let start = j;
                    j = move_records(part, j, end, &mut self.batch);
                    chunk.consumed += j - start;
                    inbox.records += (j - start) as u64;
                    if self.batch.len() == SLICE {
                        // Hand on a slice, then see whether the turn has
                        // used its time: a slow chain must not keep the
                        // worker's other tasks waiting.
                        if let Err(e) = keep(&mut self.backup, i, inbox.records, &self.batch) {
                            failed = Some(e);
                            break 'parts;
                        }
                        ctx.count_in::<T>(SLICE);
                        if let Err(e) = self.chain.collect(&mut self.batch, ctx) {
                            failed = Some(e);
                            break 'parts;
                        }
                        self.batch.clear();
                        if out_of_time(turn_start) {
                            read.out_of_time = true;
                            break 'parts;
                        }
                        continue;
                    }
                    if j == part.len() {
                        break;
                    }
                    let message = std::mem::replace(&mut part[j], Message::End);
                    j += 1;
                    chunk.consumed += 1;
                    match message {
                        Message::Batch(records) => {
                            let kept = keep(&mut self.backup, i, inbox.records, &self.batch).and_then(|()| {
                                keep(&mut self.backup, i, inbox.records + records.len() as u64, &records)
                            });
                            if let Err(e) = kept {
                                drop(ManuallyDrop::into_inner(records));
                                failed = Some(e);
                                break 'parts;
                            }
                            inbox.records += records.len() as u64;
                            let returns = inbox.returns.as_mut();
                            if let Err(e) = hand_on_batch(records, &mut self.batch, &mut *self.chain, returns, ctx) {
                                failed = Some(e);
                                break 'parts;
                            }
                            if out_of_time(turn_start) {
                                read.out_of_time = true;
                                break 'parts;
                            }
                        }
                        Message::Watermark(wm) => {
                            // In order with the data: hand on the records
                            // before it, then the watermark, and read on.
                            if let Err(e) = keep(&mut self.backup, i, inbox.records, &self.batch) {
                                failed = Some(e);
                                break 'parts;
                            }
                            if let Some(b) = &mut self.backup {
                                b.watermark(i, wm);
                            }
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
                            read.control = Some(other);
                            break 'parts;
                        }
                    }
                }
            }
            read.consumed = chunk.consumed;
        }
        if let Some(e) = failed {
            return Err(e);
        }
        // What the read left in the batch, kept before `end_read` hands it on.
        keep(&mut self.backup, i, inbox.records, &self.batch)?;
        inbox.scanned = inbox.scanned.saturating_sub(read.consumed);
        if let Some(w) = &inbox.wake {
            w.wake();
        }
        Ok(read)
    }

    /// Hands on the records a read left in `self.batch` and flushes the
    /// output (not when out of time). False when the turn must read no
    /// more: out of time, or output backpressured (the collector contract).
    #[inline]
    fn end_read(&mut self, out_of_time: bool, ctx: &mut TaskContext) -> Result<bool, BoxError> {
        ctx.count_in::<T>(self.batch.len());
        if !self.batch.is_empty() {
            self.chain.collect(&mut self.batch, ctx)?;
            self.batch.clear();
        }
        let flushed = out_of_time || self.chain.flush(ctx)?;
        if !flushed {
            ctx.output_blocked = true;
        }
        Ok(!out_of_time && flushed)
    }

    /// Handles the control message a read of input `i` stopped at.
    #[inline]
    fn on_control(&mut self, i: usize, control: Option<Message<T>>, ctx: &mut TaskContext) -> Result<(), BoxError> {
        match control {
            Some(Message::End) => self.on_end(i, ctx),
            Some(Message::Barrier(b)) => self.on_barrier(i, b, ctx),
            Some(Message::Watermark(_) | Message::Data(_) | Message::Batch(_)) | None => Ok(()),
        }
    }

    /// End-of-stream read from input `i`: it counts as complete for event
    /// time, and as having delivered every barrier still awaited.
    fn on_end(&mut self, i: usize, ctx: &mut TaskContext) -> Result<(), BoxError> {
        self.inputs[i].ended = true;
        self.open_inputs -= 1;
        let update = self.watermarks.on_end(i);
        forward_watermark(&mut *self.chain, update, ctx)?;
        self.complete_collecting(ctx)?;
        self.finish_recording_if_done(ctx)
    }

    /// Every input ended: the stream ends, after the final checkpoint if
    /// there is one (see [`Phase::AwaitFinal`]).
    fn end_stream(&mut self, ctx: &mut TaskContext) -> Result<(), BoxError> {
        match ctx.ckpt.as_ref().map(|c| c.signals.final_id()) {
            Some(final_id) if final_id > 0 => self.phase = Phase::AwaitFinal(final_id),
            _ => {
                self.chain.finish(ctx)?;
                self.phase = Phase::Draining;
            }
        }
        Ok(())
    }

    /// Dedup mode, after a restore: reads the inputs that still have
    /// replayed records to drop (those the snapshot holds already), drops
    /// them, and hands on what follows them. True if it read anything.
    fn drop_replayed(&mut self, ctx: &mut TaskContext) -> Result<bool, BoxError> {
        let mut progressed = false;
        for i in 0..self.inputs.len() {
            while self.skips[i] > 0 {
                let Ok(message) = self.inputs[i].ring.pop() else { break };
                progressed = true;
                match message {
                    Message::Data(_) => {
                        self.skips[i] -= 1;
                        self.inputs[i].records += 1;
                    }
                    Message::Batch(records) => {
                        let mut records = ManuallyDrop::into_inner(records);
                        let dropped = records.len().min(self.skips[i] as usize);
                        records.drain(..dropped);
                        self.skips[i] -= dropped as u64;
                        let inbox = &mut self.inputs[i];
                        inbox.records += dropped as u64;
                        inbox.records += records.len() as u64;
                        let kept = keep(&mut self.backup, i, inbox.records, &records);
                        let result = kept.and_then(|()| hand_on(&mut records, &mut *self.chain, ctx));
                        records.clear();
                        if let Some(back) = inbox.returns.as_mut() {
                            let _ = back.push(records);
                        }
                        result?;
                    }
                    Message::Watermark(wm) => {
                        if let Some(b) = &mut self.backup {
                            b.watermark(i, wm);
                        }
                        let update = self.watermarks.on_watermark(i, wm);
                        forward_watermark(&mut *self.chain, update, ctx)?;
                    }
                    control => {
                        let end = matches!(control, Message::End);
                        self.on_control(i, Some(control), ctx)?;
                        if end {
                            // Ended before the replay reached the snapshot.
                            self.skips[i] = 0;
                        }
                    }
                }
            }
            if let Some(w) = &self.inputs[i].wake {
                w.wake();
            }
        }
        if self.skips.iter().all(|&k| k == 0) {
            self.skips.clear();
        }
        Ok(progressed)
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
        if !replay.ids.is_empty() {
            // A dedup recovery: runs of one input at a time (one record at
            // a time when `one_by_one`), each named while it is fed, so
            // that a failure names the records it happened on.
            let mut left = n;
            while left > 0 {
                let (input, first) = replay.ids[replay.fed];
                let run = if replay.one_by_one {
                    1
                } else {
                    replay.ids[replay.fed..replay.fed + left]
                        .iter()
                        .take_while(|(i, _)| *i == input)
                        .count()
                };
                self.replaying = Some((input, first, replay.ids[replay.fed + run - 1].1));
                self.batch.extend(replay.records.drain(..run));
                replay.fed += run;
                left -= run;
                ctx.count_in::<T>(run);
                self.chain.collect(&mut self.batch, ctx)?;
                self.batch.clear();
                Self::replay_watermarks(replay, &mut self.watermarks, &mut *self.chain, ctx)?;
            }
            self.replaying = None;
        } else if n > 0 {
            self.batch.extend(replay.records.drain(..n));
            replay.fed += n;
            ctx.count_in::<T>(n);
            self.chain.collect(&mut self.batch, ctx)?;
            self.batch.clear();
            Self::replay_watermarks(replay, &mut self.watermarks, &mut *self.chain, ctx)?;
        }
        if replay.records.is_empty() && replay.marks.is_empty() {
            self.replay = None;
            self.end_replay(ctx)?;
        }
        Ok(())
    }

    /// The replay is over: inputs that had ended before a dedup recovery
    /// end for event time now. End-of-stream follows the final barrier,
    /// which is aligned on every input, so it came after every record the
    /// replay fed, as here.
    fn end_replay(&mut self, ctx: &mut TaskContext) -> Result<(), BoxError> {
        ctx.replaying_backup = false;
        for i in 0..self.inputs.len() {
            if self.inputs[i].ended && !self.watermarks.has_ended(i) {
                let update = self.watermarks.on_end(i);
                forward_watermark(&mut *self.chain, update, ctx)?;
            }
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
            self.barriers_before_output(mode, ctx)?;
        }
        if let Some(p) = common_phase(&mut self.phase, &mut *self.chain, ctx)? {
            return Ok(p);
        }
        if let Some(b) = &mut self.backup {
            // What the latest completed checkpoint holds is safe.
            b.completed(ctx.notified);
        }
        if self.replay.is_some() {
            self.feed_replay(ctx)?;
            return Ok(TaskPoll::Progress);
        }
        let mut progressed = !self.skips.is_empty() && self.drop_replayed(ctx)?;
        let mut budget = self.turn_budget(self.batch_size, mode, ctx);
        let mut queued = 0u64;
        let n_inputs = self.inputs.len();
        let turn_start = clock::now_ns();
        for k in 0..n_inputs {
            if self.phase != Phase::Running {
                break;
            }
            let i = (self.next_input + k) % n_inputs;
            let n = self.readable(i, budget, &mut queued, ctx)?;
            if n == 0 {
                continue;
            }
            progressed = true;
            let read = self.read_input(i, n, turn_start, ctx)?;
            budget -= read.consumed;
            if !self.end_read(read.out_of_time, ctx)? {
                budget = 0;
            }
            self.on_control(i, read.control, ctx)?;
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
        ctx.counters.input_queued.store(queued, Ordering::Relaxed);
        if self.open_inputs == 0 && self.phase == Phase::Running {
            self.end_stream(ctx)?;
            return Ok(TaskPoll::Progress);
        }
        Ok(if progressed { TaskPoll::Progress } else { TaskPoll::Idle })
    }

    fn open(&mut self, ctx: &mut TaskContext) -> Result<(), BoxError> {
        if let Some(ck) = &ctx.ckpt {
            if ck.signals.mode == CheckpointMode::Dedup && self.backup.is_none() {
                self.backup = Some(Box::new(Backup::new(ctx.notified, ck.backup_limit)));
            }
        }
        self.chain.open(ctx)
    }

    fn replayable_from(&self) -> Vec<u64> {
        self.backup.as_ref().map_or_else(Vec::new, |b| b.replayable_from())
    }

    fn take_inputs(&mut self) -> Option<Box<dyn std::any::Any + Send>> {
        self.backup.as_ref()?;
        Some(Box::new(Transplant {
            inputs: std::mem::take(&mut self.inputs),
            backup: self.backup.take(),
            skips: std::mem::take(&mut self.skips),
        }))
    }

    fn resume_inputs(
        &mut self,
        inputs: Box<dyn std::any::Any + Send>,
        checkpoint: u64,
        one_by_one: bool,
        ctx: &mut TaskContext,
    ) -> Result<(), BoxError> {
        let t = inputs
            .downcast::<Transplant<T>>()
            .map_err(|_| "the failed task's inputs are of another record type")?;
        let mut backup = t.backup.ok_or("the failed task kept no dedup backup")?;
        if t.inputs.len() != self.inputs.len() {
            return Err(format!(
                "the failed task had {} inputs, its replacement {}",
                t.inputs.len(),
                self.inputs.len()
            )
            .into());
        }
        let again = backup.since::<T>(checkpoint)?;
        self.inputs = t.inputs;
        // Event time stays the restored checkpoint's (as at its snapshot):
        // the replay hands on the watermarks taken since, in their places,
        // so that event-time operators fire where they did.
        self.open_inputs = self.inputs.iter().filter(|i| !i.ended).count();
        self.skips = t.skips;
        ctx.last_barrier = self
            .inputs
            .iter()
            .map(|i| i.delivered)
            .max()
            .unwrap_or(checkpoint)
            .max(checkpoint);
        for inbox in &mut self.inputs {
            inbox.blocked = false;
        }
        let mut replay = Replay {
            records: std::collections::VecDeque::with_capacity(again.records.len()),
            ids: Vec::with_capacity(again.records.len()),
            one_by_one,
            marks: again.watermarks.into_iter().collect(),
            fed: 0,
        };
        for (input, position, record) in again.records {
            replay.ids.push((input, position));
            replay.records.push_back(record);
        }
        // Even an empty replay is fed at the first poll, once the chain is
        // open: its end applies the ends of input (`end_replay`).
        self.replay = Some(Box::new(replay));
        ctx.replaying_backup = true;
        self.backup = Some(backup);
        Ok(())
    }

    fn failing_record(&self) -> Option<(u32, u64, u64)> {
        self.replaying
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
                if let Some(bytes) = own.operator(POSITIONS_OP as usize) {
                    let positions = Positions::decode(bytes, self.inputs.len(), r.checkpoint)?;
                    for (inbox, (at_barrier, _)) in self.inputs.iter_mut().zip(&positions.channels) {
                        inbox.records = *at_barrier;
                    }
                    let skips = positions.skips();
                    if skips.iter().any(|&k| k > 0) {
                        self.skips = skips;
                    }
                }
                let replay = Replay::decode(own, self.inputs.len(), r.checkpoint)?;
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
    /// The records of every input channel, channel after channel (or, for
    /// a dedup recovery, in the order the failed task took them).
    records: std::collections::VecDeque<T>,
    /// Dedup recovery: each record's `(input, position)`; empty otherwise.
    ids: Vec<(u32, u64)>,
    /// Dedup recovery after an earlier failure in a replay: fed one record
    /// at a time, so that the one that fails is named exactly.
    one_by_one: bool,
    /// Watermarks to hand on: (records of `records` fed before it, input
    /// channel, watermark), in order.
    marks: std::collections::VecDeque<(usize, usize, i64)>,
    /// Records fed so far.
    fed: usize,
}

impl<T: Data> Replay<T> {
    /// The channel state `own` recorded for `inputs` input channels, at
    /// checkpoint `checkpoint`: channel by channel, each in its order (one
    /// of the orders in which the task could have read them).
    fn decode(own: &TaskState, inputs: usize, checkpoint: u64) -> Result<Self, BoxError> {
        let mut replay = Replay {
            records: std::collections::VecDeque::new(),
            ids: Vec::new(),
            one_by_one: false,
            marks: std::collections::VecDeque::new(),
            fed: 0,
        };
        for i in 0..inputs {
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
                .map_err(|e| format!("checkpoint {checkpoint}: input channel {i}: {e}"))?;
            for e in entries {
                match e {
                    Replayed::Record(record) => replay.records.push_back(record),
                    Replayed::Watermark(wm) => replay.marks.push_back((replay.records.len(), i, wm)),
                }
            }
        }
        Ok(replay)
    }
}
