//! How keys and values become the bytes of a slot.
//!
//! A slot has room for exactly one key and one value of a fixed size, so
//! every key type declares its encoded size up front ([`StateKey::SLOT_BYTES`]).
//! Plain fixed-size values ([`StateValue`]) live in the slot as themselves,
//! with no serialization: the hot path hands out `&mut V` pointing into the
//! mapped page. Values of variable size (in map and list state) go through a
//! [`Codec`] chosen per state, into a slot area of `max_value_len` bytes.

use std::hash::Hash;

use bytemuck::Pod;

/// The longest `String` or `Vec<u8>` key a store accepts, in bytes.
///
/// Every slot of a store with such keys reserves `1 + MAX_KEY_BYTES` bytes
/// for the key (a length byte, then the bytes), so the bound is a trade of
/// slot size against key length; 64 covers the identifiers, words and URLs
/// of the jobs weir runs. Longer keys are a programming error and panic.
pub const MAX_KEY_BYTES: usize = 64;

/// A key of keyed state: hashable, comparable, and encodable into a
/// fixed-size area of a slot.
///
/// The key group of a key is `key_group(stable_hash(&key), max_parallelism)`
/// ([`crate::operators::keyed`]), the same formula the runtime routes records by, so a
/// key is always stored by the subtask that receives it.
///
/// Implemented for the integer types, `[u8; N]`, `String`, `Vec<u8>`
/// (both up to [`MAX_KEY_BYTES`]), pairs of keys, and any plain type through
/// [`PodKey`].
///
/// ```
/// use weir_core::state::StateKey;
/// let mut slot = [0u8; <u64 as StateKey>::SLOT_BYTES];
/// 42u64.write_slot(&mut slot);
/// assert_eq!(u64::read_slot(&slot), Some(42));
/// ```
pub trait StateKey: Hash + Eq + Clone + Send + 'static {
    /// Bytes the key takes in every slot.
    const SLOT_BYTES: usize;
    /// Writes the key into `out`, which is exactly [`Self::SLOT_BYTES`] long.
    fn write_slot(&self, out: &mut [u8]);
    /// Reads a key written by [`Self::write_slot`]; `None` if the bytes are
    /// not a key of this type.
    fn read_slot(bytes: &[u8]) -> Option<Self>;
    /// Whether `bytes` (a slot's key area) hold this key. The hot path
    /// compares keys this way; override it to avoid decoding.
    #[inline]
    fn eq_slot(&self, bytes: &[u8]) -> bool {
        Self::read_slot(bytes).as_ref() == Some(self)
    }
}

/// A value stored inline in a slot: plain old data with a default.
///
/// The store hands out `&mut V` pointing into a mapped page, so `V` must be
/// valid for every bit pattern ([`Pod`]) and aligned to at most 16 bytes.
/// Blanket-implemented for every such type.
pub trait StateValue: Pod + Default + Send + 'static {}

impl<T: Pod + Default + Send + 'static> StateValue for T {}

macro_rules! int_key {
    ($($t:ty),*) => {$(
        impl StateKey for $t {
            const SLOT_BYTES: usize = std::mem::size_of::<$t>();
            #[inline]
            fn write_slot(&self, out: &mut [u8]) {
                out.copy_from_slice(&self.to_le_bytes());
            }
            #[inline]
            fn read_slot(bytes: &[u8]) -> Option<Self> {
                Some(<$t>::from_le_bytes(bytes.try_into().ok()?))
            }
            #[inline(always)]
            fn eq_slot(&self, bytes: &[u8]) -> bool {
                bytes == self.to_le_bytes()
            }
        }
    )*};
}

int_key!(u8, u16, u32, u64, u128, i8, i16, i32, i64, i128);

impl<const N: usize> StateKey for [u8; N] {
    const SLOT_BYTES: usize = N;
    #[inline]
    fn write_slot(&self, out: &mut [u8]) {
        out.copy_from_slice(self);
    }
    #[inline]
    fn read_slot(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok()
    }
    #[inline]
    fn eq_slot(&self, bytes: &[u8]) -> bool {
        bytes == self
    }
}

