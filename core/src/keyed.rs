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

use std::hash::{Hash, Hasher};

use rustc_hash::FxHashMap;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::checkpoint::snapshot::TaskSnapshot;
use crate::collector::{forward_time, Collector, Notice, RestoreCtx};
use crate::context::TaskContext;
use crate::error::BoxError;
use crate::message::Barrier;

/// Default number of key groups, the most subtasks a keyed operator can
/// ever be rescaled to.
pub const DEFAULT_MAX_PARALLELISM: usize = 128;

/// A 64-bit hasher whose output depends only on the bytes and integers fed
/// to it: stable across runs, processes and platforms, so key-group
/// assignment written into a checkpoint means the same thing after restart.
///
/// Mixing is a multiply-rotate per word and a `fmix64` finaliser, about a
/// nanosecond for an integer key.
#[derive(Debug, Clone, Copy, Default)]
pub struct StableHasher {
    state: u64,
}

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl StableHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.state = (self.state.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for StableHasher {
    #[inline]
    fn finish(&self) -> u64 {
        // murmur3 fmix64: spreads low-entropy keys over all bits.
        let mut h = self.state;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().expect("chunk of 8")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut buf = [0u8; 8];
            buf[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(buf) ^ ((rest.len() as u64) << 56));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
}

/// The stable hash of a key.
///
/// ```
/// assert_eq!(weir_core::keyed::stable_hash(&42u64), weir_core::keyed::stable_hash(&42u64));
/// ```
#[inline]
pub fn stable_hash<K: Hash + ?Sized>(key: &K) -> u64 {
    let mut h = StableHasher::default();
    key.hash(&mut h);
    h.finish()
}

/// The key group of a key hash, in `0..max_parallelism`.
#[inline]
pub fn key_group(hash: u64, max_parallelism: usize) -> usize {
    // Multiply-shift instead of modulo: uniform and division-free.
    ((u128::from(hash) * max_parallelism as u128) >> 64) as usize
}

/// The key groups owned by `subtask` of `parallelism`: a contiguous range.
pub(crate) fn key_group_range(subtask: usize, parallelism: usize, max_parallelism: usize) -> std::ops::Range<usize> {
    let owned = (0..max_parallelism).filter(|&kg| subtask_for_key_group(kg, max_parallelism, parallelism) == subtask);
    let mut range = 0..0;
    for (n, kg) in owned.enumerate() {
        if n == 0 {
            range = kg..kg + 1;
        } else {
            debug_assert_eq!(kg, range.end, "key groups of a subtask are contiguous");
            range.end = kg + 1;
        }
    }
    range
}

/// The subtask, in `0..parallelism`, that owns `key_group`: contiguous
/// ranges of key groups per subtask, so rescaling moves whole ranges.
#[inline]
pub fn subtask_for_key_group(key_group: usize, max_parallelism: usize, parallelism: usize) -> usize {
    debug_assert!(key_group < max_parallelism && parallelism <= max_parallelism);
    key_group * parallelism / max_parallelism
}

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
    pub(crate) _in: std::marker::PhantomData<fn(T)>,
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
    crate::collector::forward_flow!();
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
        snap.put_operator(self.op, postcard::to_stdvec(&entries)?);
        self.next.barrier(barrier, snap, ctx)
    }
    fn notify(&mut self, notice: Notice, ctx: &mut TaskContext) -> Result<(), BoxError> {
        self.next.notify(notice, ctx)
    }
    fn restore(&mut self, r: &RestoreCtx<'_>, ctx: &mut TaskContext) -> Result<(), BoxError> {
        ctx.current_op = self.op;
        self.state.clear();
        for old in r.all {
            let Some(bytes) = old.operator(self.op) else { continue };
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
    pub(crate) lifecycle: crate::stores::StoreLifecycle,
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
    crate::stores::paced_flow!();
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
        let root = crate::stores::checkpoint_root(ctx, "keyed state")?;
        let handles = crate::stores::StoreLifecycle::handles(r, self.op, 1)?.remove(0);
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
