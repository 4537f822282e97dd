//! Kafka records as bytes in a sink's buffers and write-ahead log: a key
//! and a value, each with its length, so that a concatenation of records
//! (an epoch's payloads, a hand-over buffer) splits back into records.
//!
//! ```text
//! key_len u32 LE | key | value_len u32 LE | value
//! ```
//!
//! The log's own frames carry a CRC-32 of each payload, so a record read
//! back from the log is verified before it is split here; a length that
//! runs past the end is still reported as an error, never a panic.

/// Bytes of a record's framing besides its key and value.
pub const RECORD_OVERHEAD: usize = 8;

/// Appends a record with `key` and `value` to `out`.
///
/// ```
/// use weir_io::kafka::framing::{encode, Records};
/// let mut buf = Vec::new();
/// encode(b"k1", b"1,2,3", &mut buf);
/// encode(b"", b"v", &mut buf);
/// let all: Vec<_> = Records::new(&buf).map(|r| r.unwrap()).collect();
/// assert_eq!(all, vec![(&b"k1"[..], &b"1,2,3"[..]), (&b""[..], &b"v"[..])]);
/// ```
#[inline]
pub fn encode(key: &[u8], value: &[u8], out: &mut Vec<u8>) {
    encode_with(key, out, |out| out.extend_from_slice(value));
}

/// [`encode`] with the value written by `value` straight into `out` (for
/// example with [`crate::text::Line`]), not copied from a slice: no buffer
/// of the value's own.
///
/// ```
/// use weir_io::kafka::framing::{encode, encode_with};
/// use weir_io::text::Line;
/// let mut a = Vec::new();
/// encode_with(b"k1", &mut a, |out| Line::new(out).str("k1").u64(2).i64(-3).done());
/// let mut b = Vec::new();
/// encode(b"k1", b"k1,2,-3", &mut b);
/// assert_eq!(a, b);
/// ```
///
/// # Panics
///
/// If `value` writes more than `u32::MAX` bytes, or takes away bytes that
/// were in `out` before it.
#[inline]
pub fn encode_with(key: &[u8], out: &mut Vec<u8>, value: impl FnOnce(&mut Vec<u8>)) {
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(key);
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    value(out);
    assert!(out.len() >= at + 4, "a record's value removed bytes from the buffer");
    let len = u32::try_from(out.len() - at - 4).expect("a record's value is at most 4 GiB");
    out[at..at + 4].copy_from_slice(&len.to_le_bytes());
}

/// The records of a buffer of [`encode`]d records, in order; an error
/// (and then nothing more) if the buffer does not split into whole
/// records: the byte offset where the record that runs past the end
/// starts.
#[derive(Debug, Clone)]
pub struct Records<'a> {
    buf: &'a [u8],
    at: usize,
    failed: bool,
}

impl<'a> Records<'a> {
    /// The records of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Records {
            buf,
            at: 0,
            failed: false,
        }
    }

    fn part(&mut self) -> Option<&'a [u8]> {
        let len_end = self.at.checked_add(4)?;
        let len = u32::from_le_bytes(self.buf.get(self.at..len_end)?.try_into().ok()?) as usize;
        let end = len_end.checked_add(len)?;
        let part = self.buf.get(len_end..end)?;
        self.at = end;
        Some(part)
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<(&'a [u8], &'a [u8]), usize>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.at == self.buf.len() {
            return None;
        }
        let start = self.at;
        match (self.part(), self.part()) {
            (Some(k), Some(v)) => Some(Ok((k, v))),
            _ => {
                self.failed = true;
                Some(Err(start))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn records_split_back(records in proptest::collection::vec(
            (proptest::collection::vec(any::<u8>(), 0..20), proptest::collection::vec(any::<u8>(), 0..40)), 0..20)) {
            let mut buf = Vec::new();
            for (k, v) in &records {
                encode(k, v, &mut buf);
            }
            let back: Vec<(Vec<u8>, Vec<u8>)> = Records::new(&buf).map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec()))).collect::<Result<_, usize>>().unwrap();
            prop_assert_eq!(back, records);
        }

        #[test]
        fn any_bytes_give_records_or_one_error(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let items: Vec<_> = Records::new(&bytes).collect();
            // At most one error, and only last.
            let errors = items.iter().filter(|r| r.is_err()).count();
            prop_assert!(errors <= 1);
            if errors == 1 {
                prop_assert!(items.last().unwrap().is_err());
            }
        }
    }
}