fn write_bytes_key(key: &[u8], out: &mut [u8]) {
    assert!(
        key.len() <= MAX_KEY_BYTES,
        "state key of {} bytes is longer than MAX_KEY_BYTES ({MAX_KEY_BYTES})",
        key.len()
    );
    out[0] = key.len() as u8;
    out[1..1 + key.len()].copy_from_slice(key);
    out[1 + key.len()..].fill(0);
}

fn eq_bytes_key(key: &[u8], bytes: &[u8]) -> bool {
    bytes.first() == Some(&(key.len() as u8)) && bytes.get(1..1 + key.len()) == Some(key)
}

fn read_bytes_key(bytes: &[u8]) -> Option<&[u8]> {
    let len = usize::from(*bytes.first()?);
    bytes.get(1..1 + len).filter(|_| len <= MAX_KEY_BYTES)
}

impl StateKey for String {
    const SLOT_BYTES: usize = 1 + MAX_KEY_BYTES;
    fn write_slot(&self, out: &mut [u8]) {
        write_bytes_key(self.as_bytes(), out);
    }
    fn read_slot(bytes: &[u8]) -> Option<Self> {
        String::from_utf8(read_bytes_key(bytes)?.to_vec()).ok()
    }
    fn eq_slot(&self, bytes: &[u8]) -> bool {
        eq_bytes_key(self.as_bytes(), bytes)
    }
}

impl StateKey for Vec<u8> {
    const SLOT_BYTES: usize = 1 + MAX_KEY_BYTES;
    fn write_slot(&self, out: &mut [u8]) {
        write_bytes_key(self, out);
    }
    fn read_slot(bytes: &[u8]) -> Option<Self> {
        Some(read_bytes_key(bytes)?.to_vec())
    }
    fn eq_slot(&self, bytes: &[u8]) -> bool {
        eq_bytes_key(self, bytes)
    }
}

impl<A: StateKey, B: StateKey> StateKey for (A, B) {
    const SLOT_BYTES: usize = A::SLOT_BYTES + B::SLOT_BYTES;
    #[inline]
    fn write_slot(&self, out: &mut [u8]) {
        let (a, b) = out.split_at_mut(A::SLOT_BYTES);
        self.0.write_slot(a);
        self.1.write_slot(b);
    }
    #[inline]
    fn read_slot(bytes: &[u8]) -> Option<Self> {
        let (a, b) = bytes.split_at(A::SLOT_BYTES);
        Some((A::read_slot(a)?, B::read_slot(b)?))
    }
    #[inline]
    fn eq_slot(&self, bytes: &[u8]) -> bool {
        let (a, b) = bytes.split_at(A::SLOT_BYTES);
        self.0.eq_slot(a) && self.1.eq_slot(b)
    }
}

/// A plain user type used as a key, stored as its bytes.
///
/// Its key group follows from its `Hash` implementation, so it must hash
/// the same way as the key the runtime routes by (wrap that key itself).
///
/// ```
/// use weir_core::state::{PodKey, StateKey};
/// #[derive(Clone, Copy, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
/// #[repr(C)]
/// struct Pair { a: u32, b: u32 }
/// let mut slot = [0u8; 8];
/// PodKey(Pair { a: 1, b: 2 }).write_slot(&mut slot);
/// assert!(PodKey::<Pair>::read_slot(&slot) == Some(PodKey(Pair { a: 1, b: 2 })));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct PodKey<T>(pub T);

impl<T: Pod + Hash + Eq + Send> StateKey for PodKey<T> {
    const SLOT_BYTES: usize = std::mem::size_of::<T>();
    #[inline]
    fn write_slot(&self, out: &mut [u8]) {
        out.copy_from_slice(bytemuck::bytes_of(&self.0));
    }
    #[inline]
    fn read_slot(bytes: &[u8]) -> Option<Self> {
        bytemuck::try_pod_read_unaligned(bytes).ok().map(PodKey)
    }
    #[inline]
    fn eq_slot(&self, bytes: &[u8]) -> bool {
        bytes == bytemuck::bytes_of(&self.0)
    }
}

