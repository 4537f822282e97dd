//! The byte formats of the write-ahead log: record frames, segment headers
//! and the state a WAL sink stores in a checkpoint.
//!
//! A **record frame** (all integers little-endian):
//!
//! ```text
//! offset  size  field
//! 0       4     crc32    CRC-32 (IEEE) of bytes 4 .. 16 + len
//! 4       4     len      payload length, at most MAX_PAYLOAD_BYTES
//! 8       8     epoch    the epoch (checkpoint id) the record belongs to
//! 16      len   payload  the record's encoded bytes
//! ```
//!
//! The CRC covers the length and the epoch as well as the payload, so a
//! damaged header is caught like damaged data. Decoding never trusts a
//! length before bounding it, never panics on any input, and tells a
//! frame that is merely cut short ([`Decoded::Incomplete`], a torn tail
//! when it is at the end of the log) from one that is wrong
//! ([`Decoded::Corrupt`]).
//!
//! A **segment** file starts with a [`SEGMENT_HEADER_BYTES`]-byte header:
//! magic `weirWAL1`, the segment's sequence number (u64), the sink subtask
//! (u32) and a CRC-32 of those 20 bytes; frames follow back to back.

/// Bytes of a frame header.
pub const HEADER_BYTES: usize = 16;

/// Largest payload of one record: 16 MiB. A bound on what a reader must
/// buffer; a header claiming more is corrupt, a record larger is refused.
pub const MAX_PAYLOAD_BYTES: usize = 16 << 20;

/// Bytes of a segment header.
pub const SEGMENT_HEADER_BYTES: usize = 24;

const SEGMENT_MAGIC: &[u8; 8] = b"weirWAL1";

/// Result of decoding the frame at the start of a buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A whole, verified frame.
    Frame {
        /// The record's epoch.
        epoch: u64,
        /// The record's bytes.
        payload: &'a [u8],
        /// Bytes the frame takes, header included.
        size: usize,
    },
    /// The buffer ends before the frame does: read more, or, at the end
    /// of the log, a torn tail.
    Incomplete,
    /// The frame is wrong: a length over the bound or a CRC mismatch.
    Corrupt(String),
}

/// Starts a frame at the end of `buf`: reserves its header and returns
/// where it starts. Append the payload, then call [`finish_frame`].
#[inline]
pub fn begin_frame(buf: &mut Vec<u8>) -> usize {
    let at = buf.len();
    buf.extend_from_slice(&[0; HEADER_BYTES]);
    at
}

