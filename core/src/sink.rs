//! The contract of a sink: take batches of records, and take part in the
//! checkpoint lifecycle so that output can be committed exactly once.
//!
//! The lifecycle calls are what transactional sinks (write-ahead log,
//! two-phase commit) need: `pre_commit` at the checkpoint barrier,
//! `commit` when the checkpoint is complete, `abort` when it failed.
//! Checkpointing drives them; without checkpoints only `write` and
//! `finish` are called.

use std::sync::{Arc, Mutex};

use crate::context::SinkContext;
use crate::error::BoxError;

/// A consumer of records of type `T`, one instance per parallel subtask.
///
/// ```
/// use weir_core::{BoxError, Sink, SinkContext};
///
/// /// Counts records.
/// #[derive(Default)]
/// struct Count(u64);
///
/// impl Sink<u64> for Count {
///     fn write(&mut self, batch: &mut Vec<u64>, _: &mut SinkContext<'_>) -> Result<(), BoxError> {
///         self.0 += batch.len() as u64;
///         batch.clear();
///         Ok(())
///     }
/// }
/// ```
pub trait Sink<T>: Send + 'static {
    /// Consumes every record of `batch`; the runtime reuses the vector, so
    /// leave it empty (records left in it are dropped).
    fn write(&mut self, batch: &mut Vec<T>, ctx: &mut SinkContext<'_>) -> Result<(), BoxError>;

    /// End of stream: every record has been written; flush and close.
    fn finish(&mut self, _ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
        Ok(())
    }

    /// At the barrier of `checkpoint`: make everything written so far
    /// durable but not yet visible, and return what must be stored in the
    /// checkpoint to commit it later (for example pending transaction ids).
    fn pre_commit(&mut self, _checkpoint: u64) -> Result<Vec<u8>, BoxError> {
        Ok(Vec::new())
    }

    /// `checkpoint` is complete: make the output pre-committed at it and at
    /// every earlier barrier visible (ids may be skipped when checkpoints
    /// complete in quick succession, and output pre-committed for an
    /// aborted checkpoint is committed with the next complete one). Must be
    /// idempotent: recovery may call it again.
    fn commit(&mut self, _checkpoint: u64) -> Result<(), BoxError> {
        Ok(())
    }

    /// `checkpoint` failed: discard what was pre-committed for it.
    fn abort(&mut self, _checkpoint: u64) -> Result<(), BoxError> {
        Ok(())
    }

    /// Recovery from `checkpoint`: `state` is what [`Sink::pre_commit`]
    /// returned at its barrier. Commit that pre-committed output again (it
    /// may or may not have been committed before the failure: commit is
    /// idempotent) and discard anything written after it.
    fn restore(&mut self, _checkpoint: u64, _state: &[u8]) -> Result<(), BoxError> {
        Ok(())
    }
}

/// A sink that appends every record to a shared vector, for tests and
/// examples. It locks once per batch, not per record.
#[derive(Debug)]
pub struct CollectSink<T> {
    out: Arc<Mutex<Vec<T>>>,
}

impl<T> CollectSink<T> {
    /// A sink appending to `out`.
    pub fn new(out: Arc<Mutex<Vec<T>>>) -> Self {
        CollectSink { out }
    }
}

impl<T: Send + 'static> Sink<T> for CollectSink<T> {
    fn write(&mut self, batch: &mut Vec<T>, _: &mut SinkContext<'_>) -> Result<(), BoxError> {
        let mut out = self
            .out
            .lock()
            .map_err(|_| "CollectSink: the shared vector is poisoned")?;
        out.append(batch);
        Ok(())
    }
}

/// A sink that calls a function for every record.
pub struct ForEachSink<F> {
    f: F,
}

impl<F> ForEachSink<F> {
    /// A sink calling `f` on each record.
    pub fn new(f: F) -> Self {
        ForEachSink { f }
    }
}

impl<T, F> Sink<T> for ForEachSink<F>
where
    T: Send + 'static,
    F: FnMut(T) + Send + 'static,
{
    fn write(&mut self, batch: &mut Vec<T>, _: &mut SinkContext<'_>) -> Result<(), BoxError> {
        batch.drain(..).for_each(&mut self.f);
        Ok(())
    }
}
