//! Value state: one plain value per key, stored inline in a mapped slot.
//!
//! The slots of each key group form an open-addressing hash table laid
//! over a power-of-two number of that group's pages: linear probing, at
//! most 3/4 full, deletion by backward shift (no tombstones). The key is in
//! the slot, so a lookup touches the slot's cache line and nothing else
//! large: no separate index to miss in, and nothing to rebuild on restore
//! (each page's trailer says which table generation and position it holds).
//! A full table doubles into new pages, the old ones are released for
//! reuse; a restore keeps, per key group, the pages of the newest
//! generation.
//!
//! A store small enough for the core's caches (below
//! [`PREFETCH_FROM_BYTES`] of slots) looks a key up in a slot cache on the
//! heap first ([`super::slot_cache`]): one multiply and one line to the
//! slot's address, where the table's path takes the stable hash, the key
//! group, the page directory and a probe. The table stays the truth; the
//! cache holds addresses only, and a restore starts it empty.

use std::marker::PhantomData;
use std::path::Path;

use rayon::prelude::*;

use super::arena::{Arena, SegPtr, SLOT_HEADER};
use super::codec::{StateKey, StateValue};
use super::handle::{SlotLayout, StateHandle, StateKind};
use super::options::StoreOptions;
use super::slot_cache::{self, SlotCache};
use super::snapshot::SnapshotJob;
use crate::error::{Error, Result};
use crate::state::key_groups::{key_group, stable_hash};

/// The table of one key group: the page at each position.
#[derive(Default)]
struct Table {
    /// Page numbers by position; empty or a power of two long.
    pages: Vec<u32>,
    /// The address and number of each page, for the hot path: one load
    /// finds both.
    ptrs: Vec<(SegPtr, u32)>,
    /// Occupied slots.
    count: usize,
    /// Generation, bumped by every growth (0: no table yet).
    gen: u32,
}

/// A table is grown before it would be more than MAX_LOAD_NUM/MAX_LOAD_DEN
/// full: linear probing stays short (about 2.5 probes for a hit, mostly in
/// the same cache line) while memory stays over half used on average.
const MAX_LOAD_NUM: usize = 3;
const MAX_LOAD_DEN: usize = 4;

/// Where the probe for hash `h` starts: a page position from the low bits
/// and a slot from bits 16..48, both independent of the high bits that
/// chose the key group.
#[inline(always)]
fn home(h: u64, pages: usize, slots_per_page: usize) -> (usize, usize) {
    let page = h as usize & (pages - 1);
    let slot = ((h >> 16) as u32 as u64 * slots_per_page as u64) >> 32;
    (page, slot as usize)
}

/// How many keys [`ValueStore::update_many`] locates (and prefetches) before
/// it updates them: enough misses in flight to cover the memory latency,
/// few enough that the prefetched lines are still in L1 when used.
pub const UPDATE_AHEAD: usize = 16;

/// The size of a store's entries from which [`ValueStore::update_records`]
/// prefetches from the table's home slots, and below which lookups go
/// through the slot cache. Below it the slots a batch touches are mostly in
/// the core's L2 cache (512 KiB on the benchmark machine's EPYC, 1-2 MiB on
/// newer cores), where the table's two-pass groups (locate and store every
/// key's home slot, then load it back) cost more instructions than the
/// misses they hide, and the slot cache's short lookup pays instead. Above
/// it the misses go to L3 or memory, the table's groups pay
/// (docs/notebook/benchmarks-2026-12.md, "Change 4: one pass over a
/// cache-resident store"), and a cache for every key would be as large as
/// an index.
pub(crate) const PREFETCH_FROM_BYTES: usize = 512 << 10;

/// Keys per line of the slot cache when it is sized (four ways a line):
/// at most one a line on average, so that a line rarely holds more keys
/// than ways and a hit is the rule. With more keys a line, full lines
/// forget keys in turn, and the keyed job measured slower
/// (docs/notebook/benchmarks-2026-12.md, "Mapped state: a slot cache on
/// the heap").
const CACHE_KEYS_PER_LINE: usize = 1;

/// The most lines of a slot cache: 512 KiB on the heap per store.
const MAX_CACHE_LINES: usize = 8192;

/// Entries from which lookups go through the slot cache. Below, the
/// table's few slots stay in the core's nearest caches and its probe ends
/// at the home slot, so the cache's own line only adds to the footprint
/// (the keyed job at 500 keys a store measured slower with it:
/// docs/notebook/benchmarks-2026-12.md, "Mapped state: a slot cache on the
/// heap").
const CACHE_FROM_KEYS: usize = 1024;

enum Probe {
    Found(u64),
    Vacant(u64),
}

/// A key's home slot, found ahead of its update ([`ValueStore::update_many`]):
/// what the fast path needs and no more (the page number and offset, needed
/// only by a slot's first write in an epoch, are found again from `h`).
#[derive(Clone, Copy)]
struct Located {
    /// The key's stable hash.
    h: u64,
    /// The home slot's first byte: in the store's `empty` page when the
    /// table has no page yet (null only in [`Located::NONE`], never looked up).
    slot: *mut u8,
    /// Slots of the home page after the home slot.
    left: u32,
}

impl Located {
    const NONE: Located = Located {
        h: 0,
        slot: std::ptr::null_mut(),
        left: 0,
    };
}

