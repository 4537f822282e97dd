//! The source task: a chain driven by a [`Source`]. Between two batches it
//! injects the barriers of the checkpoints the coordinator triggered, with
//! the source's offset at that point, so the offset a snapshot holds is
//! exactly where its barrier sits in the stream.

use crate::checkpoint::signals::Event;
use crate::checkpoint::CheckpointMode;
use crate::clock;
use crate::error::BoxError;
use crate::runtime::collector::{Collector, RestoreCtx};
use crate::runtime::context::{SourceContext, TaskContext};
use crate::runtime::message::Barrier;
use crate::runtime::source::{Source, SourcePoll};
use crate::watermark::MAX_WATERMARK;

use super::{common_phase, new_snapshot, poll_notices, send_snapshot, snapshot_chain, Phase, Task, TaskPoll};

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
