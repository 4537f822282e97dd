//! Append-list state: per key, a list of values in append order, each
//! element one slot holding the key, its sequence number and the
//! codec-encoded value. Windows and buffers keep their elements here.

use std::marker::PhantomData;
use std::path::Path;

use rustc_hash::FxHashMap;

use super::arena::Arena;
use super::codec::{Codec, SerdeCodec, StateKey};
use super::handle::{SlotLayout, StateHandle, StateKind};
use super::map::{check_len, read_entry};
use super::options::StoreOptions;
use super::snapshot::SnapshotJob;
use crate::error::Result;

/// The elements of one key: slot offsets in append order.
#[derive(Default)]
struct Elements {
    /// Sequence number of the next append (stored in the slot, so a
    /// restore recovers the order).
    next_seq: u64,
    slots: Vec<u64>,
}

/// Keyed append-list state of one keyed operator subtask: per key, values
/// `V` in append order, encoded by codec `C` into slots of
/// [`StoreOptions::max_value_len`] bytes.
///
/// ```
/// use weir_core::state::{ListStore, StoreOptions};
/// let dir = std::env::temp_dir().join(format!("weir-doc-list-{}", std::process::id()));
/// let mut l: ListStore<String, u64> = ListStore::create(StoreOptions::new(&dir))?;
/// l.append(&"w1".to_string(), &3)?;
/// l.append(&"w1".to_string(), &4)?;
/// assert_eq!(l.get(&"w1".to_string()), vec![3, 4]);
/// assert_eq!(l.clear(&"w1".to_string()), 2);
/// # drop(l); std::fs::remove_dir_all(&dir).ok();
/// # Ok::<(), weir_core::Error>(())
/// ```
pub struct ListStore<K, V, C = SerdeCodec> {
    arena: Arena,
    index: FxHashMap<K, Elements>,
    elements: usize,
    scratch: Vec<u8>,
    _value: PhantomData<fn() -> (V, C)>,
}

impl<K: StateKey, V, C: Codec<V>> ListStore<K, V, C> {
    /// The slot layout of this state for `opts`.
    pub fn layout(opts: &StoreOptions) -> Result<SlotLayout> {
        SlotLayout::compute(
            StateKind::List,
            opts.page_size,
            <(K, u64)>::SLOT_BYTES,
            opts.max_value_len,
            1,
        )
    }

    /// An empty store.
    pub fn create(opts: StoreOptions) -> Result<Self> {
        let layout = Self::layout(&opts)?;
        Ok(Self::with_arena(Arena::create(opts, layout)?))
    }

    fn with_arena(arena: Arena) -> Self {
        ListStore {
            arena,
            index: FxHashMap::default(),
            elements: 0,
            scratch: Vec::new(),
            _value: PhantomData,
        }
    }

    /// Appends `value` to `key`'s list.
    ///
    /// Errors if the encoded value is longer than `max_value_len`.
    ///
    /// # Panics
    ///
    /// If `key` belongs to a key group this store does not own.
    pub fn append(&mut self, key: &K, value: &V) -> Result<()> {
        self.scratch.clear();
        C::encode(value, &mut self.scratch);
        check_len(self.scratch.len(), self.arena.layout.value_bytes as usize)?;
        let kg = self.arena.key_group_of(key);
        assert!(
            self.arena.opts.key_groups.contains(&kg),
            "key of key group {kg} not owned by this store"
        );
        let off = self.arena.alloc_slot(kg);
        let list = match self.index.get_mut(key) {
            Some(list) => list,
            None => self.index.entry(key.clone()).or_default(),
        };
        let seq = list.next_seq;
        list.next_seq += 1;
        list.slots.push(off);
        self.elements += 1;
        let meta = 1 + self.scratch.len() as u32;
        let write_key = |area: &mut [u8]| {
            let (a, b) = area.split_at_mut(K::SLOT_BYTES);
            key.write_slot(a);
            seq.write_slot(b);
        };
        self.arena.write_entry(off, meta, write_key, &self.scratch);
        Ok(())
    }

    /// Calls `f` for every element of `key`'s list, in append order.
    pub fn for_each_in(&self, key: &K, mut f: impl FnMut(V)) {
        if let Some(list) = self.index.get(key) {
            for &off in &list.slots {
                f(self.decode(off));
            }
        }
    }