/// Completes the frame begun at `at` (its payload is everything after the
/// header). If the payload is over [`MAX_PAYLOAD_BYTES`], removes the frame
/// and returns the payload's length as the error.
#[inline]
pub fn finish_frame(buf: &mut Vec<u8>, at: usize, epoch: u64) -> Result<(), usize> {
    finish_frame_unsealed(buf, at, epoch)?;
    let frame = &mut buf[at..];
    let crc = crc32fast::hash(&frame[4..]);
    frame[0..4].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// [`finish_frame`] without the CRC: writes the length and the epoch and
/// leaves the CRC field as it is. The frame is **unsealed**: it does not
/// verify until [`seal_frames`] has run over it, which must happen before
/// it is written anywhere a reader could find it.
///
/// The WAL sink's worker finishes frames this way and its log thread
/// seals them, so that the CRC, the larger part of a short record's cost
/// on the worker, runs off the worker (and reads the frame long after it
/// was written, not right behind the stores that wrote it).
#[inline]
pub fn finish_frame_unsealed(buf: &mut Vec<u8>, at: usize, epoch: u64) -> Result<(), usize> {
    let len = buf.len() - at - HEADER_BYTES;
    if len > MAX_PAYLOAD_BYTES {
        buf.truncate(at);
        return Err(len);
    }
    let frame = &mut buf[at..];
    frame[4..8].copy_from_slice(&(len as u32).to_le_bytes());
    frame[8..16].copy_from_slice(&epoch.to_le_bytes());
    Ok(())
}

/// Writes the CRC of every frame in `buf`, which holds whole frames back
/// to back, sealed or not ([`finish_frame_unsealed`]); returns how many.
///
/// ```
/// use weir_io::wal::codec::{begin_frame, decode_all, finish_frame_unsealed, seal_frames};
/// let mut buf = Vec::new();
/// for (epoch, payload) in [(1, &b"a\n"[..]), (2, b"bc\n")] {
///     let at = begin_frame(&mut buf);
///     buf.extend_from_slice(payload);
///     finish_frame_unsealed(&mut buf, at, epoch).unwrap();
/// }
/// assert!(decode_all(&buf).stop.is_some(), "an unsealed frame does not verify");
/// assert_eq!(seal_frames(&mut buf), 2);
/// assert_eq!(decode_all(&buf).frames.len(), 2);
/// ```
///
/// # Panics
///
/// If `buf` does not split into whole frames: its writer broke the
/// invariant (this is for buffers being written, never for bytes read back).
pub fn seal_frames(buf: &mut [u8]) -> usize {
    let (mut at, mut frames) = (0, 0);
    while at < buf.len() {
        assert!(
            buf.len() - at >= HEADER_BYTES,
            "a frame header cut short at byte {at} of {}",
            buf.len()
        );
        let len = u32::from_le_bytes(buf[at + 4..at + 8].try_into().expect("4 bytes")) as usize;
        let size = HEADER_BYTES + len;
        assert!(
            len <= MAX_PAYLOAD_BYTES && buf.len() - at >= size,
            "a frame of {len} bytes at byte {at} of {} does not fit",
            buf.len()
        );
        let crc = crc32fast::hash(&buf[at + 4..at + size]);
        buf[at..at + 4].copy_from_slice(&crc.to_le_bytes());
        at += size;
        frames += 1;
    }
    frames
}

/// Appends a whole frame for `payload` to `buf`.
///
/// ```
/// use weir_io::wal::codec::{decode_frame, encode_frame, Decoded};
/// let mut buf = Vec::new();
/// encode_frame(&mut buf, 7, b"hello\n").unwrap();
/// let Decoded::Frame { epoch, payload, size } = decode_frame(&buf) else { panic!() };
/// assert_eq!((epoch, payload, size), (7, &b"hello\n"[..], buf.len()));
/// buf[20] ^= 1; // one flipped bit
/// assert!(matches!(decode_frame(&buf), Decoded::Corrupt(_)));
/// ```
pub fn encode_frame(buf: &mut Vec<u8>, epoch: u64, payload: &[u8]) -> Result<(), usize> {
    if payload.len() > MAX_PAYLOAD_BYTES {
        return Err(payload.len());
    }
    let at = begin_frame(buf);
    buf.extend_from_slice(payload);
    finish_frame(buf, at, epoch)
}

/// Decodes the frame at the start of `buf`.
#[inline]
pub fn decode_frame(buf: &[u8]) -> Decoded<'_> {
    if buf.len() < HEADER_BYTES {
        return Decoded::Incomplete;
    }
    let len = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes")) as usize;
    if len > MAX_PAYLOAD_BYTES {
        return Decoded::Corrupt(format!(
            "record length {len} exceeds the limit of {MAX_PAYLOAD_BYTES} bytes"
        ));
    }
    let size = HEADER_BYTES + len;
    if buf.len() < size {
        return Decoded::Incomplete;
    }
    let stored = u32::from_le_bytes(buf[0..4].try_into().expect("4 bytes"));
    let actual = crc32fast::hash(&buf[4..size]);
    if stored != actual {
        return Decoded::Corrupt(format!(
            "record CRC mismatch: stored {stored:#010x}, computed {actual:#010x}"
        ));
    }
    Decoded::Frame {
        epoch: u64::from_le_bytes(buf[8..16].try_into().expect("8 bytes")),
        payload: &buf[HEADER_BYTES..size],
        size,
    }
}

/// What [`decode_all`] found in a buffer of frames.
#[derive(Debug, PartialEq, Eq)]
pub struct DecodedAll<'a> {
    /// `(epoch, payload)` of every whole, verified frame, in order.
    pub frames: Vec<(u64, &'a [u8])>,
    /// Bytes taken by those frames; where decoding stopped.
    pub valid_bytes: usize,
    /// Why decoding stopped before the end of the buffer: `None` if every
    /// byte was a verified frame.
    pub stop: Option<Decoded<'a>>,
}

/// Decodes frames until the end of `buf` or the first frame that is not
/// whole and verified.
pub fn decode_all(buf: &[u8]) -> DecodedAll<'_> {
    let mut frames = Vec::new();
    let mut at = 0;
    while at < buf.len() {
        match decode_frame(&buf[at..]) {
            Decoded::Frame { epoch, payload, size } => {
                frames.push((epoch, payload));
                at += size;
            }
            other => {
                return DecodedAll {
                    frames,
                    valid_bytes: at,
                    stop: Some(other),
                }
            }
        }
    }
    DecodedAll {
        frames,
        valid_bytes: at,
        stop: None,
    }
}

