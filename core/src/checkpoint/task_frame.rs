//! Task state frames, read from outside the runtime: the decoder a restore
//! runs, public, for tools that look into a checkpoint (`weir checkpoints
//! inspect` and `verify`).
//!
//! A task state frame is a task state file's contents (`task-GGG-SSS.state`)
//! or an inline state in a manifest ([`super::storage`]): `WEIRTSK2` magic
//! (`WEIRTSK1` for format 1, still read; bytes 0..8), the payload length `L`
//! as u64 LE (bytes 8..16), the payload (bytes `16..16+L`, the task's state
//! as postcard), then the CRC32 of the payload as u32 LE (bytes
//! `16+L..20+L`). See `docs/design/checkpoints.md`.
//!
//! [`decode_task_frame`] is not a second reader of that format: it calls
//! the one a restore calls, which checks the magic, the length field
//! against the frame's size, the payload's CRC32, the payload's encoding and
//! the positions of the channel watermarks in it, and refuses the frame at
//! the first failed check with a message naming the frame (`what`) and the
//! bytes that failed (for example `payload CRC mismatch at offset 16..N:
//! expected .., actual ..`). What it returns is a summary of the decoded
//! state: sizes and indexes, never the state bytes themselves (those are
//! the operators' own formats, read by the operators on restore).

use super::snapshot::{TaskState, TASK_MAGIC_V1};

/// Bytes of a frame around its payload: magic, length, CRC.
pub const TASK_FRAME_OVERHEAD: u64 = 8 + 8 + 4;

/// What a task state frame holds, as [`decode_task_frame`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskFrame {
    /// The format: 2 (`WEIRTSK2`, written now) or 1 (`WEIRTSK1`).
    pub format: u32,
    /// The magic as stored (bytes 0..8).
    pub magic: [u8; 8],
    /// Payload bytes (the length field, bytes 8..16; the frame has
    /// [`TASK_FRAME_OVERHEAD`] more).
    pub payload_bytes: u64,
    /// The payload's CRC32 (stored after it, and verified).
    pub payload_crc32: u32,
    /// The checkpoint the task state belongs to.
    pub checkpoint: u64,
    /// The task's chain (group) in the job graph.
    pub group: u32,
    /// The task's subtask index.
    pub subtask: u32,
    /// The chain's parallelism when the state was taken.
    pub parallelism: u32,
    /// Bytes of the source's offset (source chains only).
    pub source_offset_bytes: Option<u64>,
    /// Operator states: `(operator index in the chain, bytes)`.
    pub operators: Vec<(u32, u64)>,
    /// In-flight records of input channels (unaligned checkpoints):
    /// `(channel, bytes)`.
    pub input_channels: Vec<(u32, u64)>,
    /// Records staged for output channels that the barrier overtook:
    /// `(channel, bytes)`.
    pub output_channels: Vec<(u32, u64)>,
    /// Records in the channel state, input and output.
    pub channel_records: u64,
    /// Whether the state records the event time of the task's inputs
    /// (format 2, tasks with inputs).
    pub has_input_event_time: bool,
}

impl TaskFrame {
    /// Bytes of operator state and source offset (what a manifest lists as
    /// the task's `state_bytes`).
    pub fn state_bytes(&self) -> u64 {
        self.operators.iter().map(|(_, b)| b).sum::<u64>() + self.source_offset_bytes.unwrap_or(0)
    }

    /// Bytes of channel state (a manifest's `channel_state_bytes`).
    pub fn channel_bytes(&self) -> u64 {
        self.input_channels
            .iter()
            .chain(&self.output_channels)
            .map(|(_, b)| b)
            .sum()
    }
}

