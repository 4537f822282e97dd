//! The value store's slot cache: from a key's in-process hash to the
//! address of its slot, on the heap, for a store small enough to sit in
//! the core's caches.
//!
//! It exists because a lookup in the mapped table is a long chain for a
//! small state: the stable hash (three multiplies), the key group, the
//! page directory, then a linear probe whose length the processor cannot
//! predict (docs/benchmarks.md, "Mapped state against a hash map" and
//! "Mapped state: a slot cache on the heap"). Here a lookup is one
//! multiply (FxHash, as the heap backend's map uses), one 64-byte line of
//! four `(tag, address)` ways, and the slot's own load, which the update
//! needs anyway. A miss takes the table's path and fills the cache.
//!
//! It is a cache, not an index: it may forget any key at any time (a full
//! line replaces a way; a table's growth empties it), and the table stays
//! the only truth. Nothing of it is written to a checkpoint, and a
//! restored store starts with it empty.
//!
//! # Invariants
//!
//! - A way's tag is 0 (empty) or odd: the key's hash with its low bit set
//!   ([`tag`]).
//! - A way's address is a slot of a page of one of the store's live
//!   tables (not a released page). The store keeps this true: a table's
//!   growth moves its slots to new pages and releases the old ones, and
//!   empties the cache ([`SlotCache::clear`]); nothing else releases a
//!   table's page or moves a page while the store lives (segments are
//!   never unmapped, a snapshot's copy-on-write leaves the live page in
//!   place).
//! - So a way may be stale (a removal's backward shift moved its key, or
//!   freed its slot) but never lies: a live table holds each key in one
//!   slot at most, so a slot of a live table that holds key `k` is `k`'s
//!   slot. A lookup checks the key in the slot (`is_key`) before it trusts
//!   a way, which also settles keys of equal tags.

use std::hash::BuildHasher;

use rustc_hash::FxBuildHasher;

/// Ways per line: four tags and four addresses fill 64 bytes, one cache
/// line.
const WAYS: usize = 4;

/// The fewest lines: a store's first keys need no resize.
pub(crate) const MIN_LINES: usize = 16;

/// The cache's tag of `key`: an in-process hash (never written anywhere),
/// odd so that 0 means empty.
#[inline(always)]
pub(crate) fn tag<K: std::hash::Hash>(key: &K) -> u64 {
    FxBuildHasher.hash_one(key) | 1
}

/// One cache line of ways.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line {
    tag: [u64; WAYS],
    slot: [*mut u8; WAYS],
}

impl Line {
    const EMPTY: Line = Line {
        tag: [0; WAYS],
        slot: [std::ptr::null_mut(); WAYS],
    };

    /// A bit per way whose tag is `t`, without a branch per way.
    #[inline(always)]
    fn matches(&self, t: u64) -> u32 {
        (self.tag[0] == t) as u32
            | ((self.tag[1] == t) as u32) << 1
            | ((self.tag[2] == t) as u32) << 2
            | ((self.tag[3] == t) as u32) << 3
    }
}

/// Slot addresses by key tag; see the module docs.
pub(crate) struct SlotCache {
    lines: Vec<Line>,
    /// `lines.len() - 1`; `lines.len()` is a power of two.
    mask: usize,
}

impl SlotCache {
    /// An empty cache of `lines` lines (a power of two).
    pub(crate) fn new(lines: usize) -> Self {
        assert!(lines.is_power_of_two(), "{lines} lines");
        SlotCache {
            lines: vec![Line::EMPTY; lines],
            mask: lines - 1,
        }
    }

    /// Lines.
    pub(crate) fn lines(&self) -> usize {
        self.lines.len()
    }

    #[inline(always)]
    fn line(&self, t: u64) -> usize {
        (t >> 1) as usize & self.mask
    }

    /// The address cached for tag `t` whose slot `is_key` accepts.
    #[inline(always)]
    pub(crate) fn get(&self, t: u64, is_key: impl Fn(*mut u8) -> bool) -> Option<*mut u8> {
        debug_assert_eq!(t & 1, 1, "a tag");
        // SAFETY: `line` masks the index below `lines.len()`.
        let line = unsafe { self.lines.get_unchecked(self.line(t)) };
        let mut m = line.matches(t);
        while m != 0 {
            let p = line.slot[m.trailing_zeros() as usize];
            if is_key(p) {
                return Some(p);
            }
            m &= m - 1;
        }
        None
    }

