//! The contract of a sink: take batches of records, and take part in the
//! checkpoint lifecycle so that output can be committed exactly once.
//!
//! The lifecycle calls are what transactional sinks (write-ahead log,
//! two-phase commit) need: `pre_commit` at the checkpoint barrier,
//! `commit` when the checkpoint is complete, `abort` when it failed.
//! Checkpointing drives them; without checkpoints only `write` and
//! `finish` are called.
//!
//! ## Never block the worker
//!
//! Every call of a sink runs on a worker thread, which runs other tasks in
//! turn: a sink that waits there for the disk (a `write`, an `fsync`, a
//! database commit) delays every record on that core. A sink that does I/O
//! hands it to a thread of its own, an [`crate::threads::io_thread::IoThread`]:
//!
//! - `write` copies or moves the batch into a bounded buffer and submits
//!   it; [`Sink::ready`] takes the replies and returns false while too much
//!   is in flight, which backpressures the task like a full ring (nothing
//!   dropped, memory bounded); give the thread [`SinkContext::waker`] so a
//!   completion wakes the worker;
//! - at the barrier, [`Sink::pre_commit_detached`] submits the sync and
//!   returns [`PreCommit::with_sync`] (or [`PreCommit::deferred`] when the
//!   state itself comes from the thread) with a job that waits for it: the
//!   runtime runs the job on the snapshot pool and acknowledges the
//!   checkpoint only after it succeeded;
//! - `commit`, `abort` and `finish` submit requests and return; after
//!   `finish`, the task ends once `ready` returns true, when everything
//!   finished.
//!
//! weir-io's sinks all work this way;
//! `docs/design/architecture.md#sinks-own-threads` shows where each one's
//! I/O runs.

use std::sync::{Arc, Mutex};

use crate::error::BoxError;
use crate::runtime::context::SinkContext;

/// The disk waits of a pre-commit, detached from the worker thread: it runs
/// on the snapshot pool, and the checkpoint is acknowledged only after it
/// returned `Ok`. An error declines (aborts) the checkpoint; the sink must
/// then refuse to commit anything that relied on it (see
/// [`Sink::pre_commit_detached`]).
pub type SyncJob = Box<dyn FnOnce() -> Result<(), BoxError> + Send>;

/// A pre-commit whose state is only known once its work is done (it comes
/// from the sink's own thread): runs like a [`SyncJob`] and returns what
/// the checkpoint stores.
pub type StateJob = Box<dyn FnOnce() -> Result<Vec<u8>, BoxError> + Send>;

/// What [`Sink::pre_commit_detached`] returns: the state the checkpoint
/// stores for the sink, now or from a job run off the worker.
pub struct PreCommit {
    kind: PreCommitKind,
}

enum PreCommitKind {
    Done(Vec<u8>),
    Sync(Vec<u8>, SyncJob),
    Deferred(StateJob),
}

impl PreCommit {
    /// Durable already: the checkpoint stores `state`.
    pub fn done(state: Vec<u8>) -> Self {
        PreCommit {
            kind: PreCommitKind::Done(state),
        }
    }

    /// The checkpoint stores `state` once `sync` succeeded; `sync` runs off
    /// the worker thread.
    pub fn with_sync(state: Vec<u8>, sync: SyncJob) -> Self {
        PreCommit {
            kind: PreCommitKind::Sync(state, sync),
        }
    }

    /// The checkpoint stores what `job` returns; `job` runs off the worker
    /// thread.
    pub fn deferred(job: StateJob) -> Self {
        PreCommit {
            kind: PreCommitKind::Deferred(job),
        }
    }

    /// Whether work is left to a job.
    pub fn is_detached(&self) -> bool {
        !matches!(self.kind, PreCommitKind::Done(_))
    }

    /// Runs the job, if any, on this thread and returns the state: for a
    /// sink's blocking [`Sink::pre_commit`], tools and tests, never on a
    /// worker.
    pub fn wait(self) -> Result<Vec<u8>, BoxError> {
        match self.into_job() {
            Ok(state) => Ok(state),
            Err(job) => job(),
        }
    }

    /// The state now, or the job that produces it.
    pub(crate) fn into_job(self) -> Result<Vec<u8>, StateJob> {
        match self.kind {
            PreCommitKind::Done(state) => Ok(state),
            PreCommitKind::Sync(state, sync) => Err(Box::new(move || {
                sync()?;
                Ok(state)
            })),
            PreCommitKind::Deferred(job) => Err(job),
        }
    }
}

