//! Value state: one plain value per key, stored inline in a mapped slot.

use std::marker::PhantomData;
use std::path::Path;

use super::arena::{Arena, SLOT_HEADER};
use super::codec::{StateKey, StateValue};
use super::handle::{SlotLayout, StateHandle, StateKind};
use super::index::{tag_of, SlotIndex};
use super::options::StoreOptions;
use super::snapshot::SnapshotJob;
use crate::error::{Error, Result};
use crate::keyed::{key_group, stable_hash};

/// Keyed value state of one keyed operator subtask: per key one `V`,
/// stored inline (no serialization) in memory-mapped pages.
///
/// The hot path [`ValueStore::get_or_default`] is a hash lookup from key to
/// slot and a pointer into the mapped page; it allocates, locks and calls
/// the kernel only when a key is new (and its key group needs a page) or
/// on the first write to a page after a barrier.
///
/// ```
/// use weir_core::state::{StoreOptions, ValueStore};
/// let dir = std::env::temp_dir().join(format!("weir-doc-value-{}", std::process::id()));
/// let mut counts: ValueStore<u64, u64> = ValueStore::create(StoreOptions::new(&dir))?;
/// *counts.get_or_default(&7) += 2;
/// *counts.get_or_default(&7) += 3;
/// assert_eq!(counts.get(&7), Some(&5));
///
/// // A checkpoint: synchronous part at the barrier, the rest on any thread.
/// let job = counts.snapshot(1);
/// let handle = std::thread::spawn({ let root = dir.join("chk"); move || job.write(&root) }).join().unwrap()?;
/// counts.snapshot_done(1, true);
///
/// let restored: ValueStore<u64, u64> =
///     ValueStore::restore(StoreOptions::new(dir.join("restored")), &dir.join("chk"), &[handle])?;
/// assert_eq!(restored.get(&7), Some(&5));
/// # drop(counts); drop(restored); std::fs::remove_dir_all(&dir).ok();
/// # Ok::<(), weir_core::Error>(())
/// ```
pub struct ValueStore<K, V> {
    arena: Arena,
    /// Key to slot offset; rebuilt from the slots on restore.
    index: SlotIndex,
    _value: PhantomData<fn() -> (K, V)>,
}

impl<K: StateKey, V: StateValue> ValueStore<K, V> {
    const OCCUPIED: u32 = 1;

    /// The slot layout of this key and value type in pages of `page_size`.
    pub fn layout(page_size: usize) -> Result<SlotLayout> {
        SlotLayout::compute(
            StateKind::Value,
            page_size,
            K::SLOT_BYTES,
            std::mem::size_of::<V>(),
            std::mem::align_of::<V>(),
        )
    }

    /// An empty store.
    pub fn create(opts: StoreOptions) -> Result<Self> {
        let layout = Self::layout(opts.page_size)?;
        Ok(ValueStore {
            arena: Arena::create(opts, layout)?,
            index: SlotIndex::with_capacity(0)?,
            _value: PhantomData,
        })
    }

    /// The value of `key`, inserted as `V::default()` if absent, for
    /// updating in place.
    ///
    /// # Panics
    ///
    /// If `key` belongs to a key group this store does not own (the
    /// runtime routed it wrongly), or if the store cannot grow its mapped
    /// files (disk full).
    #[inline]
    pub fn get_or_default(&mut self, key: &K) -> &mut V {
        let tag = tag_of(key);
        let arena = &self.arena;
        let off = match self.index.find(tag, |off| key.eq_slot(arena.key_area(off))) {
            Some(off) => off,
            None => self.insert(key, tag),
        };
        let slot = self.arena.write_slot(off);
        let value_offset = self.arena.layout.value_offset as usize;
        // SAFETY: the slot is occupied by `key` and prepared for writing;
        // its value area is `size_of::<V>()` bytes aligned for `V` (see
        // `SlotLayout::compute`), `V: Pod` is valid for any bytes, and the
        // borrow of `self` keeps the slot from moving or being freed.
        unsafe { &mut *slot.add(value_offset).cast::<V>() }
    }

