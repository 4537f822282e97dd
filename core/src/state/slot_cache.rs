//! The value store's slot cache: from a key's in-process hash to the
//! address of its slot, on the heap, for a store small enough to sit in
//! the core's caches.
//!
//! It exists because a lookup in the mapped table is a long chain for a
//! small state: the stable hash (three multiplies), the key group, the
//! page directory, then a linear probe whose length the processor cannot
//! predict (docs/design/state.md#page-layout; the figures:
//! docs/notebook/benchmarks-2026-12.md, "Mapped state against a hash map"
//! and "Mapped state: a slot cache on the heap"). Here a lookup is one
//! multiply (FxHash, as the heap backend's map uses), one 64-byte line of
//! four `(fingerprint, address)` ways, and the slot's own load, which the
//! update needs anyway. A miss takes the table's path and fills the cache.
//!
//! It is a cache, not an index: it may forget any key at any time (a full
//! line replaces a way; a table's growth empties it), and the table stays
//! the only truth. Nothing of it is written to a checkpoint, and a
//! restored store starts with it empty.
//!
//! # Invariants
//!
//! - A key's tag is its hash with the low bit set ([`tag`]): the tag's low
//!   bits pick the line, its high 32 bits, with the low bit set, are the
//!   **fingerprint** a way keeps. A way's fingerprint is 0 (empty) or odd.
//!   Four 32-bit fingerprints are compared with one vector compare, where
//!   64-bit tags would take a compare and a shift each
//!   (docs/notebook/benchmarks-2026-12.md, "The slot cache's four ways
//!   matched by one vector compare").
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
//!   a way, which also settles keys of equal fingerprints.

use std::hash::BuildHasher;

use rustc_hash::FxBuildHasher;

/// Ways per line: four fingerprints and four addresses fit 64 bytes, one
/// cache line.
const WAYS: usize = 4;

/// The fewest lines: a store's first keys need no resize.
pub(crate) const MIN_LINES: usize = 16;

/// The cache's tag of `key`: an in-process hash (never written anywhere),
/// odd so that 0 means empty.
#[inline(always)]
pub(crate) fn tag<K: std::hash::Hash>(key: &K) -> u64 {
    FxBuildHasher.hash_one(key) | 1
}

/// The fingerprint a way keeps for tag `t`: its high half, odd (never 0,
/// which marks an empty way). Independent of the line's index, which the
/// low bits give.
#[inline(always)]
fn fingerprint(t: u64) -> u32 {
    (t >> 32) as u32 | 1
}

/// One cache line of ways.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line {
    print: [u32; WAYS],
    slot: [*mut u8; WAYS],
}

impl Line {
    const EMPTY: Line = Line {
        print: [0; WAYS],
        slot: [std::ptr::null_mut(); WAYS],
    };

    /// A bit per way whose fingerprint is `f`, without a branch per way:
    /// on x86-64 one 4-lane compare and its mask (SSE2, which every
    /// x86-64 processor has).
    #[inline(always)]
    fn matches(&self, f: u32) -> u32 {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{
                _mm_castsi128_ps, _mm_cmpeq_epi32, _mm_load_si128, _mm_movemask_ps, _mm_set1_epi32,
            };
            // SAFETY: SSE2 is part of the x86-64 baseline; `print` is the
            // first 16 bytes of the line, which is 64-byte aligned
            // (`repr(C, align(64))`), so the aligned 16-byte load reads
            // exactly the four fingerprints.
            unsafe {
                let ways = _mm_load_si128(self.print.as_ptr().cast());
                let eq = _mm_cmpeq_epi32(ways, _mm_set1_epi32(f as i32));
                _mm_movemask_ps(_mm_castsi128_ps(eq)) as u32
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            (self.print[0] == f) as u32
                | ((self.print[1] == f) as u32) << 1
                | ((self.print[2] == f) as u32) << 2
                | ((self.print[3] == f) as u32) << 3
        }
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
        let mut m = line.matches(fingerprint(t));
        while m != 0 {
            let p = line.slot[m.trailing_zeros() as usize];
            if is_key(p) {
                return Some(p);
            }
            m &= m - 1;
        }
        None
    }

    /// The address cached for tag `t` in the first way with its
    /// fingerprint, or null: a hint for a prefetch, unchecked (the caller
    /// checks the key in the slot before it trusts it, as
    /// [`SlotCache::get`] does).
    #[inline(always)]
    pub(crate) fn candidate(&self, t: u64) -> *mut u8 {
        // SAFETY: `line` masks the index below `lines.len()`.
        let line = unsafe { self.lines.get_unchecked(self.line(t)) };
        let m = line.matches(fingerprint(t));
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
        (line.print[j], line.slot[j]) = (fingerprint(t), p);
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

    proptest! {
        /// The vector compare gives the bit of each way whose fingerprint
        /// is `f`, as the scalar compares do (fingerprints drawn from few
        /// values so that several ways match).
        #[test]
        fn matches_marks_exactly_the_equal_ways(print in proptest::array::uniform4(0u32..4), f in 0u32..4) {
            let line = Line { print, slot: [std::ptr::null_mut(); WAYS] };
            let want = (0..WAYS).filter(|&w| print[w] == f).fold(0, |m, w| m | 1 << w);
            prop_assert_eq!(line.matches(f), want);
        }
    }

    #[test]
    fn keys_of_one_line_and_fingerprint_are_told_apart_by_their_slots() {
        let mut cache = SlotCache::new(MIN_LINES);
        // Same line (bits 1..5), same high half, different middle bits.
        let (a, b) = (0x1234_5678_0000_0003u64, 0x1234_5678_0001_0003u64);
        assert_eq!((cache.line(a), fingerprint(a)), (cache.line(b), fingerprint(b)));
        cache.insert(a, at(1));
        cache.insert(b, at(2));
        assert_eq!(cache.get(a, |p| p == at(1)), Some(at(1)));
        assert_eq!(cache.get(b, |p| p == at(2)), Some(at(2)));
        assert_eq!(cache.get(b, |p| p == at(3)), None);
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
