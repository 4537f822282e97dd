//! The calling convention inside a task: operators fused by chaining pass
//! whole batches to the next operator with one virtual call per batch.
//!
//! Contract of every [`Collector`]:
//! - `collect` takes every record out of the batch it is given (the vector
//!   comes back empty with its capacity kept, so buffers are reused and
//!   nothing allocates in steady state);
//! - `flush` pushes output that could not be handed on (a full ring) and
//!   returns true once nothing is pending; the task reads no new input
//!   while something is pending, which is how backpressure propagates;
//! - `finish` is called once at end-of-stream, after the last `collect`,
//!   and forwards end-of-stream downstream.

use crate::context::TaskContext;
use crate::error::BoxError;

/// Receives batches from the previous operator of a chain.
pub(crate) trait Collector<T>: Send {
    fn collect(&mut self, batch: &mut Vec<T>, ctx: &mut TaskContext) -> Result<(), BoxError>;
    fn flush(&mut self, ctx: &mut TaskContext) -> Result<bool, BoxError>;
    fn finish(&mut self, ctx: &mut TaskContext) -> Result<(), BoxError>;
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
    #[inline]
    fn finish(&mut self, ctx: &mut TaskContext) -> Result<(), BoxError> {
        (**self).finish(ctx)
    }
}
