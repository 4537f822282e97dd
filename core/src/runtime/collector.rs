//! The calling convention inside a task: operators fused by chaining pass
//! whole batches to the next operator with one virtual call per batch, and
//! control (barriers, checkpoint notifications, restore) along the same
//! path, in order with the data.
//!
//! Contract of every [`Collector`]:
//! - `collect` takes every record out of the batch it is given (the vector
//!   comes back empty with its capacity kept, so buffers are reused and
//!   nothing allocates in steady state);
//! - `flush` pushes output that could not be handed on (a full ring) and
//!   returns true once nothing is pending; the task reads no new input
//!   while something is pending, which is how backpressure propagates;
//! - `finish` is called once at end-of-stream, after the last `collect`,
//!   and forwards end-of-stream downstream;
//! - `barrier` adds the operator's state to the snapshot, then passes the
//!   barrier on (the chain's end forwards it on every output);
//! - `notify` tells the operator a checkpoint completed (commit) or was
//!   aborted, then passes the notice on;
//! - `restore` loads the operator's state before the first record;
//! - `open` is called once before the job's workers start (after any
//!   restore), on the thread that starts the job, and passed on: a sink
//!   starts its own threads there, so the first record does not pay for
//!   that on a worker;
//! - `watermark` tells the operator event time advanced to `wm` (or, for
//!   [`crate::watermark::IDLE`], that its input went idle); operators with
//!   event-time timers fire them, then pass the watermark on, in order with
//!   the data (the chain's end forwards it on every output);
//! - `tick` is called by a task on a turn in which it got no input (its
//!   source emitted nothing, or its rings were empty), so that a
//!   watermark generator can declare idleness and processing-time timers
//!   fire without input; everything else passes it on.

use std::ops::Range;

use crate::checkpoint::snapshot::{TaskSnapshot, TaskState};
use crate::error::BoxError;
use crate::runtime::context::TaskContext;
use crate::runtime::message::Barrier;

/// A checkpoint outcome, as told to operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Notice {
    /// Every checkpoint up to this id is complete.
    Complete(u64),
    /// This checkpoint was aborted.
    Abort(u64),
}

/// What a task restores from.
pub(crate) struct RestoreCtx<'a> {
    /// This subtask's state at the same parallelism (`None` after rescaling).
    pub(crate) own: Option<&'a TaskState>,
    /// Every subtask's state of this chain in the checkpoint.
    pub(crate) all: &'a [TaskState],
    /// The checkpoint restored from.
    pub(crate) checkpoint: u64,
    /// Key groups owned by this subtask.
    pub(crate) key_groups: Range<usize>,
    /// The event time the operator had reached at the checkpoint (what its
    /// task, or the watermark generator in front of it, had handed it), or
    /// [`crate::watermark::MIN_WATERMARK`] when unknown (a chain restored at
    /// another parallelism, a source chain, a checkpoint of task state
    /// format 1). Event-time operators take it as their watermark, firing
    /// nothing: whatever it completed fired before the checkpoint.
    pub(crate) watermark: i64,
}

impl RestoreCtx<'_> {
    /// The same, with another watermark for the operators further down.
    pub(crate) fn with_watermark(&self, watermark: i64) -> Self {
        RestoreCtx {
            own: self.own,
            all: self.all,
            checkpoint: self.checkpoint,
            key_groups: self.key_groups.clone(),
            watermark,
        }
    }
}

