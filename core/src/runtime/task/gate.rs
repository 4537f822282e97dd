//! An input task's barrier handling, as one state machine ([`Gate`]): the
//! barriers of a checkpoint arrive on every input at different times, and
//! how the task waits for them depends on the mode. Aligned, it blocks each
//! input that delivered the barrier until all have; unaligned, it takes the
//! snapshot at the first barrier, lets it overtake the queued input
//! (found by look-ahead) and records the overtaken records as channel
//! state; at-least-once, it reads on past the barrier until all inputs
//! delivered it. The read loop ([`super::input`]) hands it each barrier
//! it reads ([`InputTask::on_barrier`]) and each end-of-stream, and lets
//! it look ahead, or check the alignment timeout, once per turn.

use std::sync::atomic::Ordering;

use crate::checkpoint::channel::ChannelRecorder;
use crate::checkpoint::signals::Event;
use crate::checkpoint::snapshot::TaskSnapshot;
use crate::checkpoint::CheckpointMode;
use crate::clock;
use crate::data::Data;
use crate::error::BoxError;
use crate::runtime::context::TaskContext;
use crate::runtime::message::{Barrier, Message};

use super::input::{Inbox, InputTask};
use super::{new_snapshot, poll_notices, send_snapshot, snapshot_chain};

/// Records an unaligned task handles per turn while it waits for a
/// triggered checkpoint's barrier: bounds how long a slow chain delays
/// look-ahead (64 records at 20 µs each: about 1 ms).
const UNALIGNED_PROBE_BUDGET: usize = 64;

/// Why a task declines a checkpoint whose barrier an input will never
/// deliver, the final barrier having come there first.
const FINAL_CAME_FIRST: &str = "the final barrier came first on an input: this checkpoint's barrier never will";

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
pub(super) enum Gate {
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

impl Gate {
    /// The checkpoint whose channel state is being recorded, if any.
    #[inline]
    pub(super) fn recording(&self) -> Option<u64> {
        match self {
            Gate::Recording { snap, .. } => Some(snap.id()),
            _ => None,
        }
    }
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

impl<T: Data> InputTask<T> {
    /// The job's checkpointing mode; `None` without checkpointing.
    #[inline]
    pub(super) fn mode(ctx: &TaskContext) -> Option<CheckpointMode> {
        ctx.ckpt.as_ref().map(|c| c.signals.mode)
    }

    /// The barrier work of a turn that comes before the backpressure
    /// check: an unaligned barrier is found and forwarded (overtaking
    /// staged output) even while this task's output is blocked; an aligned
    /// checkpoint past its alignment timeout goes on unaligned.
    #[inline]
    pub(super) fn barriers_before_output(
        &mut self,
        mode: Option<CheckpointMode>,
        ctx: &mut TaskContext,
    ) -> Result<(), BoxError> {
        if mode == Some(CheckpointMode::Unaligned) || matches!(self.gate, Gate::Recording { .. }) {
            poll_notices(&mut *self.chain, ctx)?;
            self.look_ahead(ctx)?;
        } else if mode == Some(CheckpointMode::Aligned) {
            self.check_alignment_timeout(ctx)?;
        }
        Ok(())
    }

    /// Messages to read this turn: `batch_size`, or fewer while an
    /// unaligned checkpoint's barrier is on its way.
    #[inline]
    pub(super) fn turn_budget(&self, batch_size: usize, mode: Option<CheckpointMode>, ctx: &TaskContext) -> usize {
        let mut budget = batch_size;
        if mode == Some(CheckpointMode::Unaligned) && matches!(self.gate, Gate::Idle) {
            let triggered = ctx.ckpt.as_ref().map_or(0, |c| c.signals.triggered());
            if triggered > ctx.last_barrier {
                // A barrier is on its way: take small steps so that
                // look-ahead (once per turn) finds it soon even when the
                // chain is slow per record.
                budget = budget.min(UNALIGNED_PROBE_BUDGET);
            }
        }
        budget
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
            return self.give_up_recording(FINAL_CAME_FIRST.into(), ctx);
        }
        self.finish_recording_if_done(ctx)
    }

    /// Ends recording once the barrier was found in every input; then
    /// collects a final barrier that waited behind it.
    pub(super) fn finish_recording_if_done(&mut self, ctx: &mut TaskContext) -> Result<(), BoxError> {
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
    #[inline]
    pub(super) fn look_ahead(&mut self, ctx: &mut TaskContext) -> Result<(), BoxError> {
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
                            reason: FINAL_CAME_FIRST.into(),
                        });
                    }
                    return self.give_up_recording(FINAL_CAME_FIRST.into(), ctx);
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

