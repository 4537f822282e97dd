//! Keys, key groups and keyed processing with per-key state.
//!
//! Every key hashes, with a hash that is stable across processes and
//! platforms, to one of `max_parallelism` key groups (default
//! [`DEFAULT_MAX_PARALLELISM`]); a key group belongs to exactly one subtask
//! of a keyed operator, the contiguous range formula below. State is owned
//! per key group so that a checkpoint taken at one parallelism can be
//! restored at another.
//!
//! Two keyed operators: [`crate::KeyedStream::process`] keeps plain
//! (`bytemuck::Pod`) per-key values in the memory-mapped state backend
//! ([`crate::state::ValueStore`]: asynchronous, incremental snapshots);
//! [`crate::KeyedStream::process_heap`] keeps any serde type in an
//! in-memory hash map, snapshotted whole at each barrier.

use std::hash::Hash;

use rustc_hash::FxHashMap;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::checkpoint::snapshot::TaskSnapshot;
use crate::error::BoxError;
use crate::runtime::collector::{forward_time, Collector, Notice, RestoreCtx};
use crate::runtime::context::TaskContext;
use crate::runtime::message::Barrier;

pub use crate::state::key_groups::{
    key_group, stable_hash, subtask_for_key_group, StableHasher, DEFAULT_MAX_PARALLELISM,
};

/// Where a keyed function sends its results.
///
/// ```
/// # use weir_core::Output;
/// // Output is handed to keyed process functions; they call `emit`.
/// fn running_sum(sum: &mut i64, v: i64, out: &mut Output<i64>) {
///     *sum += v;
///     out.emit(*sum);
/// }
/// ```
#[derive(Debug)]
pub struct Output<O> {
    pub(crate) buf: Vec<O>,
}

impl<O> Output<O> {
    /// Sends one record downstream.
    #[inline]
    pub fn emit(&mut self, record: O) {
        self.buf.push(record);
    }
}

/// A keyed process operator with in-memory per-key state.
pub(crate) struct KeyedProcess<T, K, S, O, KF, F> {
    pub(crate) max_parallelism: usize,
    pub(crate) key_fn: KF,
    pub(crate) f: F,
    pub(crate) state: FxHashMap<K, S>,
    pub(crate) out: Output<O>,
    pub(crate) next: Box<dyn Collector<O>>,
    pub(crate) op: usize,
    /// `process` on the heap backend: its operator state starts with
    /// [`HEAP_STATE_TAG`], so that a restore by the other backend is refused
    /// by name instead of misread (`process_heap` writes no tag).
    pub(crate) tagged: bool,
    pub(crate) _in: std::marker::PhantomData<fn(T)>,
}

/// First byte of the keyed state `process` writes on the heap backend; the
/// mapped backend's state handles never start with it.
pub(crate) const HEAP_STATE_TAG: u8 = b'H';

impl<T, K, S, O, KF, F> KeyedProcess<T, K, S, O, KF, F> {
    /// The operator of one subtask, with empty state, handing its results
    /// to `next`; `tagged` as for [`KeyedProcess::tagged`].
    pub(crate) fn new(
        max_parallelism: usize,
        batch_size: usize,
        key_fn: KF,
        f: F,
        next: Box<dyn Collector<O>>,
        tagged: bool,
    ) -> Self {
        KeyedProcess {
            max_parallelism,
            key_fn,
            f,
            state: FxHashMap::default(),
            out: Output {
                buf: Vec::with_capacity(batch_size),
            },
            next,
            op: 0,
            tagged,
            _in: std::marker::PhantomData,
        }
    }
}