impl std::fmt::Debug for PreCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            PreCommitKind::Done(s) => format!("done, {} bytes", s.len()),
            PreCommitKind::Sync(s, _) => format!("{} bytes after a sync", s.len()),
            PreCommitKind::Deferred(_) => "deferred".to_string(),
        };
        write!(f, "PreCommit({kind})")
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
///
/// A sink that writes files or a database does its I/O on a thread of its
/// own (see the module docs and [`crate::threads::io_thread`]).
pub trait Sink<T>: Send + 'static {
    /// Consumes every record of `batch`; the runtime reuses the vector, so
    /// leave it empty (records left in it are dropped). Must not wait for
    /// I/O: copy or move the records into a buffer of the sink's own thread.
    /// `write` may be called several times between two calls of
    /// [`Sink::ready`] (one scheduling turn's output, bounded by the batch
    /// size and what the operators before the sink emit per record).
    fn write(&mut self, batch: &mut Vec<T>, ctx: &mut SinkContext<'_>) -> Result<(), BoxError>;

    /// Whether the sink can take more records now. The runtime asks before
    /// it reads input for the sink's task and after each batch: false
    /// backpressures the task like a full ring (it reads no input, the
    /// worker runs its other tasks or parks, and asks again; a sink's
    /// thread wakes it through [`SinkContext::waker`]). After `finish`, the
    /// task ends only once this returns true: a sink can finish
    /// asynchronously. Asked every scheduling turn, so keep it cheap; it is
    /// also where a sink takes its thread's replies and records their
    /// latencies. The default is always ready.
    fn ready(&mut self, _ctx: &mut SinkContext<'_>) -> Result<bool, BoxError> {
        Ok(true)
    }

    /// Called once before the job's workers start (after
    /// [`Sink::restore`], if the job restores), on the thread that starts
    /// or restarts the job: start the sink's own threads (and queue their
    /// first requests, such as opening files) here, so that the first
    /// record does not pay for that on a worker. The default does nothing.
    fn open(&mut self, _ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
        Ok(())
    }

    /// End of stream: every record has been written; flush and close (or
    /// submit that work, and return true from [`Sink::ready`] once done).
    fn finish(&mut self, _ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
        Ok(())
    }

    /// At the barrier of `checkpoint`: make everything written so far
    /// durable but not yet visible, and return what must be stored in the
    /// checkpoint to commit it later (for example pending transaction ids).
    /// This blocking form is what the default
    /// [`Sink::pre_commit_detached`] calls; a sink with a thread of its own
    /// implements `pre_commit_detached` instead, and this as
    /// `self.pre_commit_detached(checkpoint)?.wait()`.
    fn pre_commit(&mut self, _checkpoint: u64) -> Result<Vec<u8>, BoxError> {
        Ok(Vec::new())
    }

    /// What the runtime calls at the barrier of `checkpoint`: the same as
    /// [`Sink::pre_commit`], except that the waits (an `fsync`, the sink's
    /// thread catching up) may be left to a job ([`PreCommit::with_sync`],
    /// [`PreCommit::deferred`]) that runs on another thread while this sink
    /// goes on taking records (of the next epoch). The default calls
    /// `pre_commit` and leaves nothing.
    ///
    /// A sink that detaches its sync must not let later calls depend on it
    /// having succeeded: the job's error only declines the checkpoint, so
    /// `commit` of a later checkpoint (which commits an aborted
    /// checkpoint's output too) must first make sure that output is
    /// durable, and fail if its sync failed. The runtime may also drop the
    /// job unrun when it gives the checkpoint up early (an unaligned
    /// checkpoint subsumed by a newer one): the next checkpoint's job must
    /// then cover what it left. (A job that only waits for a request of the
    /// sink's own thread, which runs every request in order and fails for
    /// good on the first error, has both properties by construction.) A
    /// sink that wraps another must forward this method, or the inner
    /// sink's syncs run on the worker.
    fn pre_commit_detached(&mut self, checkpoint: u64) -> Result<PreCommit, BoxError> {
        Ok(PreCommit::done(self.pre_commit(checkpoint)?))
    }

    /// `checkpoint` is complete: make the output pre-committed at it and at
    /// every earlier barrier visible (ids may be skipped when checkpoints
    /// complete in quick succession, and output pre-committed for an
    /// aborted checkpoint is committed with the next complete one). Must be
    /// idempotent: recovery may call it again. Must not wait for I/O:
    /// submit the commit to the sink's thread.
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
    /// idempotent) and discard anything written after it. Runs before the
    /// job's workers start, on the thread that starts or restarts the job:
    /// blocking here is fine.
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
