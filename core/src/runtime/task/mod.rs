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
//!
//! - this file: the [`Task`] trait, the lifecycle both drivers share
//!   ([`Phase`]) and the steps of a turn common to both;
//! - [`source`]: [`SourceTask`], a chain driven by a source, which injects
//!   the barriers;
//! - [`input`]: [`InputTask`], a chain driven by its input rings
//!   ([`Inbox`]), the per-batch read loop and the replay of restored
//!   channel state;
//! - [`gate`]: an input task's barrier handling, the state machine that
//!   aligns barriers, lets them overtake (unaligned) or passes input on
//!   past them (at-least-once).

pub(crate) mod dedup;
mod gate;
mod input;
mod source;

pub(crate) use input::{Inbox, InputTask};
pub(crate) use source::SourceTask;

use crate::checkpoint::snapshot::{complete, TaskSnapshot};
use crate::clock;
use crate::error::BoxError;
use crate::runtime::collector::{Collector, Notice, RestoreCtx};
use crate::runtime::context::TaskContext;
use crate::runtime::input_watermarks::WatermarkUpdate;
use crate::runtime::message::Barrier;
use crate::watermark::IDLE;

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
    /// Dedup mode: takes the input side (rings and upstream backup) out
    /// of this failed task, for its replacement; `None` for a task that
    /// cannot recover alone.
    fn take_inputs(&mut self) -> Option<Box<dyn std::any::Any + Send>> {
        None
    }
    /// Dedup mode: installs a failed predecessor's input side in this
    /// replacement, restored from `checkpoint`, and queues what the
    /// predecessor took since that checkpoint to be fed again first, in
    /// runs (one record at a time with `one_by_one`).
    fn resume_inputs(
        &mut self,
        _inputs: Box<dyn std::any::Any + Send>,
        _checkpoint: u64,
        _one_by_one: bool,
        _ctx: &mut TaskContext,
    ) -> Result<(), BoxError> {
        Err("this task cannot recover alone".into())
    }
    /// The records being fed again when the task failed during a dedup
    /// recovery: `(input, first position, last position)`.
    fn failing_record(&self) -> Option<(u32, u64, u64)> {
        None
    }
    /// Dedup mode: the checkpoints the task's backup can be replayed from
    /// (empty: none, or no backup).
    fn replayable_from(&self) -> Vec<u64> {
        Vec::new()
    }
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
#[inline]
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
#[inline]
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
#[inline]
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

#[cfg(test)]
mod tests;