impl<T, K, S, O, KF, F> Collector<T> for KeyedProcess<T, K, S, O, KF, F>
where
    K: Hash + Eq + Send + Serialize + DeserializeOwned,
    S: Default + Send + Serialize + DeserializeOwned,
    O: Send,
    KF: Fn(&T) -> K + Send,
    F: FnMut(&K, &mut S, T, &mut Output<O>) + Send,
{
    #[inline]
    fn collect(&mut self, batch: &mut Vec<T>, ctx: &mut TaskContext) -> Result<(), BoxError> {
        ctx.current_op = self.op;
        for record in batch.drain(..) {
            let key = (self.key_fn)(&record);
            // One lookup for known keys; the key is moved, never cloned.
            match self.state.get_mut(&key) {
                Some(state) => (self.f)(&key, state, record, &mut self.out),
                None => {
                    let mut state = S::default();
                    (self.f)(&key, &mut state, record, &mut self.out);
                    self.state.insert(key, state);
                }
            }
        }
        self.next.collect(&mut self.out.buf, ctx)
    }
    crate::runtime::collector::forward_flow!();
    fn barrier(&mut self, barrier: Barrier, snap: &mut TaskSnapshot, ctx: &mut TaskContext) -> Result<(), BoxError> {
        ctx.current_op = self.op;
        // Entries tagged with their key group, so that a restore at another
        // parallelism can pick the ones it owns.
        let maxp = self.max_parallelism;
        let entries: Vec<(u32, &K, &S)> = self
            .state
            .iter()
            .map(|(k, s)| (key_group(stable_hash(k), maxp) as u32, k, s))
            .collect();
        let mut bytes = Vec::new();
        if self.tagged {
            bytes.push(HEAP_STATE_TAG);
        }
        let bytes = postcard::to_extend(&entries, bytes)?;
        snap.put_operator(self.op, bytes);
        self.next.barrier(barrier, snap, ctx)
    }
    fn notify(&mut self, notice: Notice, ctx: &mut TaskContext) -> Result<(), BoxError> {
        self.next.notify(notice, ctx)
    }
    fn restore(&mut self, r: &RestoreCtx<'_>, ctx: &mut TaskContext) -> Result<(), BoxError> {
        ctx.current_op = self.op;
        self.state.clear();
        for old in r.all {
            let Some(mut bytes) = old.operator(self.op) else {
                continue;
            };
            if self.tagged {
                let Some(rest) = bytes.strip_prefix(&[HEAP_STATE_TAG]) else {
                    return Err(format!(
                        "checkpoint {}: the keyed state of subtask {} was written by the mapped state \
                         backend; restore it with RuntimeConfig::state_backend = StateBackend::Mapped",
                        r.checkpoint, old.subtask
                    )
                    .into());
                };
                bytes = rest;
            }
            let entries: Vec<(u32, K, S)> = postcard::from_bytes(bytes).map_err(|e| {
                format!(
                    "checkpoint {}: keyed state of subtask {} does not decode: {e}",
                    r.checkpoint, old.subtask
                )
            })?;
            for (kg, k, s) in entries {
                if r.key_groups.contains(&(kg as usize)) {
                    self.state.insert(k, s);
                }
            }
        }
        self.next.restore(r, ctx)
    }
    forward_time!();
}

/// A plain (`Pod`) state value kept by [`KeyedProcess`] on the heap
/// backend: encoded in checkpoints as its bytes, so that `process` needs no
/// serde for its state type on either backend.
#[derive(Default, Clone, Copy)]
pub(crate) struct PodCell<S>(pub(crate) S);

impl<S: bytemuck::Pod> Serialize for PodCell<S> {
    fn serialize<Ser: serde::Serializer>(&self, serializer: Ser) -> Result<Ser::Ok, Ser::Error> {
        serializer.serialize_bytes(bytemuck::bytes_of(&self.0))
    }
}

impl<'de, S: bytemuck::Pod> serde::Deserialize<'de> for PodCell<S> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let bytes: &[u8] = serde_bytes::deserialize(deserializer)?;
        if bytes.len() != std::mem::size_of::<S>() {
            return Err(serde::de::Error::invalid_length(
                bytes.len(),
                &"the size of the state type",
            ));
        }
        Ok(PodCell(bytemuck::pod_read_unaligned(bytes)))
    }
}

/// A keyed process operator whose per-key state lives in the memory-mapped
/// state backend: a plain value inline in a mapped page, snapshotted
/// asynchronously and incrementally.
pub(crate) struct MappedKeyedProcess<T, K, S, O, KF, F> {
    pub(crate) store: Option<crate::state::ValueStore<K, S>>,
    pub(crate) opts: crate::state::StoreOptions,
    pub(crate) key_fn: KF,
    pub(crate) f: F,
    pub(crate) out: Output<O>,
    pub(crate) next: Box<dyn Collector<O>>,
    pub(crate) op: usize,
    /// Snapshots taken whose outcome the store has not been told yet.
    pub(crate) lifecycle: crate::operators::stores::StoreLifecycle,
    pub(crate) _in: std::marker::PhantomData<fn(T)>,
}