/// The header of segment `seq` of sink subtask `subtask`.
pub fn segment_header(seq: u64, subtask: u32) -> [u8; SEGMENT_HEADER_BYTES] {
    let mut h = [0u8; SEGMENT_HEADER_BYTES];
    h[0..8].copy_from_slice(SEGMENT_MAGIC);
    h[8..16].copy_from_slice(&seq.to_le_bytes());
    h[16..20].copy_from_slice(&subtask.to_le_bytes());
    let crc = crc32fast::hash(&h[0..20]);
    h[20..24].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Checks that `bytes` is the header of segment `seq` of `subtask`.
pub fn check_segment_header(bytes: &[u8], seq: u64, subtask: u32) -> Result<(), String> {
    if bytes.len() < SEGMENT_HEADER_BYTES {
        return Err(format!(
            "segment header is {} bytes, expected {SEGMENT_HEADER_BYTES}",
            bytes.len()
        ));
    }
    if &bytes[0..8] != SEGMENT_MAGIC {
        return Err("not a weir WAL segment (bad magic)".into());
    }
    let stored = u32::from_le_bytes(bytes[20..24].try_into().expect("4 bytes"));
    let actual = crc32fast::hash(&bytes[0..20]);
    if stored != actual {
        return Err(format!(
            "segment header CRC mismatch: stored {stored:#010x}, computed {actual:#010x}"
        ));
    }
    let got_seq = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    let got_subtask = u32::from_le_bytes(bytes[16..20].try_into().expect("4 bytes"));
    if (got_seq, got_subtask) != (seq, subtask) {
        return Err(format!(
            "header says segment {got_seq} of subtask {got_subtask}, expected segment {seq} of subtask {subtask}"
        ));
    }
    Ok(())
}

/// A position in the log: byte `off` of segment `seg`. Positions order
/// by segment, then offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WalPos {
    /// Segment sequence number.
    pub seg: u64,
    /// Byte offset in the segment file (the header included).
    pub off: u64,
}

impl std::fmt::Display for WalPos {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "segment {} byte {}", self.seg, self.off)
    }
}

/// Version of the checkpoint state encoding.
const STATE_VERSION: u8 = 1;

/// Bytes of an encoded [`SinkState`].
pub const STATE_BYTES: usize = 33;

/// What a WAL sink stores in checkpoint `epoch`: where the log ended at
/// that barrier. Everything before `end` belongs to epochs up to `epoch`
/// and was fsynced; everything after is newer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SinkState {
    /// The sink subtask.
    pub subtask: u32,
    /// The checkpoint.
    pub epoch: u64,
    /// End of the log at the barrier.
    pub end: WalPos,
}

