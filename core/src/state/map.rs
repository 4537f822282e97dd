//! Map state: per key, a map from user key to value, each entry one slot
//! holding the key, the user key and the codec-encoded value.

use std::marker::PhantomData;
use std::path::Path;

use rustc_hash::FxHashMap;

use super::arena::{Arena, SLOT_HEADER};
use super::codec::{Codec, SerdeCodec, StateKey};
use super::handle::{SlotLayout, StateHandle, StateKind};
use super::options::StoreOptions;
use super::snapshot::SnapshotJob;
use super::user_map::UserMap;
use crate::error::{Error, Result};
use crate::state::key_groups::{key_group, stable_hash};

/// Checks an encoded value against the slot's room.
pub(crate) fn check_len(len: usize, max: usize) -> Result<()> {
    if len > max {
        return Err(Error::State {
            context: "writing keyed state".into(),
            message: format!("encoded value of {len} bytes exceeds max_value_len ({max})"),
        });
    }
    Ok(())
}

/// Reads back a slot of a codec store during restore: the slot key (whose
/// first part `primary` picks is the state's key, which must belong to key
/// group `kg`) and the decoded value, or an error if the slot is not one of
/// this store.
pub(crate) fn read_entry<K: StateKey, P: StateKey, V, C: Codec<V>>(
    arena: &Arena,
    off: u64,
    kg: usize,
    primary: impl Fn(&K) -> &P,
) -> Result<(K, V)> {
    let slot = arena.slot(off);
    let bad = |what: &str| Error::State {
        context: "restoring keyed state".into(),
        message: format!("a slot of key group {kg} holds {what}"),
    };
    let meta = u32::from_le_bytes(slot[4..8].try_into().expect("4 bytes")) as usize;
    if meta - 1 > arena.layout.value_bytes as usize {
        return Err(bad("a value longer than the value area"));
    }
    let key = K::read_slot(&slot[SLOT_HEADER..SLOT_HEADER + K::SLOT_BYTES]).ok_or_else(|| bad("no valid key"))?;
    if key_group(stable_hash(primary(&key)), arena.opts.max_parallelism) != kg {
        return Err(bad("a key of another key group"));
    }
    let value = C::decode(arena.entry_value(off)).ok_or_else(|| bad("a value its codec cannot decode"))?;
    Ok((key, value))
}

/// Adds `(key, user_key)` at slot `off` to `index`; the pair is absent.
fn index_new<K: StateKey, UK: StateKey>(index: &mut FxHashMap<K, UserMap<UK>>, key: &K, user_key: &UK, off: u64) {
    match index.get_mut(key) {
        Some(m) => m.insert_new(user_key.clone(), off),
        None => {
            index.insert(key.clone(), UserMap::One(user_key.clone(), off));
        }
    }
}

/// Keyed map state of one keyed operator subtask: per key, a map from
/// user key `UK` to value `V`, encoded by codec `C` into slots of
/// [`StoreOptions::max_value_len`] bytes.
///
/// ```
/// use weir_core::state::{MapStore, StoreOptions};
/// let dir = std::env::temp_dir().join(format!("weir-doc-map-{}", std::process::id()));
/// let mut m: MapStore<u64, u32, String> = MapStore::create(StoreOptions::new(&dir))?;
/// m.put(&1, &10, &"ten".to_string())?;
/// m.put(&1, &20, &"twenty".to_string())?;
/// assert_eq!(m.get(&1, &20).as_deref(), Some("twenty"));
/// assert_eq!(m.len(), 2);
/// assert_eq!(m.clear(&1), 2);
/// # drop(m); std::fs::remove_dir_all(&dir).ok();
/// # Ok::<(), weir_core::Error>(())
/// ```
pub struct MapStore<K, UK, V, C = SerdeCodec> {
    arena: Arena,
    index: FxHashMap<K, UserMap<UK>>,
    entries: usize,
    scratch: Vec<u8>,
    _value: PhantomData<fn() -> (V, C)>,
}

