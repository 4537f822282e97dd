//! Keys and key groups: every key hashes, with a hash that is stable across
//! processes and platforms, to one of `max_parallelism` key groups (default
//! [`DEFAULT_MAX_PARALLELISM`]); a key group belongs to exactly one subtask
//! of a keyed operator, by the contiguous range formula below. State is
//! owned per key group, so that a checkpoint taken at one parallelism can
//! be restored at another. The runtime routes records by the same formula.

use std::hash::{Hash, Hasher};

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