impl SinkState {
    /// `version u8 | subtask u32 | epoch u64 | seg u64 | off u64 | crc32 u32`.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(STATE_BYTES);
        out.push(STATE_VERSION);
        out.extend_from_slice(&self.subtask.to_le_bytes());
        out.extend_from_slice(&self.epoch.to_le_bytes());
        out.extend_from_slice(&self.end.seg.to_le_bytes());
        out.extend_from_slice(&self.end.off.to_le_bytes());
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes and verifies a state made by [`SinkState::encode`].
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        if bytes.len() != STATE_BYTES {
            return Err(format!("expected {STATE_BYTES} bytes, got {}", bytes.len()));
        }
        if bytes[0] != STATE_VERSION {
            return Err(format!("unknown state version {}", bytes[0]));
        }
        let stored = u32::from_le_bytes(bytes[29..33].try_into().expect("4 bytes"));
        let actual = crc32fast::hash(&bytes[..29]);
        if stored != actual {
            return Err(format!("CRC mismatch: stored {stored:#010x}, computed {actual:#010x}"));
        }
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        Ok(SinkState {
            subtask: u32::from_le_bytes(bytes[1..5].try_into().expect("4 bytes")),
            epoch: u64_at(5),
            end: WalPos {
                seg: u64_at(13),
                off: u64_at(21),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn encode_all(records: &[(u64, Vec<u8>)]) -> Vec<u8> {
        let mut buf = Vec::new();
        for (e, p) in records {
            encode_frame(&mut buf, *e, p).unwrap();
        }
        buf
    }

    proptest! {
        #[test]
        fn frames_roundtrip(records in proptest::collection::vec((any::<u64>(), proptest::collection::vec(any::<u8>(), 0..300)), 0..20)) {
            let buf = encode_all(&records);
            let d = decode_all(&buf);
            prop_assert_eq!(d.stop, None);
            prop_assert_eq!(d.valid_bytes, buf.len());
            let got: Vec<(u64, Vec<u8>)> = d.frames.iter().map(|(e, p)| (*e, p.to_vec())).collect();
            prop_assert_eq!(got, records);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2000)) {
            let d = decode_all(&bytes);
            prop_assert!(d.valid_bytes <= bytes.len());
            let _ = check_segment_header(&bytes, 1, 0);
            let _ = SinkState::decode(&bytes);
        }

        /// Changing any byte of any frame is detected: decoding stops at or
        /// before the damaged frame, never returns a damaged record.
        #[test]
        fn every_byte_change_is_detected(
            records in proptest::collection::vec((0u64..1000, proptest::collection::vec(any::<u8>(), 0..100)), 1..10),
            pick in any::<prop::sample::Index>(),
            xor in 1u8..=255,
        ) {
            let mut buf = encode_all(&records);
            let i = pick.index(buf.len());
            buf[i] ^= xor;
            let d = decode_all(&buf);
            prop_assert!(d.stop.is_some(), "damage at byte {} went unnoticed", i);
            prop_assert!(d.valid_bytes <= i, "decoding went past the damaged byte {}", i);
            for (k, (e, p)) in d.frames.iter().enumerate() {
                prop_assert_eq!((*e, p.to_vec()), records[k].clone());
            }
        }

        /// Cutting the buffer anywhere inside a frame leaves a torn tail
        /// (incomplete), never a wrong record.
        #[test]
        fn truncation_is_an_incomplete_tail(
            records in proptest::collection::vec((any::<u64>(), proptest::collection::vec(any::<u8>(), 0..100)), 1..10),
            pick in any::<prop::sample::Index>(),
        ) {
            let buf = encode_all(&records);
            let cut = pick.index(buf.len());
            let d = decode_all(&buf[..cut]);
            let whole: usize = {
                let mut at = 0;
                let mut n = 0;
                for (_, p) in &records {
                    if at + HEADER_BYTES + p.len() > cut { break; }
                    at += HEADER_BYTES + p.len();
                    n += 1;
                }
                n
            };
            prop_assert_eq!(d.frames.len(), whole);
            if d.valid_bytes < cut {
                prop_assert_eq!(d.stop, Some(Decoded::Incomplete));
            }
        }

        #[test]
        fn state_roundtrips_and_detects_damage(subtask: u32, epoch: u64, seg: u64, off: u64, i in 0usize..STATE_BYTES, xor in 1u8..=255) {
            let s = SinkState { subtask, epoch, end: WalPos { seg, off } };
            let mut bytes = s.encode();
            prop_assert_eq!(SinkState::decode(&bytes), Ok(s));
            bytes[i] ^= xor;
            prop_assert!(SinkState::decode(&bytes).is_err());
        }
    }

    #[test]
    fn oversized_records_are_refused_and_oversized_lengths_are_corrupt() {
        let mut buf = vec![1, 2, 3];
        let at = begin_frame(&mut buf);
        buf.resize(at + HEADER_BYTES + MAX_PAYLOAD_BYTES + 1, 0);
        assert_eq!(finish_frame(&mut buf, at, 1), Err(MAX_PAYLOAD_BYTES + 1));
        assert_eq!(buf, vec![1, 2, 3], "the refused frame is removed");
        let mut header = [0u8; HEADER_BYTES];
        header[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(decode_frame(&header), Decoded::Corrupt(_)));
    }

    #[test]
    fn segment_headers_check_magic_sequence_and_subtask() {
        let h = segment_header(5, 2);
        assert_eq!(check_segment_header(&h, 5, 2), Ok(()));
        assert!(check_segment_header(&h, 6, 2).unwrap_err().contains("segment 5"));
        assert!(check_segment_header(&h, 5, 3).is_err());
        assert!(check_segment_header(&h[..10], 5, 2).is_err());
        let mut bad = h;
        bad[9] ^= 1;
        assert!(check_segment_header(&bad, 5, 2).unwrap_err().contains("CRC"));
    }
}