    /// The address cached for tag `t` in the first way that has it, or
    /// null: a hint for a prefetch, unchecked (the caller checks the key
    /// in the slot before it trusts it, as [`SlotCache::get`] does).
    #[inline(always)]
    pub(crate) fn candidate(&self, t: u64) -> *mut u8 {
        // SAFETY: `line` masks the index below `lines.len()`.
        let line = unsafe { self.lines.get_unchecked(self.line(t)) };
        let m = line.matches(t);
        if m == 0 {
            std::ptr::null_mut()
        } else {
            line.slot[m.trailing_zeros() as usize]
        }
    }

    /// The address of the line of tag `t`, for a prefetch: a
    /// [`SlotCache::candidate`] of `t` some records later then finds the
    /// line in the nearest cache.
    #[inline(always)]
    pub(crate) fn line_addr(&self, t: u64) -> *const u8 {
        // SAFETY: `line` masks the index below `lines.len()`.
        unsafe { self.lines.as_ptr().add(self.line(t)).cast() }
    }

    /// Caches `p` for tag `t`: in an empty way of its line, else in place
    /// of the way the tag's high bits pick (a full line forgets one key).
    /// `p` must be the slot of the key of tag `t` that is not cached.
    pub(crate) fn insert(&mut self, t: u64, p: *mut u8) {
        debug_assert_eq!(t & 1, 1, "a tag");
        let li = self.line(t);
        let line = &mut self.lines[li];
        let empty = line.matches(0);
        let j = if empty != 0 {
            empty.trailing_zeros() as usize
        } else {
            (t >> 62) as usize
        };
        (line.tag[j], line.slot[j]) = (t, p);
    }

    /// Forgets every address (slots moved).
    pub(crate) fn clear(&mut self) {
        self.lines.fill(Line::EMPTY);
    }

    /// Empties the cache and gives it `lines` lines (a power of two).
    pub(crate) fn resize(&mut self, lines: usize) {
        *self = SlotCache::new(lines);
    }
}

// SAFETY: the addresses are plain values; the store that owns the cache
// reads and writes the slots they name only through its own `&mut self`
// or `&self`, as for the mapped pages themselves.
unsafe impl Send for SlotCache {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// Addresses standing for slots: the test's key is the address.
    fn at(k: u64) -> *mut u8 {
        (k as usize * 8 + 8) as *mut u8
    }

    proptest! {
        /// Against a model of what is cached, with a hash of few values
        /// (`bits` wide) so that lines fill, ways are replaced and tags
        /// collide: a hit is always the key's own address, a key is never
        /// found after a clear, and a key inserted last in a line that had
        /// room is found.
        #[test]
        fn never_returns_a_wrong_or_cleared_address(
            ops in proptest::collection::vec((0u64..200, 0u8..2), 1..500),
            bits in 1u32..10,
        ) {
            let hash = |k: u64| (k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - bits)) << 1 | 1;
            let mut cache = SlotCache::new(MIN_LINES);
            let mut cached: HashMap<u64, ()> = HashMap::new();
            for (k, op) in ops {
                match op {
                    0 => {
                        if cache.get(hash(k), |p| p == at(k)).is_none() {
                            let room = cache.lines[cache.line(hash(k))].matches(0) != 0;
                            cache.insert(hash(k), at(k));
                            cached.insert(k, ());
                            if room {
                                prop_assert_eq!(cache.get(hash(k), |p| p == at(k)), Some(at(k)));
                            }
                        }
                    }
                    _ => {
                        if k % 50 == 0 {
                            cache.clear();
                            cached.clear();
                        }
                    }
                }
                for j in 0..200u64 {
                    if let Some(p) = cache.get(hash(j), |p| p == at(j)) {
                        prop_assert_eq!(p, at(j));
                        prop_assert!(cached.contains_key(&j), "key {} found after a clear", j);
                    }
                }
            }
        }
    }

    #[test]
    fn a_resize_empties_and_tags_are_odd() {
        let mut cache = SlotCache::new(MIN_LINES);
        let t = tag(&42u64);
        assert_eq!(t & 1, 1);
        cache.insert(t, at(42));
        assert_eq!(cache.get(t, |_| true), Some(at(42)));
        cache.resize(64);
        assert_eq!(cache.lines(), 64);
        assert_eq!(cache.get(t, |_| true), None);
    }
}