    /// Checkpoint `old`, being collected, was given up elsewhere (aborted)
    /// before its barrier reached every input here, and `barrier`, a newer
    /// one, came on input `i`: declines `old` and collects the newer one,
    /// starting with this input.
    fn realign(&mut self, old: u64, i: usize, barrier: Barrier, ctx: &mut TaskContext) -> Result<(), BoxError> {
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

    /// Handles `barrier` from input `i` once more, after the gate was reset.
    fn on_barrier_again(&mut self, i: usize, barrier: Barrier, ctx: &mut TaskContext) -> Result<(), BoxError> {
        self.inputs[i].delivered = barrier.id - 1;
        self.on_barrier(i, barrier, ctx)
    }

    /// Notes `barrier`, read from input `i`, as delivered there, unless it
    /// was handled already. Returns the id that input had delivered before,
    /// and the barrier as the gate handles it; `None` if there is nothing
    /// more to do.
    #[inline]
    fn deliver(&mut self, i: usize, barrier: Barrier, ctx: &TaskContext) -> Option<(u64, Barrier)> {
        let inbox = &mut self.inputs[i];
        if inbox.ahead == Some(barrier.id) {
            // Found earlier by look-ahead and handled then.
            inbox.ahead = None;
            return None;
        }
        if barrier.id <= ctx.last_barrier {
            // An older barrier still queued behind the one look-ahead went
            // on to find (a newer unaligned checkpoint started before this
            // input was read up to it): its checkpoint is taken already.
            return None;
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
        Some((before, barrier))
    }

    /// A barrier read from input `i`, in order with its data.
    pub(super) fn on_barrier(&mut self, i: usize, barrier: Barrier, ctx: &mut TaskContext) -> Result<(), BoxError> {
        let mode = Self::mode(ctx).ok_or("a barrier reached a job without checkpointing")?;
        // Dedup: the channel's position at this barrier.
        self.inputs[i].at_barrier = (barrier.id, self.inputs[i].records);
        let Some((before, barrier)) = self.deliver(i, barrier, ctx) else {
            return Ok(());
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
                    return self.give_up_recording(FINAL_CAME_FIRST.into(), ctx);
                }
                self.finish_recording_if_done(ctx)
            }
            Gate::Recording { snap, .. } if barrier.id > snap.id() => self.subsume(barrier, ctx),
            Gate::Recording { .. } => Ok(()),
            Gate::Idle if !barrier.is_final && (barrier.unaligned || mode == CheckpointMode::Unaligned) => {
                self.start_unaligned(barrier, clock::now_ns(), ctx)
            }
            Gate::Idle => {
                if Self::aligns(mode, ctx) || barrier.is_final {
                    self.inputs[i].blocked = true;
                }
                self.gate = Gate::Collecting {
                    barrier,
                    first_ns: clock::now_ns(),
                };
                self.complete_collecting(ctx)
            }
            Gate::Collecting { barrier: b, .. } if barrier.id > b.id => {
                let old = b.id;
                self.realign(old, i, barrier, ctx)
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
                if Self::aligns(mode, ctx) || barrier.is_final {
                    self.inputs[i].blocked = true;
                }
                self.complete_collecting(ctx)
            }
        }
    }

    /// Whether an input that delivered the barrier being collected waits
    /// for the others: in aligned mode, and in dedup mode where an input's
    /// producer cannot replay in the same order
    /// ([`crate::checkpoint::signals::TaskCheckpointing::align_inputs`]).
    fn aligns(mode: CheckpointMode, ctx: &TaskContext) -> bool {
        mode == CheckpointMode::Aligned
            || (mode == CheckpointMode::Dedup && ctx.ckpt.as_ref().is_some_and(|c| c.align_inputs))
    }

    /// Aligned / at-least-once: snapshot once every input delivered the barrier.
    pub(super) fn complete_collecting(&mut self, ctx: &mut TaskContext) -> Result<(), BoxError> {
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
        // Dedup's inputs went on past the barrier too, but what they
        // delivered until the snapshot is in the state and is dropped from
        // any replay (positions), so event time at the snapshot is the
        // state's: a replacement recovering alone replays the watermarks
        // taken since from there, and its event-time operators fire where
        // they did.
        if Self::mode(ctx).is_some_and(|m| m.snapshots_at_barrier() || m == CheckpointMode::Dedup) {
            snap.state.input_event_time = Some(self.watermarks.checkpoint());
        }
        if Self::mode(ctx) == Some(CheckpointMode::Dedup) {
            // Per channel: records delivered at the barrier, and records
            // whose effect the state holds: those taken, and those of a
            // replay still to drop (taken before an earlier restore).
            let skips = &self.skips;
            let positions = super::dedup::Positions {
                channels: self
                    .inputs
                    .iter()
                    .enumerate()
                    .map(|(k, i)| {
                        debug_assert!(
                            i.ended || i.at_barrier.0 == barrier.id,
                            "every input delivered this barrier last"
                        );
                        let at = if i.at_barrier.0 == barrier.id {
                            i.at_barrier.1
                        } else {
                            i.records
                        };
                        (at, i.records + skips.get(k).copied().unwrap_or(0))
                    })
                    .collect(),
            };
            let encoded = positions.encode();
            ctx.counters
                .dedup_state_bytes
                .store(encoded.len() as u64, Ordering::Relaxed);
            snap.state.operators.push((super::dedup::POSITIONS_OP, encoded));
        }
        let snap = snapshot_chain(&mut *self.chain, barrier, snap, ctx)?;
        if let Some(b) = &mut self.backup {
            b.mark(barrier.id);
            let c = &ctx.counters;
            c.backup_bytes.store(b.bytes() as u64, Ordering::Relaxed);
            c.backup_records.store(b.held_records(), Ordering::Relaxed);
            c.backup_peak_bytes.fetch_max(b.bytes() as u64, Ordering::Relaxed);
            c.backup_overflows.store(b.overflows(), Ordering::Relaxed);
        }
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
    #[inline]
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
}
