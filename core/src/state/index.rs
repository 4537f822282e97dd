//! The in-memory index from key to slot of value state.
//!
//! It exists because a general hash map is the wrong shape here: the key
//! already lives in the slot, so the index needs only a hash tag and the
//! slot's offset, 8 bytes per entry. A lookup reads one index entry
//! (usually one cache line) and compares the key in the slot, the cache
//! line the caller touches next anyway; a general map would add a third
//! line for its own copy of the key.
//!
//! Open addressing with linear probing, at most half full, deletion by
//! backward shift (no tombstones). The home position of an entry is the
//! high bits of its 32-bit tag, so growing rehashes from the tags alone,
//! without touching keys. The table lives in an anonymous mapping advised
//! for transparent huge pages: a table of tens of megabytes would
//! otherwise miss the TLB on most lookups.

use std::hash::{Hash, Hasher};

use memmap2::MmapMut;
use rustc_hash::FxHasher;

use crate::error::{Error, Result};

const EMPTY: u64 = 0;
/// Smallest table: 16 entries.
const MIN_BITS: u32 = 4;
/// Largest table: 2^32 entries (the tag's width bounds the home position).
const MAX_BITS: u32 = 32;

/// The 32-bit tag of a key: Fx hash, then a multiply to move entropy into
/// the high bits the home position is taken from.
#[inline(always)]
pub(crate) fn tag_of<K: Hash + ?Sized>(key: &K) -> u32 {
    let mut h = FxHasher::default();
    key.hash(&mut h);
    (h.finish().wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as u32
}

/// An entry: the tag, then the offset in units of 8 bytes plus one (so
/// that offset 0, the first slot of the first page, is not `EMPTY`).
#[inline(always)]
fn entry(tag: u32, off: u64) -> u64 {
    debug_assert!(off & 7 == 0 && off < MAX_ARENA_BYTES);
    u64::from(tag) << 32 | ((off >> 3) + 1)
}

#[inline(always)]
fn entry_tag(e: u64) -> u32 {
    (e >> 32) as u32
}

#[inline(always)]
fn entry_off(e: u64) -> u64 {
    ((e & 0xffff_ffff) - 1) << 3
}

/// An index from key (by tag and a key check) to slot offset.
///
/// Offsets must be multiples of 8 below `MAX_ARENA_BYTES`.
pub(crate) struct SlotIndex {
    table: MmapMut,
    bits: u32,
    len: usize,
}

/// The largest arena an index can address: offsets are stored divided by
/// 8, plus one, in 32 bits.
pub(crate) const MAX_ARENA_BYTES: u64 = (32 << 30) - 8;

fn table(bits: u32) -> Result<MmapMut> {
    let bytes = 8usize << bits;
    let map = MmapMut::map_anon(bytes).map_err(|e| Error::State {
        context: format!("allocating a state index of {bytes} bytes"),
        message: e.to_string(),
    })?;
    // Huge pages only help; a kernel without them is fine.
    #[cfg(target_os = "linux")]
    let _ = map.advise(memmap2::Advice::HugePage);
    Ok(map)
}

impl SlotIndex {
    /// An empty index with room for `n` keys before it grows.
    pub(crate) fn with_capacity(n: usize) -> Result<SlotIndex> {
        let bits = Self::bits_for(n);
        Ok(SlotIndex {
            table: table(bits)?,
            bits,
            len: 0,
        })
    }

    fn bits_for(n: usize) -> u32 {
        let want = n.saturating_mul(2).max(1 << MIN_BITS).next_power_of_two();
        let bits = want.trailing_zeros();
        assert!(bits <= MAX_BITS, "state index of {n} keys exceeds 2^31 keys");
        bits
    }

    #[inline(always)]
    fn slots(&self) -> &[u64] {
        bytemuck::cast_slice(&self.table[..])
    }

    #[inline(always)]
    fn slots_mut(&mut self) -> &mut [u64] {
        bytemuck::cast_slice_mut(&mut self.table[..])
    }

    #[inline(always)]
    fn home(&self, tag: u32) -> usize {
        // bits >= 4, so the shift is below 32.
        (tag >> (32 - self.bits)) as usize
    }

    /// Number of keys.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The offset of the key with `tag` for which `is_key(offset)` holds.
    #[inline(always)]
    pub(crate) fn find(&self, tag: u32, mut is_key: impl FnMut(u64) -> bool) -> Option<u64> {
        let slots = self.slots();
        let mask = slots.len() - 1;
        let mut i = self.home(tag);
        loop {
            let e = slots[i];
            if e == EMPTY {
                return None;
            }
            if entry_tag(e) == tag && is_key(entry_off(e)) {
                return Some(entry_off(e));
            }
            i = (i + 1) & mask;
        }
    }

    /// Adds a key known to be absent.
    ///
    /// # Panics
    ///
    /// If the index cannot grow (no memory for the table).
    pub(crate) fn insert(&mut self, tag: u32, off: u64) {
        assert!(off < MAX_ARENA_BYTES, "state arena exceeds 32 GiB");
        if (self.len + 1) * 2 > self.slots().len() {
            self.grow().unwrap_or_else(|e| panic!("state index cannot grow: {e}"));
        }
        self.place(entry(tag, off));
        self.len += 1;
    }

    fn place(&mut self, e: u64) {
        let mut i = self.home(entry_tag(e));
        let slots = self.slots_mut();
        let mask = slots.len() - 1;
        while slots[i] != EMPTY {
            i = (i + 1) & mask;
        }
        slots[i] = e;
    }

    fn grow(&mut self) -> Result<()> {
        self.rehash(self.bits + 1)
    }

    fn rehash(&mut self, bits: u32) -> Result<()> {
        let old = std::mem::replace(&mut self.table, table(bits)?);
        self.bits = bits;
        for &e in bytemuck::cast_slice::<u8, u64>(&old[..]) {
            if e != EMPTY {
                self.place(e);
            }
        }
        Ok(())
    }

    /// Removes the key with `tag` for which `is_key(offset)` holds;
    /// returns its offset.
    pub(crate) fn remove(&mut self, tag: u32, mut is_key: impl FnMut(u64) -> bool) -> Option<u64> {
        let bits = self.bits;
        let home = |t: u32| (t >> (32 - bits)) as usize;
        let slots = self.slots_mut();
        let mask = slots.len() - 1;
        let mut i = home(tag);
        let off = loop {
            let e = slots[i];
            if e == EMPTY {
                return None;
            }
            if entry_tag(e) == tag && is_key(entry_off(e)) {
                break entry_off(e);
            }
            i = (i + 1) & mask;
        };
        // Backward shift: pull later entries of the probe run into the
        // hole unless that would move them before their home.
        let mut hole = i;
        let mut j = (i + 1) & mask;
        loop {
            let e = slots[j];
            if e == EMPTY {
                break;
            }
            let h = home(entry_tag(e));
            if (j.wrapping_sub(h) & mask) >= (j.wrapping_sub(hole) & mask) {
                slots[hole] = e;
                hole = j;
            }
            j = (j + 1) & mask;
        }
        slots[hole] = EMPTY;
        self.len -= 1;
        Some(off)
    }

    /// Every offset in the index, in table order.
    pub(crate) fn offsets(&self) -> impl Iterator<Item = u64> + '_ {
        self.slots().iter().filter(|&&e| e != EMPTY).map(|&e| entry_off(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        /// Against a HashMap, with tags forced to collide (few distinct
        /// tags) so that probe runs, wrap-around and backward shifts occur.
        #[test]
        fn behaves_like_a_map(ops in proptest::collection::vec((0u64..200, any::<bool>()), 1..2000), tag_bits in 0u32..6) {
            let mut index = SlotIndex::with_capacity(0).unwrap();
            let mut model: HashMap<u64, u64> = HashMap::new();
            let tag = |k: u64| if tag_bits == 0 { u32::MAX } else { tag_of(&k) >> (32 - tag_bits) << (32 - tag_bits) };
            // The "slot" of key k is offset 8 * k; is_key checks it.
            for (k, insert) in ops {
                let off = 8 * k;
                let found = index.find(tag(k), |o| o == off);
                prop_assert_eq!(found, model.get(&k).copied());
                if insert {
                    if found.is_none() {
                        index.insert(tag(k), off);
                        model.insert(k, off);
                    }
                } else {
                    prop_assert_eq!(index.remove(tag(k), |o| o == off), model.remove(&k));
                }
                prop_assert_eq!(index.len(), model.len());
            }
            for (k, off) in &model {
                prop_assert_eq!(index.find(tag(*k), |o| o == *off), Some(*off));
            }
            let mut all: Vec<u64> = index.offsets().collect();
            all.sort_unstable();
            let mut want: Vec<u64> = model.values().copied().collect();
            want.sort_unstable();
            prop_assert_eq!(all, want);
        }
    }

    #[test]
    fn capacity_avoids_growth_and_growth_keeps_entries() {
        let mut index = SlotIndex::with_capacity(10_000).unwrap();
        let bits = index.bits;
        for k in 0..10_000u64 {
            index.insert(tag_of(&k), k * 8);
        }
        assert_eq!(index.bits, bits, "no growth within the capacity asked for");
        for k in 10_000..50_000u64 {
            index.insert(tag_of(&k), k * 8);
        }
        assert!(index.bits > bits);
        for k in 0..50_000u64 {
            assert_eq!(index.find(tag_of(&k), |o| o == k * 8), Some(k * 8));
        }
    }
}
