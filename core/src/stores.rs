//! The checkpoint lifecycle of an operator that keeps several state stores
//! of the memory-mapped backend (a window's contents and its timers, the
//! two sides of a join): one synchronous freeze of every store at the
//! barrier, one asynchronous job writing them all, completion and abort
//! passed to each, and restore of each from the handles of any
//! parallelism.

use std::collections::VecDeque;

use crate::checkpoint::snapshot::{AsyncOutput, TaskSnapshot};
use crate::checkpoint::storage::FileRef;
use crate::collector::{Notice, RestoreCtx};
use crate::error::BoxError;
use crate::state::{ListStore, MapStore, SnapshotJob, StateHandle, StoreOptions, ValueStore};

/// A store of the memory-mapped backend, as its operator's lifecycle sees it.
pub(crate) trait Snapshottable {
    fn snapshot(&mut self, checkpoint_id: u64) -> SnapshotJob;
    fn snapshot_inline(&mut self, checkpoint_id: u64) -> StateHandle;
    fn full_snapshot_bytes(&self) -> usize;
    fn snapshot_done(&mut self, checkpoint_id: u64, completed: bool);
}

impl<K: crate::state::StateKey, UK: crate::state::StateKey, V, C: crate::state::Codec<V>> Snapshottable
    for MapStore<K, UK, V, C>
{
    fn snapshot(&mut self, id: u64) -> SnapshotJob {
        MapStore::snapshot(self, id)
    }
    fn snapshot_inline(&mut self, id: u64) -> StateHandle {
        MapStore::snapshot_inline(self, id)
    }
    fn full_snapshot_bytes(&self) -> usize {
        MapStore::full_snapshot_bytes(self)
    }
    fn snapshot_done(&mut self, id: u64, completed: bool) {
        MapStore::snapshot_done(self, id, completed)
    }
}

impl<K: crate::state::StateKey, V, C: crate::state::Codec<V>> Snapshottable for ListStore<K, V, C> {
    fn snapshot(&mut self, id: u64) -> SnapshotJob {
        ListStore::snapshot(self, id)
    }
    fn snapshot_inline(&mut self, id: u64) -> StateHandle {
        ListStore::snapshot_inline(self, id)
    }
    fn full_snapshot_bytes(&self) -> usize {
        ListStore::full_snapshot_bytes(self)
    }
    fn snapshot_done(&mut self, id: u64, completed: bool) {
        ListStore::snapshot_done(self, id, completed)
    }
}

impl<K: crate::state::StateKey, V: crate::state::StateValue> Snapshottable for ValueStore<K, V> {
    fn snapshot(&mut self, id: u64) -> SnapshotJob {
        ValueStore::snapshot(self, id)
    }
    fn snapshot_inline(&mut self, id: u64) -> StateHandle {
        ValueStore::snapshot_inline(self, id)
    }
    fn full_snapshot_bytes(&self) -> usize {
        ValueStore::full_snapshot_bytes(self)
    }
    fn snapshot_done(&mut self, id: u64, completed: bool) {
        ValueStore::snapshot_done(self, id, completed)
    }
}

/// The snapshots an operator's stores took whose outcome they have not
/// been told yet.
#[derive(Debug, Default)]
pub(crate) struct StoreLifecycle {
    pending: VecDeque<u64>,
}

