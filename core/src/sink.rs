//! The contract of a sink: take batches of records, and take part in the
//! checkpoint lifecycle so that output can be committed exactly once.
//!
//! The lifecycle calls are what transactional sinks (write-ahead log,
//! two-phase commit) need: `pre_commit` at the checkpoint barrier,
//! `commit` when the checkpoint is complete, `abort` when it failed.
//! Checkpointing drives them; without checkpoints only `write` and
//! `finish` are called.
//!
//! A pre-commit usually ends in disk waits (fsyncs). A sink may hand those
//! back as a [`SyncJob`] from [`Sink::pre_commit_detached`]: the runtime
//! runs it on the snapshot pool and acknowledges the checkpoint only after
//! it succeeded, so the worker goes on processing records meanwhile
//! instead of waiting for the disk at every barrier.

use std::sync::{Arc, Mutex};

use crate::context::SinkContext;
use crate::error::BoxError;

/// The disk waits of a pre-commit, detached from the worker thread: it runs
/// on the snapshot pool, and the checkpoint is acknowledged only after it
/// returned `Ok`. An error declines (aborts) the checkpoint; the sink must
/// then refuse to commit anything that relied on it (see
/// [`Sink::pre_commit_detached`]).
pub type SyncJob = Box<dyn FnOnce() -> Result<(), BoxError> + Send>;

/// What [`Sink::pre_commit_detached`] returns.
pub struct PreCommit {
    /// What the checkpoint stores, as [`Sink::pre_commit`] returns it.
    pub state: Vec<u8>,
    /// Work left to make the pre-commit durable, run off the worker thread
    /// before the checkpoint is acknowledged; `None` if nothing is left.
    pub sync: Option<SyncJob>,
}

impl std::fmt::Debug for PreCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreCommit")
            .field("state_bytes", &self.state.len())
            .field("sync", &self.sync.is_some())
            .finish()
    }
}

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

    /// What the runtime calls at the barrier of `checkpoint`: the same as
    /// [`Sink::pre_commit`], except that the disk waits may be left to the
    /// returned [`PreCommit::sync`], which runs on another thread while
    /// this sink goes on taking records (of the next epoch). The default
    /// calls `pre_commit` and leaves nothing.
    ///
    /// A sink that detaches its sync must not let later calls depend on it
    /// having succeeded: the job's error only declines the checkpoint, so
    /// `commit` of a later checkpoint (which commits an aborted
    /// checkpoint's output too) must first make sure that output is
    /// durable, and fail if its sync failed. The runtime may also drop the
    /// job unrun when it gives the checkpoint up early (an unaligned
    /// checkpoint subsumed by a newer one): the next checkpoint's job must
    /// then cover what it left. A sink that wraps another must forward
    /// this method, or the inner sink's syncs run on the worker.
    fn pre_commit_detached(&mut self, checkpoint: u64) -> Result<PreCommit, BoxError> {
        Ok(PreCommit {
            state: self.pre_commit(checkpoint)?,
            sync: None,
        })
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