impl<K: StateKey, UK: StateKey, V, C: Codec<V>> MapStore<K, UK, V, C> {
    /// The slot layout of this state for `opts`.
    pub fn layout(opts: &StoreOptions) -> Result<SlotLayout> {
        SlotLayout::compute(
            StateKind::Map,
            opts.page_size,
            <(K, UK)>::SLOT_BYTES,
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
        MapStore {
            arena,
            index: FxHashMap::default(),
            entries: 0,
            scratch: Vec::new(),
            _value: PhantomData,
        }
    }

    /// Sets `user_key` of `key`'s map to `value`.
    ///
    /// Errors if the encoded value is longer than `max_value_len`.
    ///
    /// # Panics
    ///
    /// If `key` belongs to a key group this store does not own.
    pub fn put(&mut self, key: &K, user_key: &UK, value: &V) -> Result<()> {
        self.scratch.clear();
        C::encode(value, &mut self.scratch);
        check_len(self.scratch.len(), self.arena.layout.value_bytes as usize)?;
        let existing = self.index.get(key).and_then(|m| m.get(user_key));
        let off = match existing {
            Some(off) => off,
            None => {
                let kg = self.arena.key_group_of(key);
                assert!(
                    self.arena.opts.key_groups.contains(&kg),
                    "key of key group {kg} not owned by this store"
                );
                let off = self.arena.alloc_slot(kg);
                index_new(&mut self.index, key, user_key, off);
                self.entries += 1;
                off
            }
        };
        let meta = 1 + self.scratch.len() as u32;
        let pair = (key, user_key);
        self.arena.write_entry(
            off,
            meta,
            |area| {
                let (a, b) = area.split_at_mut(K::SLOT_BYTES);
                pair.0.write_slot(a);
                pair.1.write_slot(b);
            },
            &self.scratch,
        );
        Ok(())
    }

    /// The value of `user_key` in `key`'s map.
    pub fn get(&self, key: &K, user_key: &UK) -> Option<V> {
        let off = self.index.get(key)?.get(user_key)?;
        Some(self.decode(off))
    }

    fn decode(&self, off: u64) -> V {
        C::decode(self.arena.entry_value(off)).expect("a value this store encoded (or verified on restore) decodes")
    }

    /// Removes `user_key` from `key`'s map; whether it was there.
    pub fn remove(&mut self, key: &K, user_key: &UK) -> bool {
        let Some(map) = self.index.get_mut(key) else {
            return false;
        };
        let removed = map.remove(user_key);
        if map.is_empty_after(removed) {
            self.index.remove(key);
        }
        let Some(off) = removed else { return false };
        let kg = self.arena.key_group_of(key);
        self.arena.clear_slot(off);
        self.arena.free_slot(off, kg);
        self.entries -= 1;
        true
    }

    /// Removes `key`'s whole map; returns how many entries it had.
    pub fn clear(&mut self, key: &K) -> usize {
        let Some(map) = self.index.remove(key) else { return 0 };
        let kg = self.arena.key_group_of(key);
        for (_, off) in map.iter() {
            self.arena.clear_slot(off);
            self.arena.free_slot(off, kg);
        }
        self.entries -= map.len();
        map.len()
    }

    /// Calls `f` with every user key of `key`'s map (values not decoded),
    /// in no particular order.
    pub fn user_keys_in(&self, key: &K, mut f: impl FnMut(&UK)) {
        if let Some(map) = self.index.get(key) {
            map.iter().for_each(|(uk, _)| f(uk));
        }
    }

    /// Calls `f` with every user key and value of `key`'s map, in no
    /// particular order.
    pub fn for_each_in(&self, key: &K, mut f: impl FnMut(&UK, V)) {
        if let Some(map) = self.index.get(key) {
            for (uk, off) in map.iter() {
                f(uk, self.decode(off));
            }
        }
    }

    /// Calls `f` for every entry of every key.
    pub fn for_each(&self, mut f: impl FnMut(&K, &UK, V)) {
        for (k, map) in &self.index {
            for (uk, off) in map.iter() {
                f(k, uk, self.decode(off));
            }
        }
    }

    /// Number of entries over all keys.
    pub fn len(&self) -> usize {
        self.entries
    }

    /// Whether no key has an entry.
    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// Number of keys with a non-empty map.
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
        let mut index: FxHashMap<K, UserMap<UK>> = FxHashMap::default();
        let mut entries = 0;
        let arena = &mut store.arena;
        let mut found = Vec::new();
        arena.rebuild(|off, kg, _| {
            found.push((off, kg));
            Ok(())
        })?;
        for (off, kg) in found {
            let ((k, uk), _) = read_entry::<(K, UK), K, V, C>(arena, off, kg, |pair| &pair.0)?;
            if index.get(&k).is_some_and(|m| m.get(&uk).is_some()) {
                return Err(Error::State {
                    context: "restoring keyed state".into(),
                    message: format!("two slots of key group {kg} hold the same key and user key"),
                });
            }
            index_new(&mut index, &k, &uk, off);
            entries += 1;
        }
        store.index = index;
        store.entries = entries;
        Ok(store)
    }
}

impl<K, UK, V, C> std::fmt::Debug for MapStore<K, UK, V, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MapStore")
            .field("entries", &self.entries)
            .field("pages", &self.arena.pages())
            .finish()
    }
}