    #[cold]
    #[inline(never)]
    fn insert(&mut self, key: &K, tag: u32) -> u64 {
        let kg = key_group(stable_hash(key), self.arena.opts.max_parallelism);
        assert!(
            self.arena.opts.key_groups.contains(&kg),
            "key of key group {kg} given to a store owning key groups {:?}",
            self.arena.opts.key_groups
        );
        let off = self.arena.alloc_slot(kg);
        self.arena.write_entry(
            off,
            Self::OCCUPIED,
            |area| key.write_slot(area),
            bytemuck::bytes_of(&V::default()),
        );
        self.index.insert(tag, off);
        off
    }

    /// The value of `key`, if present.
    #[inline]
    pub fn get(&self, key: &K) -> Option<&V> {
        let off = self.find(key)?;
        Some(self.value_at(off))
    }

    #[inline]
    fn find(&self, key: &K) -> Option<u64> {
        self.index
            .find(tag_of(key), |off| key.eq_slot(self.arena.key_area(off)))
    }

    fn value_at(&self, off: u64) -> &V {
        let slot = self.arena.slot(off);
        bytemuck::from_bytes(&slot[self.arena.layout.value_offset as usize..][..std::mem::size_of::<V>()])
    }

    /// Removes `key`, returning its value.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        let arena = &self.arena;
        let off = self.index.remove(tag_of(key), |off| key.eq_slot(arena.key_area(off)))?;
        let value = *self.value_at(off);
        self.arena.clear_slot(off);
        Some(value)
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether there are no keys.
    pub fn is_empty(&self) -> bool {
        self.index.len() == 0
    }

    /// Calls `f` for every key and its value, in no particular order.
    pub fn for_each(&self, mut f: impl FnMut(&K, &V)) {
        for off in self.index.offsets() {
            let key = K::read_slot(self.arena.key_area(off)).expect("an indexed slot holds a valid key");
            f(&key, self.value_at(off));
        }
    }

    /// Logical size: allocated pages times page size.
    pub fn state_bytes(&self) -> u64 {
        self.arena.pages() as u64 * self.arena.opts.page_size as u64
    }

    /// The synchronous part of checkpoint `checkpoint_id`, at the barrier:
    /// closes the current epoch and freezes what the snapshot needs, in
    /// time independent of the state size. Run the returned job's
    /// [`SnapshotJob::write`] on another thread while processing goes on.
    pub fn snapshot(&mut self, checkpoint_id: u64) -> SnapshotJob {
        self.arena.snapshot(checkpoint_id)
    }

    /// Tells the store whether checkpoint `checkpoint_id` completed: a
    /// completed one becomes the base of the next incremental snapshot.
    pub fn snapshot_done(&mut self, checkpoint_id: u64, completed: bool) {
        self.arena.snapshot_done(checkpoint_id, completed);
    }

    /// A store holding the keys of `opts.key_groups` from `handles`, the
    /// handles of every old subtask whose key groups intersect them (all
    /// handles of the checkpoint will do). Every file is verified (sizes,
    /// every page CRC, file CRCs) before use.
    pub fn restore(opts: StoreOptions, checkpoint_root: &Path, handles: &[StateHandle]) -> Result<Self> {
        let layout = Self::layout(opts.page_size)?;
        let mut arena = Arena::restore(opts, layout, checkpoint_root, handles)?;
        let mut index = SlotIndex::with_capacity(arena.count_occupied())?;
        let maxp = arena.opts.max_parallelism;
        arena.rebuild(|off, kg, slot| {
            let key = K::read_slot(&slot[SLOT_HEADER..SLOT_HEADER + K::SLOT_BYTES]);
            match key {
                Some(key) if key_group(stable_hash(&key), maxp) == kg => {
                    index.insert(tag_of(&key), off);
                    Ok(())
                }
                _ => Err(Error::State {
                    context: "restoring value state".into(),
                    message: format!("a slot of key group {kg} holds no valid key of this store's key type"),
                }),
            }
        })?;
        Ok(ValueStore {
            arena,
            index,
            _value: PhantomData,
        })
    }

    #[cfg(test)]
    pub(crate) fn arena(&self) -> &Arena {
        &self.arena
    }
}

impl<K, V> std::fmt::Debug for ValueStore<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ValueStore")
            .field("keys", &self.index.len())
            .field("pages", &self.arena.pages())
            .finish()
    }
}