    /// `key`'s list, in append order (empty if none).
    pub fn get(&self, key: &K) -> Vec<V> {
        let mut out = Vec::new();
        self.for_each_in(key, |v| out.push(v));
        out
    }

    fn decode(&self, off: u64) -> V {
        C::decode(self.arena.entry_value(off)).expect("a value this store encoded (or verified on restore) decodes")
    }

    /// Number of elements in `key`'s list.
    pub fn len_of(&self, key: &K) -> usize {
        self.index.get(key).map_or(0, |l| l.slots.len())
    }

    /// Removes `key`'s list; returns how many elements it had.
    pub fn clear(&mut self, key: &K) -> usize {
        let Some(list) = self.index.remove(key) else { return 0 };
        let kg = self.arena.key_group_of(key);
        for &off in &list.slots {
            self.arena.clear_slot(off);
            self.arena.free_slot(off, kg);
        }
        self.elements -= list.slots.len();
        list.slots.len()
    }

    /// Calls `f` for every key and each of its elements, in append order
    /// per key.
    pub fn for_each(&self, mut f: impl FnMut(&K, V)) {
        for (k, list) in &self.index {
            for &off in &list.slots {
                f(k, self.decode(off));
            }
        }
    }

    /// Number of elements over all keys.
    pub fn len(&self) -> usize {
        self.elements
    }

    /// Whether no key has an element.
    pub fn is_empty(&self) -> bool {
        self.elements == 0
    }

    /// Number of keys with a non-empty list.
    pub fn keys(&self) -> usize {
        self.index.len()
    }

    /// Logical size: allocated pages times page size.
    pub fn state_bytes(&self) -> u64 {
        self.arena.pages() as u64 * self.arena.opts.page_size as u64
    }

    /// The synchronous part of a checkpoint; see [`super::ValueStore::snapshot`].
    pub fn snapshot(&mut self, checkpoint_id: u64) -> SnapshotJob {
        self.arena.snapshot(checkpoint_id)
    }

    /// See [`super::ValueStore::snapshot_inline`].
    pub fn snapshot_inline(&mut self, checkpoint_id: u64) -> StateHandle {
        self.arena.snapshot_inline(checkpoint_id)
    }

    /// The store's pages (for paced inline copies,
    /// [`super::arena::Arena::begin_paced_copy`]).
    pub(crate) fn arena_mut(&mut self) -> &mut super::arena::Arena {
        &mut self.arena
    }

    /// See [`super::ValueStore::full_snapshot_bytes`].
    pub fn full_snapshot_bytes(&self) -> usize {
        self.arena.image_bytes()
    }

    /// See [`super::ValueStore::snapshot_done`].
    pub fn snapshot_done(&mut self, checkpoint_id: u64, completed: bool) {
        self.arena.snapshot_done(checkpoint_id, completed);
    }

    /// See [`super::ValueStore::restore`]; every value is also decoded once.
    pub fn restore(opts: StoreOptions, checkpoint_root: &Path, handles: &[StateHandle]) -> Result<Self> {
        let layout = Self::layout(&opts)?;
        let arena = Arena::restore(opts, layout, checkpoint_root, handles)?;
        let mut store = Self::with_arena(arena);
        let mut found = Vec::new();
        store.arena.rebuild(|off, kg, _| {
            found.push((off, kg));
            Ok(())
        })?;
        let mut seqs: FxHashMap<K, Vec<(u64, u64)>> = FxHashMap::default();
        for (off, kg) in found {
            let ((k, seq), _) = read_entry::<(K, u64), K, V, C>(&store.arena, off, kg, |pair| &pair.0)?;
            seqs.entry(k).or_default().push((seq, off));
        }
        for (k, mut v) in seqs {
            v.sort_unstable();
            let next_seq = v.last().map_or(0, |&(s, _)| s + 1);
            store.elements += v.len();
            let slots = v.into_iter().map(|(_, off)| off).collect();
            store.index.insert(k, Elements { next_seq, slots });
        }
        Ok(store)
    }
}

impl<K, V, C> std::fmt::Debug for ListStore<K, V, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListStore")
            .field("elements", &self.elements)
            .field("pages", &self.arena.pages())
            .finish()
    }
}