/// Receives batches and control from the previous operator of a chain.
pub(crate) trait Collector<T>: Send {
    fn collect(&mut self, batch: &mut Vec<T>, ctx: &mut TaskContext) -> Result<(), BoxError>;
    fn flush(&mut self, ctx: &mut TaskContext) -> Result<bool, BoxError>;
    fn finish(&mut self, ctx: &mut TaskContext) -> Result<(), BoxError>;
    fn barrier(&mut self, barrier: Barrier, snap: &mut TaskSnapshot, ctx: &mut TaskContext) -> Result<(), BoxError>;
    fn notify(&mut self, notice: Notice, ctx: &mut TaskContext) -> Result<(), BoxError>;
    fn restore(&mut self, r: &RestoreCtx<'_>, ctx: &mut TaskContext) -> Result<(), BoxError>;
    fn watermark(&mut self, wm: i64, ctx: &mut TaskContext) -> Result<(), BoxError>;
    fn tick(&mut self, ctx: &mut TaskContext) -> Result<(), BoxError>;
    /// Nothing to open by default (the end of a chain at an exchange).
    fn open(&mut self, _ctx: &mut TaskContext) -> Result<(), BoxError> {
        Ok(())
    }
}

impl<T> Collector<T> for Box<dyn Collector<T>> {
    #[inline]
    fn collect(&mut self, batch: &mut Vec<T>, ctx: &mut TaskContext) -> Result<(), BoxError> {
        (**self).collect(batch, ctx)
    }
    #[inline]
    fn flush(&mut self, ctx: &mut TaskContext) -> Result<bool, BoxError> {
        (**self).flush(ctx)
    }
    fn finish(&mut self, ctx: &mut TaskContext) -> Result<(), BoxError> {
        (**self).finish(ctx)
    }
    fn barrier(&mut self, barrier: Barrier, snap: &mut TaskSnapshot, ctx: &mut TaskContext) -> Result<(), BoxError> {
        (**self).barrier(barrier, snap, ctx)
    }
    fn notify(&mut self, notice: Notice, ctx: &mut TaskContext) -> Result<(), BoxError> {
        (**self).notify(notice, ctx)
    }
    fn restore(&mut self, r: &RestoreCtx<'_>, ctx: &mut TaskContext) -> Result<(), BoxError> {
        (**self).restore(r, ctx)
    }
    fn watermark(&mut self, wm: i64, ctx: &mut TaskContext) -> Result<(), BoxError> {
        (**self).watermark(wm, ctx)
    }
    fn tick(&mut self, ctx: &mut TaskContext) -> Result<(), BoxError> {
        (**self).tick(ctx)
    }
    fn open(&mut self, ctx: &mut TaskContext) -> Result<(), BoxError> {
        (**self).open(ctx)
    }
}

/// Implements the control methods of a stateless operator whose next
/// collector is the field `next`: everything is passed on unchanged.
macro_rules! forward_control {
    () => {
        crate::runtime::collector::forward_flow!();
        fn barrier(
            &mut self,
            barrier: crate::runtime::message::Barrier,
            snap: &mut crate::checkpoint::snapshot::TaskSnapshot,
            ctx: &mut crate::runtime::context::TaskContext,
        ) -> Result<(), crate::error::BoxError> {
            self.next.barrier(barrier, snap, ctx)
        }
        fn notify(
            &mut self,
            notice: crate::runtime::collector::Notice,
            ctx: &mut crate::runtime::context::TaskContext,
        ) -> Result<(), crate::error::BoxError> {
            self.next.notify(notice, ctx)
        }
        fn restore(
            &mut self,
            r: &crate::runtime::collector::RestoreCtx<'_>,
            ctx: &mut crate::runtime::context::TaskContext,
        ) -> Result<(), crate::error::BoxError> {
            self.next.restore(r, ctx)
        }
        crate::runtime::collector::forward_time!();
    };
}
pub(crate) use forward_control;

/// Implements `flush`, `finish` and `open` of an operator whose next
/// collector is the field `next`: all are passed on.
macro_rules! forward_flow {
    () => {
        fn flush(&mut self, ctx: &mut crate::runtime::context::TaskContext) -> Result<bool, crate::error::BoxError> {
            self.next.flush(ctx)
        }
        fn finish(&mut self, ctx: &mut crate::runtime::context::TaskContext) -> Result<(), crate::error::BoxError> {
            self.next.finish(ctx)
        }
        fn open(&mut self, ctx: &mut crate::runtime::context::TaskContext) -> Result<(), crate::error::BoxError> {
            self.next.open(ctx)
        }
    };
}
pub(crate) use forward_flow;

/// Implements `watermark` and `tick` of an operator without event-time
/// logic whose next collector is the field `next`: both are passed on.
macro_rules! forward_time {
    () => {
        fn watermark(
            &mut self,
            wm: i64,
            ctx: &mut crate::runtime::context::TaskContext,
        ) -> Result<(), crate::error::BoxError> {
            self.next.watermark(wm, ctx)
        }
        fn tick(&mut self, ctx: &mut crate::runtime::context::TaskContext) -> Result<(), crate::error::BoxError> {
            self.next.tick(ctx)
        }
    };
}
pub(crate) use forward_time;
