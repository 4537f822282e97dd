//! The checkpoint lifecycle of an operator that keeps several state stores
//! of the memory-mapped backend (a window's contents and its timers, the
//! two sides of a join): one synchronous freeze of every store at the
//! barrier, one asynchronous job writing them all, completion and abort
//! passed to each, and restore of each from the handles of any
//! parallelism.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::checkpoint::snapshot::{AsyncOutput, TaskSnapshot};
use crate::checkpoint::storage::FileRef;
use crate::error::BoxError;
use crate::runtime::collector::{Notice, RestoreCtx};
use crate::state::arena::{Arena, CopySlot, PACED_COPY_PAGES};
use crate::state::{ListStore, MapStore, SnapshotJob, StateHandle, StoreOptions, ValueStore};

/// A store of the memory-mapped backend, as its operator's lifecycle sees it.
pub(crate) trait Snapshottable {
    fn snapshot(&mut self, checkpoint_id: u64) -> SnapshotJob;
    /// The store's pages (for paced copies).
    fn arena(&mut self) -> &mut Arena;
    fn full_snapshot_bytes(&self) -> usize;
    fn snapshot_done(&mut self, checkpoint_id: u64, completed: bool);
}

impl<K: crate::state::StateKey, UK: crate::state::StateKey, V, C: crate::state::Codec<V>> Snapshottable
    for MapStore<K, UK, V, C>
{
    fn snapshot(&mut self, id: u64) -> SnapshotJob {
        MapStore::snapshot(self, id)
    }
    fn arena(&mut self) -> &mut Arena {
        MapStore::arena_mut(self)
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
    fn arena(&mut self) -> &mut Arena {
        ListStore::arena_mut(self)
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
    fn arena(&mut self) -> &mut Arena {
        ValueStore::arena_mut(self)
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
    /// The operator calls [`StoreLifecycle::advance`] at every turn of its
    /// task ([`StoreLifecycle::paced`]): inline copies are taken in steps.
    paced: bool,
    /// A paced copy is going in at least one store.
    copying: bool,
}

/// Implements `flush`, `finish` and `open` of an operator whose stores'
/// lifecycle is the field `lifecycle` ([`StoreLifecycle::paced`]), whose
/// next collector is the field `next`, and which has a method
/// `copy_step(&mut self)` that calls [`StoreLifecycle::advance`] with its
/// stores: `flush` runs at every turn of the task and takes a step of a
/// paced copy going. The operator's `tick` (a turn without input) calls
/// `copy_step()` itself.
macro_rules! paced_flow {
    () => {
        fn flush(&mut self, ctx: &mut crate::runtime::context::TaskContext) -> Result<bool, crate::error::BoxError> {
            if self.lifecycle.copying() {
                self.copy_step();
            }
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
pub(crate) use paced_flow;

/// How long a snapshot job waits for its task's paced copy: the task takes
/// a step at every turn, so this only bounds a task that stopped taking
/// turns without dropping its stores (its checkpoint then fails).
const PACED_COPY_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

impl StoreLifecycle {
    /// The lifecycle of an operator that calls [`StoreLifecycle::advance`]
    /// from its `flush` and `tick` (every turn of its task): its stores'
    /// inline copies are taken in steps after the barrier instead of whole
    /// at it ([`crate::state::arena::Arena::begin_paced_copy`]).
    pub(crate) fn paced() -> Self {
        StoreLifecycle {
            paced: true,
            ..StoreLifecycle::default()
        }
    }

    /// Whether a paced copy is going (then call [`StoreLifecycle::advance`]).
    #[inline]
    pub(crate) fn copying(&self) -> bool {
        self.copying
    }

    /// One step of the paced copies going: [`PACED_COPY_PAGES`] pages in
    /// all, in a turn with input or without. A record that arrives while a
    /// step runs waits for that step only; were a turn without input to
    /// copy every page left, a record arriving then would wait for all of
    /// them (tens of µs: see `PACED_COPY_PAGES`). The copy still ends
    /// within microseconds of the barrier: an idle worker takes a turn per
    /// round, and spins and yields for thousands of rounds before it parks
    /// (and parks for a bounded time, [`crate::threads::idle::MAX_PARK`]).
    #[cold]
    pub(crate) fn advance(&mut self, stores: &mut [&mut dyn Snapshottable]) {
        let mut budget = PACED_COPY_PAGES;
        let mut going = false;
        for s in stores.iter_mut() {
            let arena = s.arena();
            if budget > 0 {
                budget -= arena.advance_paced_copy(budget);
            }
            going |= arena.paced_copy_going();
        }
        self.copying = going;
    }

    /// Synchronous part of the barrier. Stores whose full snapshots
    /// together fit the task's inline budget
    /// ([`TaskSnapshot::inline_max`]) have their pages copied by the task
    /// in steps after the barrier (paced operators) or whole now, and
    /// packed into the operator's state on the snapshot pool; that state
    /// then goes inline into the manifest with the
    /// rest of the task's state: no file, no sync of their own. Otherwise
    /// every store is frozen and one asynchronous job writes them all
    /// (incrementally) to files.
    pub(crate) fn barrier(
        &mut self,
        stores: &mut [&mut dyn Snapshottable],
        id: u64,
        is_final: bool,
        op: usize,
        snap: &mut TaskSnapshot,
    ) {
        self.pending.push_back(id);
        let whole: usize = stores.iter().map(|s| s.full_snapshot_bytes()).sum();
        if whole <= snap.inline_max {
            self.snapshot_inline(stores, id, is_final, op, snap);
        } else {
            snapshot_to_files(stores, id, op, snap);
        }
    }

    /// The stores' snapshot of checkpoint `id`, small enough to go inline:
    /// copied by the task, packed on the snapshot pool.
    fn snapshot_inline(
        &mut self,
        stores: &mut [&mut dyn Snapshottable],
        id: u64,
        is_final: bool,
        op: usize,
        snap: &mut TaskSnapshot,
    ) {
        // Packing and checksumming 10,000 keys' pages takes the task
        // a few hundred µs or more at every barrier, a stall of every
        // record behind it: the task only copies them, and the pool
        // packs the copies, also where the pool has no core of its own
        // (packing on the task also costs it heap trims, `madvise`
        // calls of up to milliseconds; docs/notebook/benchmarks-2026-12.md,
        // "Inline snapshots packed on the pool without a spare core").
        // Copied in steps after the barrier when the operator takes
        // them (not at the final barrier, after which the task may take
        // no more turns), whole now otherwise.
        let slots: Vec<Arc<CopySlot>> = stores.iter_mut().map(|s| s.arena().begin_paced_copy(id)).collect();
        if self.paced && !is_final {
            self.copying = true;
        } else {
            for s in stores.iter_mut() {
                s.arena().complete_paced_copy();
            }
        }
        snap.put_async(
            op,
            Box::new(move |_root| {
                let mut handles = Vec::with_capacity(slots.len());
                for slot in slots {
                    let copy = slot.wait(PACED_COPY_WAIT).ok_or_else(|| {
                        format!(
                            "checkpoint {id}: operator {op}'s task did not finish copying its state \
                             within {PACED_COPY_WAIT:?} of the barrier (it stopped taking turns)"
                        )
                    })?;
                    handles.push(copy.encode());
                }
                Ok(AsyncOutput {
                    state: encode_handles(&handles),
                    files: Vec::new(),
                    // Counted with the task's operator states.
                    state_bytes: 0,
                    wrote_shared: false,
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
            let hs: Vec<StateHandle> = decode_handles(bytes).map_err(|e| {
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

/// The stores' snapshot of checkpoint `id`, frozen now and written
/// (incrementally) to files by one asynchronous job.
fn snapshot_to_files(stores: &mut [&mut dyn Snapshottable], id: u64, op: usize, snap: &mut TaskSnapshot) {
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
                state: encode_handles(&handles),
                files,
                state_bytes,
                wrote_shared: !handles.is_empty(),
            })
        }),
    );
}

/// Prefix of an operator's encoded state handles since handles may carry
/// an inline snapshot ([`StateHandle::inline`]); checkpoints written
/// before hold the handles without that field and no prefix (their first
/// byte is the handle count, 1 to 3, never `W`).
const HANDLES_V2: &[u8; 4] = b"WSH2";

/// A state handle as checkpoints before inline snapshots encoded it.
#[derive(serde::Serialize, serde::Deserialize)]
struct StateHandleV1 {
    checkpoint_id: u64,
    max_parallelism: usize,
    key_groups: std::ops::Range<usize>,
    layout: crate::state::SlotLayout,
    files: Vec<crate::state::StateFile>,
    state_bytes: u64,
    written_bytes: u64,
    sync_micros: u64,
    async_micros: u64,
    full: bool,
}

pub(crate) fn encode_handles(handles: &[StateHandle]) -> Vec<u8> {
    let mut out = HANDLES_V2.to_vec();
    out.extend_from_slice(&postcard::to_stdvec(handles).expect("state handles always encode"));
    out
}

/// Decodes an operator's state handles, in either encoding.
pub(crate) fn decode_handles(bytes: &[u8]) -> Result<Vec<StateHandle>, postcard::Error> {
    if let Some(rest) = bytes.strip_prefix(HANDLES_V2) {
        return postcard::from_bytes(rest);
    }
    let old: Vec<StateHandleV1> = postcard::from_bytes(bytes)?;
    Ok(old
        .into_iter()
        .map(|h| StateHandle {
            checkpoint_id: h.checkpoint_id,
            max_parallelism: h.max_parallelism,
            key_groups: h.key_groups,
            layout: h.layout,
            files: h.files,
            state_bytes: h.state_bytes,
            written_bytes: h.written_bytes,
            sync_micros: h.sync_micros,
            async_micros: h.async_micros,
            full: h.full,
            inline: None,
        })
        .collect())
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
    ctx: &crate::runtime::context::TaskContext,
    what: &str,
) -> Result<std::sync::Arc<std::path::Path>, BoxError> {
    ctx.ckpt
        .as_ref()
        .map(|c| c.root.clone())
        .ok_or_else(|| format!("restoring {what} needs checkpointing").into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{SlotLayout, StateFile, StateKind};

    fn layout() -> SlotLayout {
        SlotLayout {
            kind: StateKind::Value,
            page_size: 4096,
            slot_size: 32,
            key_bytes: 8,
            value_offset: 16,
            value_bytes: 16,
        }
    }

    /// Handles written before inline snapshots (no prefix, no `inline`)
    /// still decode, as file handles; current ones round-trip.
    #[test]
    fn handles_of_both_encodings_decode() {
        let old = |n: u64| StateHandleV1 {
            checkpoint_id: n,
            max_parallelism: 128,
            key_groups: 0..64,
            layout: layout(),
            files: vec![StateFile {
                path: format!("shared/x-c{n}.full.pages"),
                size: 100 + n,
                crc32: 7,
            }],
            state_bytes: 4096,
            written_bytes: 100 + n,
            sync_micros: 1,
            async_micros: 2,
            full: true,
        };
        for count in 1..=3u64 {
            let bytes = postcard::to_stdvec(&(1..=count).map(old).collect::<Vec<_>>()).unwrap();
            let got = decode_handles(&bytes).unwrap();
            assert_eq!(got.len(), count as usize);
            for (i, h) in got.iter().enumerate() {
                assert_eq!(h.checkpoint_id, i as u64 + 1);
                assert_eq!(h.files[0].size, 101 + i as u64);
                assert!(h.inline.is_none() && h.full);
            }
            let mut new = got.clone();
            new[0].inline = Some(vec![1, 2, 3]);
            assert_eq!(decode_handles(&encode_handles(&new)).unwrap(), new);
        }
    }
}