/// The encoding of variable-size values (map and list state), chosen per
/// state by a type parameter.
///
/// ```
/// use weir_core::state::{Codec, SerdeCodec};
/// let mut buf = Vec::new();
/// <SerdeCodec as Codec<String>>::encode(&"hi".to_string(), &mut buf);
/// assert_eq!(<SerdeCodec as Codec<String>>::decode(&buf).as_deref(), Some("hi"));
/// ```
pub trait Codec<T>: Send + 'static {
    /// Appends the encoding of `value` to `out`.
    fn encode(value: &T, out: &mut Vec<u8>);
    /// Decodes a value from exactly the bytes [`Codec::encode`] wrote;
    /// `None` if they are not a value of this type.
    fn decode(bytes: &[u8]) -> Option<T>;
}

/// Plain values as their own bytes: no serialization, fixed size.
#[derive(Debug, Clone, Copy, Default)]
pub struct PodCodec;

impl<T: Pod> Codec<T> for PodCodec {
    fn encode(value: &T, out: &mut Vec<u8>) {
        out.extend_from_slice(bytemuck::bytes_of(value));
    }
    fn decode(bytes: &[u8]) -> Option<T> {
        bytemuck::try_pod_read_unaligned(bytes).ok()
    }
}

/// Any serde type in postcard's compact binary format (varints, no field
/// names): the codec for strings, vectors and structs.
#[derive(Debug, Clone, Copy, Default)]
pub struct SerdeCodec;

impl<T: serde::Serialize + serde::de::DeserializeOwned> Codec<T> for SerdeCodec {
    fn encode(value: &T, out: &mut Vec<u8>) {
        let buf = std::mem::take(out);
        *out = postcard::to_extend(value, buf).expect("postcard encodes every serde value into a Vec");
    }
    fn decode(bytes: &[u8]) -> Option<T> {
        postcard::from_bytes(bytes).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<K: StateKey + std::fmt::Debug>(k: K) {
        let mut slot = vec![0xAAu8; K::SLOT_BYTES];
        k.write_slot(&mut slot);
        assert!(k.eq_slot(&slot));
        assert_eq!(K::read_slot(&slot), Some(k));
    }

    #[test]
    fn keys_round_trip() {
        round_trip(7u8);
        round_trip(-5i64);
        round_trip(u128::MAX);
        round_trip([1u8, 2, 3]);
        round_trip(String::new());
        round_trip("x".repeat(MAX_KEY_BYTES));
        round_trip(vec![0u8, 255, 3]);
        round_trip((3u32, "k".to_string()));
        let mut slot = [0u8; <String as StateKey>::SLOT_BYTES];
        "ab".to_string().write_slot(&mut slot);
        assert!(!"a".to_string().eq_slot(&slot) && !"abc".to_string().eq_slot(&slot));
        assert!(!1u64.eq_slot(&2u64.to_le_bytes()));
    }

    #[test]
    #[should_panic(expected = "longer than MAX_KEY_BYTES")]
    fn overlong_string_key_panics() {
        let mut slot = [0u8; <String as StateKey>::SLOT_BYTES];
        "y".repeat(MAX_KEY_BYTES + 1).write_slot(&mut slot);
    }

    #[test]
    fn corrupt_length_byte_is_not_a_key() {
        let mut slot = [0u8; <String as StateKey>::SLOT_BYTES];
        slot[0] = (MAX_KEY_BYTES + 1) as u8;
        assert_eq!(String::read_slot(&slot), None);
    }

    #[test]
    fn codecs_round_trip() {
        let mut buf = Vec::new();
        <PodCodec as Codec<[u32; 3]>>::encode(&[1, 2, 3], &mut buf);
        assert_eq!(buf.len(), 12);
        assert_eq!(<PodCodec as Codec<[u32; 3]>>::decode(&buf), Some([1, 2, 3]));
        buf.clear();
        <SerdeCodec as Codec<(u64, String)>>::encode(&(300, "ab".into()), &mut buf);
        assert_eq!(buf.len(), 2 + 1 + 2, "varint 300 is 2 bytes, string is length + bytes");
        assert_eq!(
            <SerdeCodec as Codec<(u64, String)>>::decode(&buf),
            Some((300, "ab".into()))
        );
    }
}