impl<T, K, S, O, KF, F> Collector<T> for MappedKeyedProcess<T, K, S, O, KF, F>
where
    K: crate::state::StateKey,
    S: crate::state::StateValue,
    O: Send,
    KF: Fn(&T) -> K + Send,
    F: FnMut(&K, &mut S, T, &mut Output<O>) + Send,
{
    #[inline]
    fn collect(&mut self, batch: &mut Vec<T>, ctx: &mut TaskContext) -> Result<(), BoxError> {
        ctx.current_op = self.op;
        let store = self.store.as_mut().expect("the store exists from construction to drop");
        // `update_records` computes each record's key once and prefetches
        // its slot several records ahead, so that the cache misses of
        // several updates overlap.
        let (f, out) = (&mut self.f, &mut self.out);
        store.update_records(batch, &self.key_fn, |key, state, record| f(key, state, record, out));
        self.next.collect(&mut self.out.buf, ctx)
    }
    crate::operators::stores::paced_flow!();
    fn barrier(&mut self, barrier: Barrier, snap: &mut TaskSnapshot, ctx: &mut TaskContext) -> Result<(), BoxError> {
        ctx.current_op = self.op;
        // Synchronous part: freeze the pages changed since the last
        // completed snapshot. The rest runs on the snapshot pool.
        let store = self.store.as_mut().expect("the store exists from construction to drop");
        self.lifecycle
            .barrier(&mut [store], barrier.id, barrier.is_final, self.op, snap);
        self.next.barrier(barrier, snap, ctx)
    }
    fn notify(&mut self, notice: Notice, ctx: &mut TaskContext) -> Result<(), BoxError> {
        let store = self.store.as_mut().expect("the store exists from construction to drop");
        self.lifecycle.notify(&mut [store], notice);
        self.next.notify(notice, ctx)
    }
    fn restore(&mut self, r: &RestoreCtx<'_>, ctx: &mut TaskContext) -> Result<(), BoxError> {
        ctx.current_op = self.op;
        if let Some(old) = r
            .all
            .iter()
            .find(|o| o.operator(self.op).is_some_and(|b| b.first() == Some(&HEAP_STATE_TAG)))
        {
            return Err(format!(
                "checkpoint {}: the keyed state of subtask {} was written by the heap state backend; \
                 restore it with RuntimeConfig::state_backend = StateBackend::Heap",
                r.checkpoint, old.subtask
            )
            .into());
        }
        let root = crate::operators::stores::checkpoint_root(ctx, "keyed state")?;
        let handles = crate::operators::stores::StoreLifecycle::handles(r, self.op, 1)?.remove(0);
        // The empty store made at construction gives way to the restored one.
        drop(self.store.take());
        let opts = crate::state::StoreOptions {
            key_groups: r.key_groups.clone(),
            ..self.opts.clone()
        };
        self.store = Some(crate::state::ValueStore::restore(opts, &root, &handles)?);
        self.next.restore(r, ctx)
    }
    fn watermark(&mut self, wm: i64, ctx: &mut TaskContext) -> Result<(), BoxError> {
        self.next.watermark(wm, ctx)
    }
    fn tick(&mut self, ctx: &mut TaskContext) -> Result<(), BoxError> {
        if self.lifecycle.copying() {
            self.copy_step();
        }
        self.next.tick(ctx)
    }
}

impl<T, K: crate::state::StateKey, S: crate::state::StateValue, O, KF, F> MappedKeyedProcess<T, K, S, O, KF, F> {
    /// A step of the paced state copy (`StoreLifecycle::advance`).
    #[cold]
    fn copy_step(&mut self) {
        let store = self.store.as_mut().expect("the store exists from construction to drop");
        self.lifecycle.advance(&mut [store]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn hash_is_stable_across_releases() {
        // Pinned values: if these change, checkpoints taken by an older
        // build would restore keys into the wrong key groups.
        assert_eq!(stable_hash(&1u64), 0x37e8_d294_6949_7cd2);
        assert_eq!(stable_hash(&123_456_789u64), 0x1a27_0db6_5611_5438);
        assert_eq!(stable_hash("weir"), 0x27ea_4ef6_9a8c_1de1);
        assert_eq!(stable_hash("weir"), stable_hash(&String::from("weir")));
    }

    #[test]
    fn key_groups_cover_all_subtasks_evenly() {
        let maxp = DEFAULT_MAX_PARALLELISM;
        for p in 1..=8 {
            let mut counts = vec![0usize; p];
            for kg in 0..maxp {
                counts[subtask_for_key_group(kg, maxp, p)] += 1;
            }
            let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            assert!(max - min <= 1, "p={p}: {counts:?}");
        }
    }

    proptest! {
        #[test]
        fn key_group_in_range(hash: u64, maxp in 1usize..4096) {
            prop_assert!(key_group(hash, maxp) < maxp);
        }

        #[test]
        fn sequential_keys_spread(start in 0u64..1_000_000) {
            let mut counts = [0usize; 8];
            for k in start..start + 8000 {
                counts[key_group(stable_hash(&k), 8)] += 1;
            }
            for c in counts { prop_assert!(c > 700 && c < 1300, "{counts:?}"); }
        }
    }
}