/// Decodes and verifies a task state frame (a task state file's bytes, or
/// an inline state's slice of a manifest) exactly as a restore does;
/// `what` names the frame in errors (the file, or the manifest and the
/// inline state's offset), and every error says which bytes failed.
pub fn decode_task_frame(bytes: &[u8], what: &str) -> Result<TaskFrame, String> {
    let state = TaskState::decode(bytes, what)?;
    // Decoded: the frame is at least 20 bytes, its magic one of the two,
    // its length field its size less 20, its CRC the payload's.
    let magic: [u8; 8] = bytes[..8].try_into().expect("checked by the decoder");
    let payload_bytes = bytes.len() as u64 - TASK_FRAME_OVERHEAD;
    let payload_crc32 = u32::from_le_bytes(bytes[bytes.len() - 4..].try_into().expect("4 bytes"));
    let sizes = |list: &[(u32, Vec<u8>)]| list.iter().map(|(i, b)| (*i, b.len() as u64)).collect();
    Ok(TaskFrame {
        format: if &magic == TASK_MAGIC_V1 { 1 } else { 2 },
        magic,
        payload_bytes,
        payload_crc32,
        checkpoint: state.checkpoint,
        group: state.group,
        subtask: state.subtask,
        parallelism: state.parallelism,
        source_offset_bytes: state.source_offset.as_ref().map(|o| o.len() as u64),
        operators: sizes(&state.operators),
        input_channels: sizes(&state.input_channels),
        output_channels: sizes(&state.output_channels),
        channel_records: state.channel_records,
        has_input_event_time: state.input_event_time.is_some(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> TaskState {
        TaskState {
            checkpoint: 7,
            group: 1,
            subtask: 2,
            parallelism: 3,
            source_offset: Some(vec![1, 2, 3]),
            operators: vec![(0, vec![9; 10]), (2, vec![8; 5])],
            input_channels: vec![(1, vec![7; 4])],
            channel_records: 2,
            ..TaskState::default()
        }
    }

    #[test]
    fn a_frame_decodes_to_its_summary() {
        let st = state();
        let bytes = st.encode();
        let f = decode_task_frame(&bytes, "t").unwrap();
        assert_eq!(f.format, 2);
        assert_eq!(&f.magic, b"WEIRTSK2");
        assert_eq!(f.payload_bytes, bytes.len() as u64 - TASK_FRAME_OVERHEAD);
        assert_eq!(
            f.payload_crc32,
            crc32fast::hash(&bytes[16..bytes.len() - 4]),
            "the stored CRC"
        );
        assert_eq!((f.checkpoint, f.group, f.subtask, f.parallelism), (7, 1, 2, 3));
        assert_eq!(f.operators, vec![(0, 10), (2, 5)]);
        assert_eq!(f.source_offset_bytes, Some(3));
        assert_eq!(f.state_bytes(), st.state_bytes());
        assert_eq!(f.channel_bytes(), st.channel_bytes());
        assert_eq!(f.channel_records, 2);
        assert!(!f.has_input_event_time);
    }

    /// Every flipped bit and every cut is refused, naming the frame and
    /// the bytes that failed, as a restore refuses it (the same decoder).
    #[test]
    fn every_flip_and_cut_is_refused_with_the_frame_and_the_bytes() {
        let bytes = state().encode();
        let n = bytes.len();
        for (i, bit, b) in crate::fuzzing::bit_flips(&bytes) {
            let e = decode_task_frame(&b, "task file F").unwrap_err();
            assert!(e.starts_with("task file F: "), "flip of bit {bit} at {i}: {e}");
            let expected = match i {
                0..=7 => "bad magic at bytes 0..8",
                8..=15 => "length field at byte 8",
                _ => "payload CRC mismatch at offset 16..",
            };
            assert!(e.contains(expected), "flip of bit {bit} at {i}: {e}");
            assert_eq!(e, TaskState::decode(&b, "task file F").unwrap_err());
        }
        for len in 0..n {
            let e = decode_task_frame(&bytes[..len], "F").unwrap_err();
            assert!(e.starts_with("F: "), "cut at {len}: {e}");
        }
    }
}