impl StoreLifecycle {
    /// Synchronous part of the barrier. Stores whose full snapshots
    /// together fit the task's inline budget
    /// ([`TaskSnapshot::inline_max`]) are copied whole, now, into the
    /// operator's state, which then goes inline into the manifest with the
    /// rest of the task's state: no job, no file, no sync of their own.
    /// Otherwise every store is frozen and one asynchronous job writes them
    /// all (incrementally) to files.
    pub(crate) fn barrier(
        &mut self,
        stores: &mut [&mut dyn Snapshottable],
        id: u64,
        op: usize,
        snap: &mut TaskSnapshot,
    ) {
        self.pending.push_back(id);
        let whole: usize = stores.iter().map(|s| s.full_snapshot_bytes()).sum();
        if whole <= snap.inline_max {
            let handles: Vec<StateHandle> = stores.iter_mut().map(|s| s.snapshot_inline(id)).collect();
            snap.put_operator(op, postcard::to_stdvec(&handles).expect("state handles always encode"));
            return;
        }
        let jobs: Vec<SnapshotJob> = stores.iter_mut().map(|s| s.snapshot(id)).collect();
        snap.put_async(
            op,
            Box::new(move |root| {
                let mut handles = Vec::with_capacity(jobs.len());
                let mut files = Vec::new();
                let mut state_bytes = 0;
                for job in jobs {
                    // The coordinator fsyncs `shared/` once before the
                    // manifest (`AsyncOutput::wrote_shared`).
                    let h = job.write_deferring_dir_sync(root)?;
                    files.extend(h.files.iter().map(|f| FileRef {
                        path: f.path.clone(),
                        size: f.size,
                        crc32: f.crc32,
                    }));
                    state_bytes += h.state_bytes;
                    handles.push(h);
                }
                Ok(AsyncOutput {
                    state: postcard::to_stdvec(&handles)?,
                    files,
                    state_bytes,
                    wrote_shared: !handles.is_empty(),
                })
            }),
        );
    }

    /// Passes a checkpoint outcome to every store.
    pub(crate) fn notify(&mut self, stores: &mut [&mut dyn Snapshottable], notice: Notice) {
        match notice {
            Notice::Complete(c) => {
                // Only `c` is known complete; earlier ones may have been
                // skipped or aborted: never build on them.
                while let Some(&id) = self.pending.front() {
                    if id > c {
                        break;
                    }
                    self.pending.pop_front();
                    for s in stores.iter_mut() {
                        s.snapshot_done(id, id == c);
                    }
                }
            }
            Notice::Abort(a) => {
                if let Some(i) = self.pending.iter().position(|&id| id == a) {
                    self.pending.remove(i);
                    for s in stores.iter_mut() {
                        s.snapshot_done(a, false);
                    }
                }
            }
        }
    }

    /// The handles of each of `n` stores of operator `op` in the checkpoint,
    /// over every old subtask: `result[i]` restores store `i`.
    pub(crate) fn handles(r: &RestoreCtx<'_>, op: usize, n: usize) -> Result<Vec<Vec<StateHandle>>, BoxError> {
        let mut per_store = vec![Vec::new(); n];
        for old in r.all {
            let Some(bytes) = old.operator(op) else { continue };
            let hs: Vec<StateHandle> = postcard::from_bytes(bytes).map_err(|e| {
                format!(
                    "checkpoint {}: state handles of subtask {} do not decode: {e}",
                    r.checkpoint, old.subtask
                )
            })?;
            if hs.len() != n {
                return Err(format!(
                    "checkpoint {}: operator {op} of subtask {} has {} state stores, this job expects {n}",
                    r.checkpoint,
                    old.subtask,
                    hs.len()
                )
                .into());
            }
            for (i, h) in hs.into_iter().enumerate() {
                per_store[i].push(h);
            }
        }
        Ok(per_store)
    }
}

/// Options of a restored store: those it was built with, for the key
/// groups this subtask owns now.
pub(crate) fn restore_options(opts: &StoreOptions, r: &RestoreCtx<'_>) -> StoreOptions {
    StoreOptions {
        key_groups: r.key_groups.clone(),
        ..opts.clone()
    }
}

/// The checkpoint root a restore of `what` reads from.
pub(crate) fn checkpoint_root(
    ctx: &crate::context::TaskContext,
    what: &str,
) -> Result<std::sync::Arc<std::path::Path>, BoxError> {
    ctx.ckpt
        .as_ref()
        .map(|c| c.root.clone())
        .ok_or_else(|| format!("restoring {what} needs checkpointing").into())
}
