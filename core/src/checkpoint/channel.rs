//! Channel state: what an unaligned barrier overtook on one channel, in
//! order: the records, and the watermarks that stood between them.
//!
//! A channel's records are encoded one after the other (postcard, as
//! [`crate::data::encode_into`] writes them; unchanged since task state
//! format 1). Its watermarks are kept beside them as `(position, value)`
//! pairs: `position` is the number of the channel's records in front of
//! the watermark, `value` the watermark ([`crate::operators::time::IDLE`] for an
//! idle marker). Positions never decrease and are at most the number of
//! records. Task state format 1 had no watermarks: its records replay
//! without any (see `docs/design/checkpoints.md#barrier-flow`).
//!
//! Recording happens only while an unaligned checkpoint's channel state
//! is being taken (look-ahead over an input ring, or the output staged at
//! an unaligned barrier); nothing here runs on the per-record path.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::data::encode_into;

/// Watermarks of one channel: `(records in front of it, watermark)`.
pub(crate) type ChannelWatermarks = Vec<(u64, i64)>;

/// One channel's state being recorded.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct ChannelRecorder {
    /// The records, encoded one after the other.
    pub(crate) bytes: Vec<u8>,
    /// Records in `bytes`.
    pub(crate) records: u64,
    /// Watermarks between (and after) the records.
    pub(crate) watermarks: ChannelWatermarks,
}

impl ChannelRecorder {
    /// Appends a record.
    pub(crate) fn record<T: Serialize>(&mut self, record: &T) -> Result<(), postcard::Error> {
        encode_into(record, &mut self.bytes)?;
        self.records += 1;
        Ok(())
    }

    /// Appends a watermark (or idle marker) behind the records so far.
    pub(crate) fn watermark(&mut self, wm: i64) {
        self.watermarks.push((self.records, wm));
    }

    /// Moves what was recorded into a task state's lists for channel `k`.
    pub(crate) fn store_into(
        self,
        k: u32,
        records: &mut Vec<(u32, Vec<u8>)>,
        watermarks: &mut Vec<(u32, ChannelWatermarks)>,
    ) {
        if self.records > 0 {
            records.push((k, self.bytes));
        }
        if !self.watermarks.is_empty() {
            watermarks.push((k, self.watermarks));
        }
    }
}

/// One element of a channel's state, in channel order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Replayed<T> {
    Record(T),
    Watermark(i64),
}

/// Checks that watermark positions never decrease; `what` names the
/// channel in the error.
pub(crate) fn check_positions(watermarks: &[(u64, i64)], what: &str) -> Result<(), String> {
    if let Some(w) = watermarks.windows(2).position(|w| w[1].0 < w[0].0) {
        return Err(format!(
            "{what}: watermark {} of the channel state is at record {}, before watermark {} at record {}",
            w + 1,
            watermarks[w + 1].0,
            w,
            watermarks[w].0
        ));
    }
    Ok(())
}

/// Decodes a channel's records and puts its watermarks back between them.
pub(crate) fn decode_channel<T: DeserializeOwned>(
    mut bytes: &[u8],
    watermarks: &[(u64, i64)],
) -> Result<Vec<Replayed<T>>, String> {
    check_positions(watermarks, "channel state")?;
    let total = bytes.len();
    let mut out = Vec::with_capacity(watermarks.len());
    let mut marks = watermarks.iter().peekable();
    let mut records = 0u64;
    loop {
        while let Some(&&(at, wm)) = marks.peek() {
            if at > records {
                break;
            }
            out.push(Replayed::Watermark(wm));
            marks.next();
        }
        if bytes.is_empty() {
            break;
        }
        let (record, rest) = postcard::take_from_bytes(bytes).map_err(|e| {
            format!(
                "record {records} of the channel state (byte {} of {total}) does not decode: {e}",
                total - bytes.len()
            )
        })?;
        out.push(Replayed::Record(record));
        records += 1;
        bytes = rest;
    }
    if let Some(&(at, _)) = marks.next() {
        return Err(format!(
            "a watermark of the channel state is at record {at}, but the channel holds {records} records"
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entry() -> impl Strategy<Value = Replayed<(u64, String)>> {
        prop_oneof![
            any::<(u64, String)>().prop_map(Replayed::Record),
            any::<i64>().prop_map(Replayed::Watermark),
        ]
    }

    fn record(entries: &[Replayed<(u64, String)>]) -> ChannelRecorder {
        let mut c = ChannelRecorder::default();
        for e in entries {
            match e {
                Replayed::Record(r) => c.record(r).unwrap(),
                Replayed::Watermark(w) => c.watermark(*w),
            }
        }
        c
    }

    proptest! {
        /// Records and watermarks come back in the order they were recorded.
        #[test]
        fn channel_state_roundtrips_in_order(entries in proptest::collection::vec(entry(), 0..64)) {
            let c = record(&entries);
            let back = decode_channel::<(u64, String)>(&c.bytes, &c.watermarks).unwrap();
            prop_assert_eq!(back, entries);
        }

        /// A watermark position past the records, or out of order, is an
        /// error, never a panic or a silently dropped watermark.
        #[test]
        fn bad_positions_are_refused(entries in proptest::collection::vec(entry(), 0..32), extra in 1u64..5) {
            let mut c = record(&entries);
            c.watermarks.push((c.records + extra, 7));
            prop_assert!(decode_channel::<(u64, String)>(&c.bytes, &c.watermarks).is_err());
            c.watermarks.pop();
            if let Some(&(at, _)) = c.watermarks.iter().find(|w| w.0 > 0) {
                c.watermarks.push((at - 1, 8));
                prop_assert!(decode_channel::<(u64, String)>(&c.bytes, &c.watermarks).is_err());
            }
        }

        #[test]
        fn garbage_never_panics(bytes: Vec<u8>, marks: Vec<(u64, i64)>) {
            let _ = decode_channel::<(u64, String)>(&bytes, &marks);
        }
    }
}