/// Asks the processor to start loading the cache line at `p`: a slot's,
/// or a slot-cache line's ([`SlotCache::line_addr`]).
#[inline(always)]
fn prefetch_slot(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint: it never faults, reads nothing into
    // the program and has no effect on memory, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p.cast::<i8>(), std::arch::x86_64::_MM_HINT_T0);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Keyed value state of one keyed operator subtask: per key one `V`,
/// stored inline (no serialization) in memory-mapped pages.
///
/// The hot path [`ValueStore::get_or_default`] finds the key's slot in the
/// slot cache, or else hashes the key and probes its key group's table in
/// the mapped pages, and returns a reference into the slot; it allocates,
/// locks and calls the kernel only when a table grows, when the slot cache
/// is resized, or on the first write to a page after a barrier.
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
    /// Per owned key group (index `kg - key_groups.start`).
    tables: Vec<Table>,
    /// The page directory of the hot path: `stride` entries per table, at
    /// `ti * stride + (h & (stride - 1))` the address of the page at
    /// position `h & (pages - 1)` of table `ti` (a table of fewer pages
    /// than `stride` repeats them; one without pages names `empty`). One
    /// load finds a key's home page, with no table descriptor in between.
    dir: Vec<SegPtr>,
    /// log2 of the directory's entries per table: a power of two, at least
    /// every table's page count.
    dir_shift: u32,
    /// A zeroed page: every slot vacant. The home page of a table without
    /// pages, so that a lookup there finds a vacant slot without a branch.
    empty: Box<[u64]>,
    len: usize,
    slots_per_page: usize,
    page_shift: u32,
    /// Tables grown so far: a slot located before a growth may name a
    /// released page.
    grows: u64,
    /// Entries from which `update_records` prefetches in groups
    /// ([`PREFETCH_FROM_BYTES`] of slots); below it, lookups go through
    /// `cache` first.
    prefetch_from: usize,
    /// Slot addresses of recently used keys, for a store of `cache_from`
    /// to `prefetch_from` entries (`slot_cache`).
    cache: SlotCache,
    /// Entries from which lookups go through `cache` ([`CACHE_FROM_KEYS`]).
    cache_from: usize,
    _types: PhantomData<fn() -> (K, V)>,
}

