//! The bound on records that cross an exchange (`key_by`, `rebalance`,
//! `union`) or live in keyed state.
//!
//! Such records may have to be written into a checkpoint: keyed state
//! always, and in-flight records when an unaligned barrier overtakes them.
//! They are encoded with `serde` in a compact binary format (postcard),
//! only at checkpoints and recovery, never on the per-record path.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// A record type weir can store in a checkpoint: anything `Serialize +
/// DeserializeOwned + Send + 'static` (derive `serde`'s traits on your
/// types).
pub trait Data: Serialize + DeserializeOwned + Send + 'static {}

impl<T: Serialize + DeserializeOwned + Send + 'static> Data for T {}

/// Appends the encoding of `record` to `out`.
pub(crate) fn encode_into<T: Serialize>(record: &T, out: &mut Vec<u8>) -> Result<(), postcard::Error> {
    postcard::to_io(record, &mut *out).map(|_| ())
}

/// Decodes every record of a buffer written by [`encode_into`] (channel
/// state is decoded with its watermarks by
/// [`crate::checkpoint::channel::decode_channel`]).
#[cfg(test)]
pub(crate) fn decode_all<T: DeserializeOwned>(mut bytes: &[u8]) -> Result<Vec<T>, postcard::Error> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let (record, rest) = postcard::take_from_bytes(bytes)?;
        out.push(record);
        bytes = rest;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn records_roundtrip(records: Vec<(u64, String, i32)>) {
            let mut buf = Vec::new();
            for r in &records {
                encode_into(r, &mut buf).unwrap();
            }
            prop_assert_eq!(decode_all::<(u64, String, i32)>(&buf).unwrap(), records);
        }

        #[test]
        fn garbage_never_panics(bytes: Vec<u8>) {
            let _ = decode_all::<(u64, String)>(&bytes);
        }
    }
}