impl<K: StateKey, V: StateValue> ValueStore<K, V> {
    const OCCUPIED: u32 = 1;
    /// The layout's slot size and value offset as constants of the types,
    /// so the hot path multiplies and adds by immediates.
    const VALUE_OFFSET: usize = (SLOT_HEADER + K::SLOT_BYTES).next_multiple_of(std::mem::align_of::<V>());
    const SLOT_SIZE: usize =
        (Self::VALUE_OFFSET + std::mem::size_of::<V>()).next_multiple_of(if std::mem::align_of::<V>() > 8 {
            std::mem::align_of::<V>()
        } else {
            8
        });

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
        Ok(Self::with_arena(Arena::create(opts, layout)?))
    }

    fn with_arena(arena: Arena) -> Self {
        assert_eq!(
            (Self::SLOT_SIZE, Self::VALUE_OFFSET as u32),
            (arena.layout.slot_size as usize, arena.layout.value_offset)
        );
        let tables: Vec<Table> = arena.opts.key_groups.clone().map(|_| Table::default()).collect();
        let empty = vec![0u64; arena.opts.page_size / 8].into_boxed_slice();
        ValueStore {
            dir: vec![SegPtr(empty.as_ptr() as *mut u8); tables.len()],
            dir_shift: 0,
            empty,
            tables,
            len: 0,
            slots_per_page: arena.layout.slots_per_page(),
            page_shift: arena.opts.page_size.trailing_zeros(),
            grows: 0,
            prefetch_from: PREFETCH_FROM_BYTES / Self::SLOT_SIZE,
            cache: SlotCache::new(slot_cache::MIN_LINES),
            cache_from: CACHE_FROM_KEYS,
            arena,
            _types: PhantomData,
        }
    }

    /// Makes lookups go through the slot cache from `entries` entries on
    /// (tests: the cache's paths on small stores).
    #[cfg(test)]
    pub(crate) fn set_cache_from(&mut self, entries: usize) {
        self.cache_from = entries;
    }

    /// Makes `update_records` prefetch from `entries` entries on (tests:
    /// both of its paths on small stores).
    #[cfg(test)]
    pub(crate) fn set_prefetch_from(&mut self, entries: usize) {
        self.prefetch_from = entries;
    }

    /// The table index of hash `h`.
    ///
    /// # Panics
    ///
    /// If the key group is not this store's (the runtime routed a key
    /// wrongly).
    #[inline(always)]
    fn table_of(&self, h: u64) -> usize {
        let kg = key_group(h, self.arena.opts.max_parallelism);
        let ti = kg.wrapping_sub(self.arena.opts.key_groups.start);
        if ti >= self.tables.len() {
            self.wrong_key_group(kg);
        }
        ti
    }

    #[cold]
    #[inline(never)]
    fn wrong_key_group(&self, kg: usize) -> ! {
        panic!(
            "key of key group {kg} given to a store owning key groups {:?}",
            self.arena.opts.key_groups
        )
    }

    /// Finds `key` (hash `h`) in table `t`, or the vacant slot where it
    /// would go.
    fn probe(&self, t: &Table, h: u64, key: &K) -> Probe {
        let (pi, i) = home(h, t.pages.len(), self.slots_per_page);
        self.probe_from(t, pi, i, key)
    }

    /// Linear probing from slot `i` of table position `pi`.
    fn probe_from(&self, t: &Table, mut pi: usize, mut i: usize, key: &K) -> Probe {
        let mask = t.pages.len() - 1;
        loop {
            if i == self.slots_per_page {
                i = 0;
                pi = (pi + 1) & mask;
            }
            let off = self.arena.slot_offset(t.pages[pi] as usize, i);
            let slot = self.arena.slot(off);
            if slot[4..8] == [0; 4] {
                return Probe::Vacant(off);
            }
            if key.eq_slot(&slot[SLOT_HEADER..SLOT_HEADER + K::SLOT_BYTES]) {
                return Probe::Found(off);
            }
            i += 1;
        }
    }

    #[inline(always)]
    fn find(&self, key: &K) -> Option<(usize, u64)> {
        let h = stable_hash(key);
        let ti = self.table_of(h);
        if let Some(p) = self.fast_find(h, ti, key) {
            return Some((ti, self.home_page_off(h, ti, p).1));
        }
        let t = &self.tables[ti];
        if t.pages.is_empty() {
            return None;
        }
        match self.probe(t, h, key) {
            Probe::Found(off) => Some((ti, off)),
            Probe::Vacant(_) => None,
        }
    }

    /// The home slot of hash `h` in table `ti`: where a lookup starts.
    #[inline(always)]
    fn locate(&self, h: u64, ti: usize) -> Located {
        let stride = 1usize << self.dir_shift;
        let (pi, i) = home(h, stride, self.slots_per_page);
        // SAFETY: `table_of` returned `ti < tables.len()`, and `pi < stride`:
        // the directory holds `tables.len() << dir_shift` entries.
        let base = unsafe { self.dir.get_unchecked((ti << self.dir_shift) | pi) };
        Located {
            h,
            // Slot `i < slots_per_page` of a live page, or of `empty`
            // (`home`; `dir`).
            slot: base.0.wrapping_add(i * Self::SLOT_SIZE),
            left: (self.slots_per_page - 1 - i) as u32,
        }
    }

    /// Writes table `ti`'s entries of the page directory, after its pages
    /// changed; first doubles the directory's stride as often as needed
    /// to cover the table (then every table's entries are written anew).
    fn index_table(&mut self, ti: usize) {
        let n = self.tables[ti].ptrs.len();
        if n > 1usize << self.dir_shift {
            self.dir_shift = n.trailing_zeros();
            self.dir = vec![SegPtr(std::ptr::null_mut()); self.tables.len() << self.dir_shift];
            for t in 0..self.tables.len() {
                self.fill_dir(t);
            }
        } else {
            self.fill_dir(ti);
        }
    }

    fn fill_dir(&mut self, ti: usize) {
        let stride = 1usize << self.dir_shift;
        let empty = SegPtr(self.empty.as_ptr() as *mut u8);
        let ptrs = &self.tables[ti].ptrs;
        for (pi, e) in self.dir[ti * stride..(ti + 1) * stride].iter_mut().enumerate() {
            *e = if ptrs.is_empty() {
                empty
            } else {
                ptrs[pi & (ptrs.len() - 1)].0
            };
        }
    }

    /// The page number and offset of slot address `p`, found by
    /// [`Self::fast_find`] in the home page of hash `h` in table `ti`.
    fn home_page_off(&self, h: u64, ti: usize, p: *mut u8) -> (usize, u64) {
        let t = &self.tables[ti];
        let (pi, _) = home(h, t.ptrs.len(), self.slots_per_page);
        let (base, page) = t.ptrs[pi];
        let at = p as usize - base.0 as usize;
        debug_assert!(at < self.slots_per_page * Self::SLOT_SIZE);
        (page as usize, ((page as u64) << self.page_shift) + at as u64)
    }

    /// The slot of `key` if it lies in its home page at or after its home
    /// slot (nearly all keys do): its page, offset and address. `None`
    /// means "look elsewhere" (the key is absent or its probe run crosses
    /// into the next page), not "absent".
    ///
    /// The hot path of every lookup, written for memory-level parallelism:
    /// one load finds the page, the home slot decides most lookups with
    /// one well-predicted branch, and few enough instructions run that the
    /// processor keeps several updates' cache misses in flight at once.
    /// (Reading the next slot unconditionally costs a second cache miss
    /// whenever it lies in the next line, so it is read only when needed.)
    #[inline(always)]
    fn fast_find(&self, h: u64, ti: usize, key: &K) -> Option<*mut u8> {
        self.find_located(&self.locate(h, ti), key)
    }

    /// [`Self::fast_find`] from a home slot located earlier, with no table
    /// grown since (`grows` unchanged): the pages it names are still the
    /// table's.
    #[inline(always)]
    fn find_located(&self, at: &Located, key: &K) -> Option<*mut u8> {
        let (mut s, mut left) = (at.slot, at.left);
        debug_assert!(!s.is_null(), "a key located by `locate`");
        loop {
            // SAFETY: `s` is a slot of the home page (`left` counts the
            // slots after it): of a live mapping (segments are never
            // unmapped while the store lives, and the page is still this
            // table's: no growth since it was located), or of `empty` (the
            // table has no pages yet; it lives as long as the store, all
            // zeros: vacant). Reading it races with no writer (the task,
            // which holds `&self`, is the only one).
            let occupied = unsafe { s.add(4).cast::<u32>().read() } != 0;
            // SAFETY: as above; the key area lies inside the slot.
            if occupied && key.eq_slot(unsafe { std::slice::from_raw_parts(s.add(SLOT_HEADER), K::SLOT_BYTES) }) {
                return Some(s);
            }
            if !occupied || left == 0 {
                return None;
            }
            left -= 1;
            // SAFETY: `left` was not 0: the next slot is in the page.
            s = unsafe { s.add(Self::SLOT_SIZE) };
        }
    }

    /// Prepares slot `p`, found by [`Self::fast_find`] for hash `h`, for
    /// writing: a stamp check, and the rest off the fast path.
    #[inline(always)]
    fn touch_found(&mut self, h: u64, p: *mut u8) {
        if !self.arena.stamped(p) {
            self.first_touch_found(h, p);
        }
    }

    #[cold]
    #[inline(never)]
    fn first_touch_found(&mut self, h: u64, p: *mut u8) {
        let (page, off) = self.home_page_off(h, self.table_of(h), p);
        self.arena.first_touch(page, off, p);
    }

    /// Asks the processor to start loading `key`'s home slot. A batch of
    /// updates that prefetches a few keys ahead of the one it updates
    /// overlaps their cache misses instead of waiting for each in turn
    /// ([`ValueStore::update_many`] does this for a slice of keys).
    #[inline(always)]
    pub fn prefetch(&self, key: &K) {
        let h = stable_hash(key);
        let kg = key_group(h, self.arena.opts.max_parallelism);
        let ti = kg.wrapping_sub(self.arena.opts.key_groups.start);
        if ti < self.tables.len() {
            prefetch_slot(self.locate(h, ti).slot);
        }
    }

    /// The value of `key`, inserted as `V::default()` if absent, for
    /// updating in place.
    ///
    /// # Panics
    ///
    /// If `key` belongs to a key group this store does not own (the
    /// runtime routed it wrongly), or if the store cannot grow its mapped
    /// files (disk full).
    #[inline(always)]
    pub fn get_or_default(&mut self, key: &K) -> &mut V {
        if self.uses_cache() {
            let p = self.cached_slot(key);
            // SAFETY: as in `get_or_default_hashed`.
            return unsafe { &mut *p.add(Self::VALUE_OFFSET).cast::<V>() };
        }
        self.get_or_default_hashed(stable_hash(key), key)
    }

    /// Calls `f` with each key of `keys` and its value (inserted as
    /// `V::default()` if absent), in order: the same as calling
    /// [`ValueStore::get_or_default`] for each key, but faster on a large
    /// state, because the keys are taken in groups of [`UPDATE_AHEAD`]:
    /// each key of a group is hashed, located and prefetched before the
    /// group's updates, so that their cache misses overlap and each key's
    /// home slot is computed once.
    ///
    /// ```
    /// use weir_core::state::{StoreOptions, ValueStore};
    /// let dir = std::env::temp_dir().join(format!("weir-doc-many-{}", std::process::id()));
    /// let mut counts: ValueStore<u64, u64> = ValueStore::create(StoreOptions::new(&dir))?;
    /// counts.update_many(&[1, 2, 1], |_key, count| *count += 1);
    /// assert_eq!((counts.get(&1), counts.get(&2)), (Some(&2), Some(&1)));
    /// # drop(counts); std::fs::remove_dir_all(&dir).ok();
    /// # Ok::<(), weir_core::Error>(())
    /// ```
    ///
    /// # Panics
    ///
    /// As [`ValueStore::get_or_default`].
    #[inline]
    pub fn update_many(&mut self, keys: &[K], mut f: impl FnMut(&K, &mut V)) {
        self.update_batched(keys.len(), |j| &keys[j], &mut f);
    }

    /// Calls `f` with each record of `records` (drained, in order), its
    /// key `key_of(&record)` and the key's value (inserted as
    /// `V::default()` if absent): [`ValueStore::update_many`] for a batch
    /// of records, with no vector of keys. Each key is computed and hashed
    /// once. The records are taken in groups of [`UPDATE_AHEAD`] whose
    /// slots are prefetched before the group is updated: on a store of
    /// more than 512 KiB of entries (beyond a core's L2 cache) from the
    /// table's home slots, each key kept on the stack between its prefetch
    /// and its update; on a smaller one from the slot cache.
    ///
    /// ```
    /// use weir_core::state::{StoreOptions, ValueStore};
    /// let dir = std::env::temp_dir().join(format!("weir-doc-records-{}", std::process::id()));
    /// let mut sums: ValueStore<u64, u64> = ValueStore::create(StoreOptions::new(&dir))?;
    /// let mut batch = vec![(1, 10), (2, 5), (1, 1)];
    /// sums.update_records(&mut batch, |r: &(u64, u64)| r.0, |_key, sum, r| *sum += r.1);
    /// assert_eq!((sums.get(&1), sums.get(&2), batch.len()), (Some(&11), Some(&5), 0));
    /// # drop(sums); std::fs::remove_dir_all(&dir).ok();
    /// # Ok::<(), weir_core::Error>(())
    /// ```
    ///
    /// # Panics
    ///
    /// As [`ValueStore::get_or_default`].
    #[inline]
    pub fn update_records<T>(
        &mut self,
        records: &mut Vec<T>,
        key_of: impl Fn(&T) -> K,
        mut f: impl FnMut(&K, &mut V, T),
    ) {
        if self.uses_cache() {
            self.update_cached(records, key_of, f);
            return;
        }
        if self.len < self.prefetch_from {
            // A store whose every slot sits in the core's nearest caches:
            // one pass, each key hashed, located and updated in turn.
            for record in records.drain(..) {
                let key = key_of(&record);
                let p = self.get_or_insert_hashed(stable_hash(&key), &key);
                // SAFETY: as in `get_or_default_hashed`.
                f(&key, unsafe { &mut *p.add(Self::VALUE_OFFSET).cast::<V>() }, record);
            }
            return;
        }
        let mut drain = records.drain(..);
        // The keys of the group being applied, taken (not cloned) at the
        // update: `None` outside the group.
        let mut keys: [Option<K>; UPDATE_AHEAD] = [const { None }; UPDATE_AHEAD];
        // Filled once per call, not per group: each group overwrites the
        // entries it reads (an array set per group was a 384-byte memset).
        let mut located = [Located::NONE; UPDATE_AHEAD];
        loop {
            let ahead = drain.as_slice();
            let n = ahead.len().min(UPDATE_AHEAD);
            if n == 0 {
                break;
            }
            for ((at, key), record) in located.iter_mut().zip(keys.iter_mut()).zip(&ahead[..n]) {
                let k = key_of(record);
                *at = self.locate_key(&k);
                *key = Some(k);
            }
            let mut grows = self.grows;
            for (i, key) in keys[..n].iter_mut().enumerate() {
                let record = drain.next().expect("n records are left");
                let key = key.take().expect("located above");
                let p = self.slot_located(&mut located, i, n, &mut grows, &key);
                // SAFETY: as in `get_or_default_hashed`.
                f(&key, unsafe { &mut *p.add(Self::VALUE_OFFSET).cast::<V>() }, record);
            }
        }
    }

    /// [`ValueStore::update_records`] on a store below `prefetch_from`
    /// entries, in groups of [`UPDATE_AHEAD`] records: first each key's
    /// slot cache line is read and the slot it names prefetched, then each
    /// key is updated, mostly from that slot. The slot loads of a group so
    /// overlap instead of each waiting for the last, and the next group's
    /// cache lines are prefetched before this group's updates, so the
    /// line reads rarely wait either (docs/notebook/benchmarks-2026-12.md,
    /// "Mapped state: the next group's cache lines prefetched").
    #[inline(always)]
    fn update_cached<T>(&mut self, records: &mut Vec<T>, key_of: impl Fn(&T) -> K, mut f: impl FnMut(&K, &mut V, T)) {
        let mut drain = records.drain(..);
        let mut hints = [std::ptr::null_mut::<u8>(); UPDATE_AHEAD];
        // The tags of the group being read, computed (and their lines
        // prefetched) while the group before it was updated.
        let mut tags = [0u64; UPDATE_AHEAD];
        for (t, record) in tags.iter_mut().zip(drain.as_slice()) {
            *t = slot_cache::tag(&key_of(record));
        }
        loop {
            let ahead = drain.as_slice();
            let n = ahead.len().min(UPDATE_AHEAD);
            if n == 0 {
                break;
            }
            for (hint, &t) in hints.iter_mut().zip(&tags[..n]) {
                *hint = self.cache.candidate(t);
                prefetch_slot(*hint);
            }
            // The next group's lines start loading now, a group ahead of
            // their candidates' reads.
            for (t, record) in tags.iter_mut().zip(&ahead[n..]) {
                *t = slot_cache::tag(&key_of(record));
                prefetch_slot(self.cache.line_addr(*t));
            }
            // A table's growth (an insert below) moves its slots: the rest
            // of the group's hints may then name released pages.
            let grows = self.grows;
            for &hint in &hints[..n] {
                let record = drain.next().expect("n records are left");
                let key = key_of(&record);
                let p = if !hint.is_null() && self.grows == grows && Self::holds(hint, &key) && self.arena.stamped(hint)
                {
                    hint
                } else {
                    self.cached_slot(&key)
                };
                // SAFETY: as in `get_or_default_hashed`.
                f(&key, unsafe { &mut *p.add(Self::VALUE_OFFSET).cast::<V>() }, record);
            }
        }
    }

    /// The loop of [`ValueStore::update_many`] over `n` keys given by
    /// index: per group of [`UPDATE_AHEAD`] keys, first hash and locate
    /// each key's home slot (prefetching it), then update them in order
    /// from the located slots, so the key-group and table arithmetic runs
    /// once per key and the misses of a group overlap. The located slots
    /// live on the stack: no allocation.
    #[inline(always)]
    fn update_batched<'k>(&mut self, n: usize, key: impl Fn(usize) -> &'k K, mut f: impl FnMut(&K, &mut V))
    where
        K: 'k,
    {
        let mut located = [Located::NONE; UPDATE_AHEAD];
        let mut start = 0;
        while start < n {
            let len = (n - start).min(UPDATE_AHEAD);
            for (j, at) in located[..len].iter_mut().enumerate() {
                *at = self.locate_key(key(start + j));
            }
            let mut grows = self.grows;
            for j in 0..len {
                let k = key(start + j);
                let p = self.slot_located(&mut located, j, len, &mut grows, k);
                // SAFETY: as in `get_or_default_hashed`.
                f(k, unsafe { &mut *p.add(Self::VALUE_OFFSET).cast::<V>() });
            }
            start += len;
        }
    }

    /// Hashes `key`, locates its home slot and prefetches it.
    #[inline(always)]
    fn locate_key(&self, key: &K) -> Located {
        let h = stable_hash(key);
        let at = self.locate(h, self.table_of(h));
        prefetch_slot(at.slot);
        at
    }

    /// The prepared slot of `key`, located as `located[j]` of a group of
    /// `len`, inserted if absent. `grows` is the growth count when the
    /// group was located: a growth (an insert past 3/4) moves the table's
    /// pages, so then the rest of the group is located afresh, off the
    /// fast path (which never grows a table).
    #[inline(always)]
    fn slot_located(
        &mut self,
        located: &mut [Located; UPDATE_AHEAD],
        j: usize,
        len: usize,
        grows: &mut u64,
        key: &K,
    ) -> *mut u8 {
        debug_assert_eq!(*grows, self.grows);
        let at = located[j];
        match self.find_located(&at, key) {
            Some(p) => {
                self.touch_found(at.h, p);
                p
            }
            None => {
                let p = self.get_or_insert_slow(at.h, self.table_of(at.h), key);
                if self.grows != *grows {
                    *grows = self.grows;
                    self.relocate(&mut located[j + 1..len]);
                }
                p
            }
        }
    }

    /// Locates again, after a table grew, the home slots of keys located
    /// before (their hashes and tables stay, their pages moved).
    #[cold]
    #[inline(never)]
    fn relocate(&self, located: &mut [Located]) {
        for at in located {
            *at = self.locate(at.h, self.table_of(at.h));
        }
    }

    /// The prepared slot of `key` (hash `h`), inserted if absent.
    #[inline(always)]
    fn get_or_insert_hashed(&mut self, h: u64, key: &K) -> *mut u8 {
        let ti = self.table_of(h);
        match self.fast_find(h, ti, key) {
            Some(p) => {
                self.touch_found(h, p);
                p
            }
            None => self.get_or_insert_slow(h, ti, key),
        }
    }

    /// Whether lookups go through the slot cache: from `cache_from` to
    /// `prefetch_from` entries.
    #[inline(always)]
    fn uses_cache(&self) -> bool {
        self.len >= self.cache_from && self.len < self.prefetch_from
    }

    /// The prepared slot of `key`, inserted if absent, through the slot
    /// cache: the hot path of a store below `prefetch_from` entries.
    #[inline(always)]
    fn cached_slot(&mut self, key: &K) -> *mut u8 {
        let t = slot_cache::tag(key);
        let hit = self.cache.get(t, |p| Self::holds(p, key));
        match hit {
            Some(p) if self.arena.stamped(p) => p,
            _ => self.cache_miss(t, key, hit.is_some()),
        }
    }

    /// Whether the slot at `p`, named by the slot cache, holds `key`.
    #[inline(always)]
    fn holds(p: *mut u8, key: &K) -> bool {
        // SAFETY: the cache names slots of live pages only (`slot_cache`'s
        // invariants: segments are never unmapped while the store lives,
        // and a table's growth, which releases pages, empties the cache;
        // `update_cached` drops its hints after a growth); the occupancy
        // word and the key area lie inside the slot; only this task writes
        // it.
        unsafe {
            p.add(4).cast::<u32>().read() != 0
                && key.eq_slot(std::slice::from_raw_parts(p.add(SLOT_HEADER), K::SLOT_BYTES))
        }
    }

    /// [`Self::cached_slot`] when the cache did not have `key` (tag `t`)
    /// or its slot needs its first write of the epoch (`cached`): the
    /// table's path, then the cache filled (and first resized, if the
    /// store outgrew it).
    #[cold]
    #[inline(never)]
    fn cache_miss(&mut self, t: u64, key: &K, cached: bool) -> *mut u8 {
        let p = self.get_or_insert_hashed(stable_hash(key), key);
        if !cached {
            let want = (self.len / CACHE_KEYS_PER_LINE)
                .next_power_of_two()
                .clamp(slot_cache::MIN_LINES, self.max_cache_lines());
            if want > self.cache.lines() {
                self.cache.resize(want);
            }
            self.cache.insert(t, p);
        }
        p
    }

    /// The most lines the slot cache takes: enough for `prefetch_from`
    /// keys (above which it is not used), at most [`MAX_CACHE_LINES`].
    fn max_cache_lines(&self) -> usize {
        (self.prefetch_from / CACHE_KEYS_PER_LINE)
            .min(MAX_CACHE_LINES)
            .next_power_of_two()
            .max(slot_cache::MIN_LINES)
    }

    #[inline(always)]
    fn get_or_default_hashed(&mut self, h: u64, key: &K) -> &mut V {
        debug_assert_eq!(h, stable_hash(key));
        let p = self.get_or_insert_hashed(h, key);
        // SAFETY: the slot is occupied by `key` and prepared for writing;
        // its value area is `size_of::<V>()` bytes aligned for `V` (see
        // `SlotLayout::compute`), `V: Pod` is valid for any bytes, and the
        // borrow of `self` keeps the slot from moving or being freed.
        unsafe { &mut *p.add(Self::VALUE_OFFSET).cast::<V>() }
    }

    #[cold]
    #[inline(never)]
    fn get_or_insert_slow(&mut self, h: u64, ti: usize, key: &K) -> *mut u8 {
        let t = &self.tables[ti];
        let off = match t.pages.is_empty() {
            false => match self.probe(t, h, key) {
                Probe::Found(off) => off,
                Probe::Vacant(_) => self.insert(ti, h, key),
            },
            true => self.insert(ti, h, key),
        };
        self.arena.write_slot(off)
    }

    #[cold]
    #[inline(never)]
    fn insert(&mut self, ti: usize, h: u64, key: &K) -> u64 {
        let t = &self.tables[ti];
        if (t.count + 1) * MAX_LOAD_DEN > t.pages.len() * self.slots_per_page * MAX_LOAD_NUM {
            self.grow(ti);
        }
        let Probe::Vacant(off) = self.probe(&self.tables[ti], h, key) else {
            unreachable!("inserting a key that is present")
        };
        let default = V::default();
        self.arena.write_entry(
            off,
            Self::OCCUPIED,
            |area| key.write_slot(area),
            bytemuck::bytes_of(&default),
        );
        self.tables[ti].count += 1;
        self.len += 1;
        off
    }

    /// Doubles table `ti` into new pages and moves every entry over.
    fn grow(&mut self, ti: usize) {
        self.grows += 1;
        // Every slot of the table moves.
        self.cache.clear();
        let kg = self.arena.opts.key_groups.start + ti;
        let old = std::mem::take(&mut self.tables[ti]);
        let n = (old.pages.len() * 2).max(1);
        let gen = old.gen + 1;
        let pages: Vec<u32> = (0..n)
            .map(|pos| self.arena.new_page(kg, gen, pos as u32) as u32)
            .collect();
        let ptrs = pages
            .iter()
            .map(|&p| (SegPtr(self.arena.page_ptr(p as usize)), p))
            .collect();
        self.tables[ti] = Table {
            pages,
            ptrs,
            count: old.count,
            gen,
        };
        self.index_table(ti);
        for &page in &old.pages {
            for i in 0..self.slots_per_page {
                let from = self.arena.slot_offset(page as usize, i);
                if self.arena.slot(from)[4..8] == [0; 4] {
                    continue;
                }
                let key = K::read_slot(self.arena.key_area(from)).expect("an occupied slot holds a valid key");
                let Probe::Vacant(to) = self.probe(&self.tables[ti], stable_hash(&key), &key) else {
                    unreachable!("a key present twice")
                };
                self.arena.copy_slot(from, to);
            }
        }
        for page in old.pages {
            self.arena.release_page(page as usize);
        }
    }

    /// The value of `key`, if present.
    #[inline]
    pub fn get(&self, key: &K) -> Option<&V> {
        let (_, off) = self.find(key)?;
        Some(self.value_at(off))
    }

    fn value_at(&self, off: u64) -> &V {
        let slot = self.arena.slot(off);
        bytemuck::from_bytes(&slot[self.arena.layout.value_offset as usize..][..std::mem::size_of::<V>()])
    }

    /// Removes `key`, returning its value.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        let (ti, off) = self.find(key)?;
        let value = *self.value_at(off);
        self.delete(ti, off);
        Some(value)
    }

    /// Empties the slot at `off` of table `ti`, shifting later entries of
    /// its probe run back so that every key stays reachable from its home.
    fn delete(&mut self, ti: usize, off: u64) {
        let spp = self.slots_per_page;
        let t = &self.tables[ti];
        let cap = t.pages.len() * spp;
        let at = |t: &Table, arena: &Arena, pos: usize| arena.slot_offset(t.pages[pos / spp] as usize, pos % spp);
        let (_, _, page_pos) = self.arena.page_trailer(self.arena.page_of(off));
        let mut hole = page_pos as usize * spp + self.arena.slot_index(off);
        debug_assert_eq!(at(t, &self.arena, hole), off);
        let mut j = (hole + 1) % cap;
        loop {
            let t = &self.tables[ti];
            let oj = at(t, &self.arena, j);
            if self.arena.slot(oj)[4..8] == [0; 4] {
                break;
            }
            let key = K::read_slot(self.arena.key_area(oj)).expect("an occupied slot holds a valid key");
            let (hp, hi) = home(stable_hash(&key), t.pages.len(), spp);
            let home_pos = hp * spp + hi;
            if (j + cap - home_pos) % cap >= (j + cap - hole) % cap {
                let oh = at(t, &self.arena, hole);
                self.arena.copy_slot(oj, oh);
                hole = j;
            }
            j = (j + 1) % cap;
        }
        let oh = at(&self.tables[ti], &self.arena, hole);
        self.arena.clear_slot(oh);
        self.tables[ti].count -= 1;
        self.len -= 1;
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no keys.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Calls `f` for every key and its value, in no particular order.
    pub fn for_each(&self, mut f: impl FnMut(&K, &V)) {
        for t in &self.tables {
            for &page in &t.pages {
                for i in 0..self.slots_per_page {
                    let off = self.arena.slot_offset(page as usize, i);
                    if self.arena.slot(off)[4..8] != [0; 4] {
                        let key = K::read_slot(self.arena.key_area(off)).expect("an occupied slot holds a valid key");
                        f(&key, self.value_at(off));
                    }
                }
            }
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

    /// A full snapshot of checkpoint `checkpoint_id` taken whole, now, on
    /// this thread, carried in the returned handle
    /// ([`StateHandle::inline`]) instead of a file: for small stores, where
    /// copying every page (see [`ValueStore::full_snapshot_bytes`]) costs
    /// less than a job on another thread and a synced file. Restore takes
    /// the handle like any other. It is never the base of an incremental
    /// snapshot: after it completes, the next [`ValueStore::snapshot`] is
    /// full. Report its outcome with [`ValueStore::snapshot_done`].
    pub fn snapshot_inline(&mut self, checkpoint_id: u64) -> StateHandle {
        self.arena.snapshot_inline(checkpoint_id)
    }

    /// The store's pages (for paced inline copies,
    /// [`super::arena::Arena::begin_paced_copy`]).
    pub(crate) fn arena_mut(&mut self) -> &mut super::arena::Arena {
        &mut self.arena
    }

    /// Bytes of a full snapshot of the store now as plain page images with
    /// their record headers, a file header and trailer: the most
    /// [`ValueStore::snapshot_inline`]'s image can take (pages are packed
    /// when that is smaller).
    pub fn full_snapshot_bytes(&self) -> usize {
        self.arena.image_bytes()
    }

    /// Tells the store whether checkpoint `checkpoint_id` completed: a
    /// completed one becomes the base of the next incremental snapshot.
    pub fn snapshot_done(&mut self, checkpoint_id: u64, completed: bool) {
        self.arena.snapshot_done(checkpoint_id, completed);
    }

    /// A store holding the keys of `opts.key_groups` from `handles`, the
    /// handles of every old subtask whose key groups intersect them (all
    /// handles of the checkpoint will do). Every file is verified (sizes,
    /// every page CRC, file CRCs) before use; then each key group's table
    /// is taken from its pages' trailers and every key checked to belong
    /// to its key group.
    pub fn restore(opts: StoreOptions, checkpoint_root: &Path, handles: &[StateHandle]) -> Result<Self> {
        let layout = Self::layout(opts.page_size)?;
        let arena = Arena::restore(opts, layout, checkpoint_root, handles)?;
        let mut store = Self::with_arena(arena);
        let found = store.newest_pages()?;
        store.take_tables(found)?;
        store.count_keys()?;
        Ok(store)
    }

    /// The pages of each key group's newest table generation, as
    /// (position in the table, page); older pages are released.
    fn newest_pages(&mut self) -> Result<Vec<Vec<(u32, u32)>>> {
        // Newest generation per key group; older pages are garbage.
        let start = self.arena.opts.key_groups.start;
        let mut found: Vec<Vec<(u32, u32)>> = vec![Vec::new(); self.tables.len()];
        for page in 0..self.arena.pages() {
            let (kg, gen, pos) = self.arena.page_trailer(page);
            let ti = kg.wrapping_sub(start);
            if ti >= found.len() || gen == 0 {
                return Err(restore_error(format!(
                    "page {page} has key group {kg} and generation {gen}"
                )));
            }
            let t = &mut self.tables[ti];
            if gen > t.gen {
                t.gen = gen;
                found[ti].clear();
            }
            if gen == t.gen {
                found[ti].push((pos, page as u32));
            } else {
                self.arena.release_page(page);
            }
        }
        Ok(found)
    }

    /// Takes each key group's table from its pages, `found` by
    /// [`Self::newest_pages`]: an error unless they make a whole table.
    fn take_tables(&mut self, found: Vec<Vec<(u32, u32)>>) -> Result<()> {
        let start = self.arena.opts.key_groups.start;
        for (ti, mut pages) in found.into_iter().enumerate() {
            pages.sort_unstable();
            let n = pages.len();
            let complete = pages.iter().enumerate().all(|(i, &(pos, _))| pos as usize == i);
            if n > 0 && !(n.is_power_of_two() && complete) {
                return Err(restore_error(format!(
                    "key group {} has an incomplete table of {n} pages",
                    start + ti
                )));
            }
            let t = &mut self.tables[ti];
            t.pages = pages.into_iter().map(|(_, page)| page).collect();
            t.ptrs = t
                .pages
                .iter()
                .map(|&p| (SegPtr(self.arena.page_ptr(p as usize)), p))
                .collect();
            self.index_table(ti);
        }
        Ok(())
    }

    /// Counts the keys of every table, in parallel, checking that each
    /// belongs to its table's key group.
    fn count_keys(&mut self) -> Result<()> {
        let start = self.arena.opts.key_groups.start;
        // Count and check every key, in parallel.
        let maxp = self.arena.opts.max_parallelism;
        let (arena, spp) = (&self.arena, self.slots_per_page);
        let counts: Vec<usize> = self
            .tables
            .par_iter()
            .enumerate()
            .map(|(ti, t)| {
                let mut count = 0;
                for &page in &t.pages {
                    for i in 0..spp {
                        let off = arena.slot_offset(page as usize, i);
                        if arena.slot(off)[4..8] == [0; 4] {
                            continue;
                        }
                        match K::read_slot(arena.key_area(off)) {
                            Some(key) if key_group(stable_hash(&key), maxp) == start + ti => count += 1,
                            _ => {
                                return Err(restore_error(format!(
                                    "a slot of key group {} holds no valid key of this store's key type",
                                    start + ti
                                )))
                            }
                        }
                    }
                }
                Ok(count)
            })
            .collect::<Result<_>>()?;
        for (t, count) in self.tables.iter_mut().zip(counts) {
            t.count = count;
            self.len += count;
        }
        Ok(())
    }

    #[cfg(test)]
    pub(crate) fn arena(&self) -> &Arena {
        &self.arena
    }
}

/// An error restoring value state.
fn restore_error(message: String) -> Error {
    Error::State {
        context: "restoring value state".into(),
        message,
    }
}

impl<K, V> std::fmt::Debug for ValueStore<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ValueStore")
            .field("keys", &self.len)
            .field("pages", &self.arena.pages())
            .finish()
    }
}
