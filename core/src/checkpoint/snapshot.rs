//! One task's part of a checkpoint: what it collects at the barrier, where
//! that goes, and the acknowledgement it sends.
//!
//! At the barrier (synchronous part) each operator of the chain adds its
//! state: the source its offset, keyed operators their state (as bytes, or
//! as an asynchronous job for the memory-mapped backend), sinks what they
//! pre-committed, exchanges the records an unaligned barrier overtook. A
//! small state with no asynchronous job is framed at once and acknowledged
//! inline (it goes into the manifest). Otherwise the asynchronous part runs
//! on the rayon pool: it runs the state jobs and writes the task's state
//! file, then acknowledges.
//!
//! Task state frame (a task file's contents, or an inline state): `WEIRTSK2`
//! magic, payload length (u64 LE), payload (postcard-encoded [`TaskState`]),
//! CRC32 of the payload (u32 LE). The manifest also records the frame's
//! size and whole-frame CRC32.
//!
//! The magic's digit is the payload's format version. Format 2 added the
//! watermarks of channel state (see [`super::channel`]) and the event time
//! of a task's inputs at the snapshot, after the fields of format 1;
//! frames of format 1 (`WEIRTSK1`) are still read, as states without
//! either (their in-flight records replay without watermarks, and event
//! time starts again from the beginning, as it did when they were
//! written).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::channel::{check_positions, ChannelWatermarks};
use super::signals::{Event, TaskCheckpointing};
use super::storage::{self, FileRef};
use crate::error::BoxError;

/// Magic at the start of every task state frame written: format 2.
pub(crate) const TASK_MAGIC: &[u8; 8] = b"WEIRTSK2";

/// Magic of task state format 1 (before channel state had watermarks):
/// still read.
pub(crate) const TASK_MAGIC_V1: &[u8; 8] = b"WEIRTSK1";

/// Serde for a list of `(index, bytes)`, the bytes as byte strings.
mod blobs {
    use serde::{Deserialize, Deserializer, Serializer};
    use serde_bytes::{ByteBuf, Bytes};

    pub(super) fn serialize<S: Serializer>(v: &[(u32, Vec<u8>)], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|(i, b)| (i, Bytes::new(b))))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(u32, Vec<u8>)>, D::Error> {
        let v: Vec<(u32, ByteBuf)> = Vec::deserialize(d)?;
        Ok(v.into_iter().map(|(i, b)| (i, b.into_vec())).collect())
    }
}

/// Everything one task stores in one checkpoint.
///
/// Byte strings are serialised as bytes (`serde_bytes`): one length and one
/// copy, where serde's default for `Vec<u8>` goes element by element (700
/// µs instead of tens for the 100 KB state of a keyed task). The encoding
/// is the same either way in postcard: a varint length, then the bytes.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct TaskState {
    pub(crate) checkpoint: u64,
    pub(crate) group: u32,
    pub(crate) subtask: u32,
    pub(crate) parallelism: u32,
    /// The source's offset at the barrier (source chains only).
    #[serde(with = "serde_bytes")]
    pub(crate) source_offset: Option<Vec<u8>>,
    /// Operator states by operator index in the chain.
    #[serde(with = "blobs")]
    pub(crate) operators: Vec<(u32, Vec<u8>)>,
    /// In-flight records per input channel (unaligned), encoded.
    #[serde(with = "blobs")]
    pub(crate) input_channels: Vec<(u32, Vec<u8>)>,
    /// Records staged for output channels that the barrier overtook.
    #[serde(with = "blobs")]
    pub(crate) output_channels: Vec<(u32, Vec<u8>)>,
    /// Records encoded in input and output channel state.
    pub(crate) channel_records: u64,
    /// Format 2: the watermarks among each input channel's in-flight
    /// records (unaligned), by position ([`super::channel`]).
    pub(crate) input_channel_watermarks: Vec<(u32, ChannelWatermarks)>,
    /// Format 2: the watermarks among each output channel's overtaken
    /// records (unaligned).
    pub(crate) output_channel_watermarks: Vec<(u32, ChannelWatermarks)>,
    /// Format 2, tasks with inputs: the watermark of each input at the
    /// snapshot, and the task's own (what its chain had been given).
    pub(crate) input_event_time: Option<InputEventTime>,
}

/// The payload of task state format 1 (`WEIRTSK1`): format 2 without its
/// last three fields.
#[derive(Deserialize)]
struct TaskStateV1 {
    checkpoint: u64,
    group: u32,
    subtask: u32,
    parallelism: u32,
    #[serde(with = "serde_bytes")]
    source_offset: Option<Vec<u8>>,
    #[serde(with = "blobs")]
    operators: Vec<(u32, Vec<u8>)>,
    #[serde(with = "blobs")]
    input_channels: Vec<(u32, Vec<u8>)>,
    #[serde(with = "blobs")]
    output_channels: Vec<(u32, Vec<u8>)>,
    channel_records: u64,
}

impl From<TaskStateV1> for TaskState {
    fn from(v: TaskStateV1) -> Self {
        TaskState {
            checkpoint: v.checkpoint,
            group: v.group,
            subtask: v.subtask,
            parallelism: v.parallelism,
            source_offset: v.source_offset,
            operators: v.operators,
            input_channels: v.input_channels,
            output_channels: v.output_channels,
            channel_records: v.channel_records,
            input_channel_watermarks: Vec::new(),
            output_channel_watermarks: Vec::new(),
            input_event_time: None,
        }
    }
}

impl TaskState {
    pub(crate) fn operator(&self, op: usize) -> Option<&[u8]> {
        self.operators
            .iter()
            .find(|(i, _)| *i as usize == op)
            .map(|(_, b)| b.as_slice())
    }

    pub(crate) fn channel_bytes(&self) -> u64 {
        self.input_channels
            .iter()
            .chain(&self.output_channels)
            .map(|(_, b)| b.len() as u64)
            .sum()
    }

    pub(crate) fn state_bytes(&self) -> u64 {
        self.operators.iter().map(|(_, b)| b.len() as u64).sum::<u64>()
            + self.source_offset.as_ref().map_or(0, |o| o.len() as u64)
    }

    /// The file format described in the module docs.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let payload = postcard::to_stdvec(self).expect("task state always encodes");
        let mut out = Vec::with_capacity(payload.len() + 20);
        out.extend_from_slice(TASK_MAGIC);
        out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        out.extend_from_slice(&payload);
        out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        out
    }

    /// Decodes and verifies a task state file's bytes (format 2, or 1);
    /// `what` names the file in errors.
    pub(crate) fn decode(bytes: &[u8], what: &str) -> Result<Self, String> {
        if bytes.len() < 20 || (&bytes[..8] != TASK_MAGIC && &bytes[..8] != TASK_MAGIC_V1) {
            return Err(format!(
                "{what}: not a task state file (bad magic at bytes 0..8, or shorter than 20 bytes)"
            ));
        }
        let v1 = &bytes[..8] == TASK_MAGIC_V1;
        // Compared as read: a length near u64::MAX must not overflow.
        let field = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
        let len = bytes.len() - 20;
        if field != len as u64 {
            return Err(format!(
                "{what}: length field at byte 8 says {field} bytes of payload but the file has {len}"
            ));
        }
        let payload = &bytes[16..16 + len];
        let expected = u32::from_le_bytes(bytes[16 + len..].try_into().expect("4 bytes"));
        let actual = crc32fast::hash(payload);
        if expected != actual {
            return Err(format!(
                "{what}: payload CRC mismatch at offset 16..{}: expected {expected:08x}, actual {actual:08x}",
                16 + len
            ));
        }
        let undecodable =
            |e: postcard::Error| format!("{what}: payload at bytes 16..{} does not decode: {e}", 16 + len);
        let state: TaskState = if v1 {
            postcard::from_bytes::<TaskStateV1>(payload)
                .map_err(undecodable)?
                .into()
        } else {
            postcard::from_bytes(payload).map_err(undecodable)?
        };
        for (kind, lists) in [
            ("input", &state.input_channel_watermarks),
            ("output", &state.output_channel_watermarks),
        ] {
            for (k, w) in lists {
                check_positions(w, &format!("{what}: {kind} channel {k}"))?;
            }
        }
        Ok(state)
    }
}

/// An asynchronous piece of a snapshot (the memory-mapped state backend's
/// page writer): runs off the task thread and returns state bytes to store
/// in the task state (a serialised state handle) and the shared files the
/// checkpoint relies on.
pub(crate) type AsyncStateJob = Box<dyn FnOnce(&Path) -> Result<AsyncOutput, BoxError> + Send>;

/// What an [`AsyncStateJob`] produced.
pub(crate) struct AsyncOutput {
    /// Bytes stored in the task state under the operator's index.
    pub(crate) state: Vec<u8>,
    /// Shared files the state relies on.
    pub(crate) files: Vec<FileRef>,
    /// Logical size of the state.
    pub(crate) state_bytes: u64,
    /// Files were renamed into `shared/` whose folder entries are not yet
    /// durable: the coordinator fsyncs `shared/` before the manifest.
    pub(crate) wrote_shared: bool,
}

/// What a task collects while handling a barrier.
pub(crate) struct TaskSnapshot {
    pub(crate) state: TaskState,
    pub(crate) async_jobs: Vec<(u32, AsyncStateJob)>,
    /// When the first barrier of this checkpoint reached the task.
    pub(crate) first_barrier_ns: u64,
    pub(crate) alignment_ns: u64,
    pub(crate) sync_ns: u64,
    /// The final checkpoint of a bounded job.
    pub(crate) is_final: bool,
    /// The largest task state that goes inline into the manifest
    /// (`CheckpointConfig::inline_state_max`); state-backend stores whose
    /// full snapshots fit are copied whole (in steps after the barrier) and
    /// packed on the snapshot pool, with no file of their own.
    pub(crate) inline_max: usize,
}

impl TaskSnapshot {
    pub(crate) fn new(id: u64, group: usize, subtask: usize, parallelism: usize, inline_max: usize) -> Self {
        TaskSnapshot {
            state: TaskState {
                checkpoint: id,
                group: group as u32,
                subtask: subtask as u32,
                parallelism: parallelism as u32,
                ..TaskState::default()
            },
            async_jobs: Vec::new(),
            first_barrier_ns: 0,
            alignment_ns: 0,
            sync_ns: 0,
            is_final: false,
            inline_max,
        }
    }

    pub(crate) fn id(&self) -> u64 {
        self.state.checkpoint
    }

    /// Adds operator `op`'s synchronous state.
    pub(crate) fn put_operator(&mut self, op: usize, bytes: Vec<u8>) {
        self.state.operators.push((op as u32, bytes));
    }

    /// Adds operator `op`'s asynchronous state job.
    pub(crate) fn put_async(&mut self, op: usize, job: AsyncStateJob) {
        self.async_jobs.push((op as u32, job));
    }
}

/// Where an acknowledged task state is.
#[derive(Debug, Clone)]
pub(crate) enum AckedState {
    /// In its own file, written (durability deferred to the coordinator's
    /// filesystem sync).
    File(FileRef),
    /// Framed, to go into the manifest's inline part.
    Inline(Vec<u8>),
}

/// A task's acknowledgement of a checkpoint.
#[derive(Debug, Clone)]
pub(crate) struct TaskAck {
    pub(crate) id: u64,
    pub(crate) task: usize,
    /// The incarnation of the task that took the snapshot
    /// ([`TaskCheckpointing::generation`]).
    pub(crate) generation: u64,
    pub(crate) state: AckedState,
    /// Files in `shared/` (state backend) this task's state relies on.
    pub(crate) shared_files: Vec<FileRef>,
    /// See [`AsyncOutput::wrote_shared`].
    pub(crate) wrote_shared: bool,
    pub(crate) state_bytes: u64,
    pub(crate) channel_state_bytes: u64,
    pub(crate) sync_ns: u64,
    pub(crate) async_ns: u64,
    pub(crate) alignment_ns: u64,
}

/// Finishes a task's part of a checkpoint after its synchronous part.
///
/// A small state with no state-backend work left (the common case: source
/// offsets, sink transactions, small heap state) is framed here, on the
/// task's thread, and acknowledged at once: it goes inline into the
/// manifest, with no file and no hand-off to another thread, each of which
/// costs the checkpoint time on a machine whose cores are busy. Anything
/// else is written to files on the job's snapshot pool and acknowledged
/// from there.
pub(crate) fn complete(snapshot: TaskSnapshot, ck: &TaskCheckpointing) {
    let small = snapshot.state.state_bytes() + snapshot.state.channel_bytes();
    if snapshot.async_jobs.is_empty() && small <= ck.inline_max as u64 {
        let start = Instant::now();
        let frame = snapshot.state.encode();
        if frame.len() > ck.inline_max {
            // The framing took it over the bound: a file after all.
            return write_off_thread(snapshot, ck);
        }
        ck.send(Event::Ack(Box::new(TaskAck {
            id: snapshot.id(),
            task: ck.task,
            generation: ck.generation,
            state: AckedState::Inline(frame),
            shared_files: Vec::new(),
            wrote_shared: false,
            state_bytes: snapshot.state.state_bytes(),
            channel_state_bytes: snapshot.state.channel_bytes(),
            sync_ns: snapshot.sync_ns,
            async_ns: start.elapsed().as_nanos() as u64,
            alignment_ns: snapshot.alignment_ns,
        })));
        return;
    }
    write_off_thread(snapshot, ck);
}

/// Runs the state jobs and writes the task state on the snapshot pool.
fn write_off_thread(snapshot: TaskSnapshot, ck: &TaskCheckpointing) {
    let ck = ck.clone();
    let pool = Arc::clone(&ck.pool);
    // Counted until it is done: the attempt's end waits for it.
    let counted = ck.signals.snapshot_job();
    // Through the spawner: a worker never waits on the pool's locks.
    pool.spawn(move || {
        let _counted = counted;
        let id = snapshot.id();
        let task = ck.task;
        match write_task_state(snapshot, &ck) {
            Ok(ack) => ck.send(Event::Ack(Box::new(ack))),
            Err(reason) => ck.send(Event::Decline { id, task, reason }),
        }
    });
}

fn write_task_state(mut snapshot: TaskSnapshot, ck: &TaskCheckpointing) -> Result<TaskAck, String> {
    let async_start = Instant::now();
    let id = snapshot.id();
    let mut shared_files = Vec::new();
    let mut wrote_shared = false;
    let mut backend_bytes = 0;
    for (op, job) in std::mem::take(&mut snapshot.async_jobs) {
        let out = job(&ck.root).map_err(|e| format!("operator {op}: asynchronous snapshot failed: {e}"))?;
        snapshot.state.operators.push((op, out.state));
        shared_files.extend(out.files);
        wrote_shared |= out.wrote_shared;
        backend_bytes += out.state_bytes;
    }
    let bytes = snapshot.state.encode();
    // What the state jobs left (their handles, channel state) is usually
    // small: inline too, which saves a file and its sync.
    let state = if bytes.len() <= ck.inline_max {
        AckedState::Inline(bytes)
    } else {
        let dir = storage::checkpoint_dir(&ck.root, id);
        let name = storage::task_file_name(snapshot.state.group as usize, snapshot.state.subtask as usize);
        let file = storage::write_durable(&ck.root, &dir, &name, &bytes, storage::DirSync::Deferred)
            .map_err(|e| format!("writing {}: {e}", dir.join(&name).display()))?;
        AckedState::File(file)
    };
    Ok(TaskAck {
        id,
        task: ck.task,
        generation: ck.generation,
        state,
        shared_files,
        wrote_shared,
        state_bytes: snapshot.state.state_bytes() + backend_bytes,
        channel_state_bytes: snapshot.state.channel_bytes(),
        sync_ns: snapshot.sync_ns,
        async_ns: async_start.elapsed().as_nanos() as u64,
        alignment_ns: snapshot.alignment_ns,
    })
}

/// The event time of a task's inputs at a snapshot (task state format 2,
/// exactly-once modes): each input channel's watermark and idleness, and
/// the combined watermark the task had handed its chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct InputEventTime {
    /// Per input channel: its largest watermark, and whether it is idle.
    pub(crate) channels: Vec<(i64, bool)>,
    /// The combined watermark handed to the chain.
    pub(crate) emitted: i64,
    /// The task had told its chain it is idle.
    pub(crate) emitted_idle: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Format 1's payload, field by field, with plain vectors.
    #[derive(Serialize)]
    struct PlainV1 {
        checkpoint: u64,
        group: u32,
        subtask: u32,
        parallelism: u32,
        source_offset: Option<Vec<u8>>,
        operators: Vec<(u32, Vec<u8>)>,
        input_channels: Vec<(u32, Vec<u8>)>,
        output_channels: Vec<(u32, Vec<u8>)>,
        channel_records: u64,
    }

    fn v1_of(st: &TaskState) -> PlainV1 {
        PlainV1 {
            checkpoint: st.checkpoint,
            group: st.group,
            subtask: st.subtask,
            parallelism: st.parallelism,
            source_offset: st.source_offset.clone(),
            operators: st.operators.clone(),
            input_channels: st.input_channels.clone(),
            output_channels: st.output_channels.clone(),
            channel_records: st.channel_records,
        }
    }

    fn frame(magic: &[u8; 8], payload: &[u8]) -> Vec<u8> {
        let mut out = magic.to_vec();
        out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        out.extend_from_slice(payload);
        out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
        out
    }

    fn sample() -> TaskState {
        TaskState {
            checkpoint: 9,
            group: 1,
            subtask: 0,
            parallelism: 2,
            source_offset: Some((0..=255).collect()),
            operators: vec![(0, vec![7; 300]), (2, vec![])],
            input_channels: vec![(1, (0..200).collect())],
            output_channels: vec![(0, vec![1])],
            channel_records: 3,
            input_channel_watermarks: vec![(1, vec![(0, 5), (2, i64::MIN)])],
            output_channel_watermarks: vec![(0, vec![(1, 40)])],
            input_event_time: Some(InputEventTime {
                channels: vec![(3, false), (i64::MIN + 1, true)],
                emitted: 3,
                emitted_idle: false,
            }),
        }
    }

    /// The byte-string encoding is postcard's encoding of the plain
    /// `Vec<u8>` fields, and format 2 is format 1 with its fields appended:
    /// task files written before either change read back.
    #[test]
    fn byte_strings_encode_like_plain_vectors() {
        #[derive(Serialize)]
        struct Plain {
            v1: PlainV1,
            input_channel_watermarks: Vec<(u32, Vec<(u64, i64)>)>,
            output_channel_watermarks: Vec<(u32, Vec<(u64, i64)>)>,
            input_event_time: Option<InputEventTime>,
        }
        let st = sample();
        let plain = Plain {
            v1: v1_of(&st),
            input_channel_watermarks: st.input_channel_watermarks.clone(),
            output_channel_watermarks: st.output_channel_watermarks.clone(),
            input_event_time: st.input_event_time.clone(),
        };
        let ours = postcard::to_stdvec(&st).unwrap();
        assert_eq!(ours, postcard::to_stdvec(&plain).unwrap());
        assert_eq!(postcard::from_bytes::<TaskState>(&ours).unwrap(), st);
        assert!(ours.starts_with(&postcard::to_stdvec(&v1_of(&st)).unwrap()));
    }

    /// A format 1 frame (`WEIRTSK1`) still restores: the same state,
    /// without watermarks or input event time.
    #[test]
    fn format_1_frames_decode_without_watermarks() {
        let st = sample();
        let bytes = frame(TASK_MAGIC_V1, &postcard::to_stdvec(&v1_of(&st)).unwrap());
        let back = TaskState::decode(&bytes, "old").unwrap();
        let expected = TaskState {
            input_channel_watermarks: Vec::new(),
            output_channel_watermarks: Vec::new(),
            input_event_time: None,
            ..st
        };
        assert_eq!(back, expected);
        assert!(back.encode().starts_with(TASK_MAGIC), "written again as format 2");
    }

    /// A length field near `u64::MAX` overflowed the size check (a panic
    /// with overflow checks on).
    #[test]
    fn a_huge_length_field_is_an_error() {
        let mut bytes = TaskState::default().encode();
        for field in [u64::MAX, u64::MAX - 15, u64::MAX - 19, 1 << 63] {
            bytes[8..16].copy_from_slice(&field.to_le_bytes());
            let e = TaskState::decode(&bytes, "f").unwrap_err();
            assert!(e.contains("length field at byte 8"), "{e}");
        }
    }

    /// Every bit of every byte flipped, one at a time, is refused. A
    /// restore that falls back (`RestoreFrom::LatestValid`) reports a task
    /// file that does not decode at byte 0 (`recovery::load_located`): at
    /// or before any flipped byte, so refusing is all a position needs.
    #[test]
    fn task_state_roundtrip_and_every_corruption_detected() {
        let st = sample();
        let bytes = st.encode();
        assert_eq!(TaskState::decode(&bytes, "f").unwrap(), st);
        for (i, bit, b) in crate::fuzzing::bit_flips(&bytes) {
            assert!(
                TaskState::decode(&b, "f").is_err(),
                "flip of bit {bit} at {i} not detected"
            );
        }
        for len in 0..bytes.len() {
            assert!(
                TaskState::decode(&bytes[..len], "f").is_err(),
                "truncation to {len} not detected"
            );
        }
    }

    /// Watermark positions that go backwards are refused when the frame is
    /// read, with the file and the channel named.
    #[test]
    fn decreasing_watermark_positions_are_refused_with_the_file() {
        let mut st = sample();
        st.input_channel_watermarks = vec![(1, vec![(3, 5), (2, 6)])];
        let err = TaskState::decode(&st.encode(), "chk-1/task-001-000.state").unwrap_err();
        assert!(
            err.contains("chk-1/task-001-000.state") && err.contains("input channel 1"),
            "{err}"
        );
    }

    fn marks() -> impl Strategy<Value = Vec<(u32, Vec<(u64, i64)>)>> {
        proptest::collection::vec(
            (
                any::<u32>(),
                proptest::collection::vec((0u64..1_000, any::<i64>()), 0..8).prop_map(|mut v| {
                    v.sort_by_key(|m| m.0);
                    v
                }),
            ),
            0..4,
        )
    }

    fn state() -> impl Strategy<Value = TaskState> {
        (
            any::<(u64, u32, u32, u32)>(),
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..16)),
            proptest::collection::vec((any::<u32>(), proptest::collection::vec(any::<u8>(), 0..32)), 0..4),
            proptest::collection::vec((any::<u32>(), proptest::collection::vec(any::<u8>(), 0..32)), 0..3),
            (marks(), marks()),
            proptest::option::of((
                proptest::collection::vec(any::<(i64, bool)>(), 0..6),
                any::<(i64, bool)>(),
            )),
        )
            .prop_map(
                |((checkpoint, group, subtask, parallelism), offset, inputs, outputs, (im, om), time)| TaskState {
                    checkpoint,
                    group,
                    subtask,
                    parallelism,
                    source_offset: offset,
                    operators: vec![(0, vec![1, 2, 3])],
                    channel_records: inputs.len() as u64,
                    input_channels: inputs,
                    output_channels: outputs,
                    input_channel_watermarks: im,
                    output_channel_watermarks: om,
                    input_event_time: time.map(|(channels, (emitted, emitted_idle))| InputEventTime {
                        channels,
                        emitted,
                        emitted_idle,
                    }),
                },
            )
    }

    proptest! {
        /// Format 2 round-trips, and a flipped bit anywhere in the frame or
        /// a cut anywhere is reported, never decoded into another state.
        #[test]
        fn format_2_roundtrips_and_corruption_is_detected(st in state(), flip in any::<prop::sample::Index>(), bit in 0u8..8) {
            let bytes = st.encode();
            prop_assert_eq!(&TaskState::decode(&bytes, "f").unwrap(), &st);
            let mut b = bytes.clone();
            let i = flip.index(b.len());
            b[i] ^= 1 << bit;
            // One flipped bit of the magic never turns `2` into `1`; any
            // other is caught by the length or the CRC.
            prop_assert!(TaskState::decode(&b, "f").is_err(), "flip of bit {} at {} not detected", bit, i);
            prop_assert!(TaskState::decode(&bytes[..i], "f").is_err());
        }

        /// Format 1 frames of any content decode to the same fields.
        #[test]
        fn format_1_decodes_to_the_same_fields(st in state()) {
            let bytes = frame(TASK_MAGIC_V1, &postcard::to_stdvec(&v1_of(&st)).unwrap());
            let back = TaskState::decode(&bytes, "f").unwrap();
            prop_assert_eq!(back.input_channels, st.input_channels);
            prop_assert_eq!(back.output_channels, st.output_channels);
            prop_assert_eq!(back.source_offset, st.source_offset);
            prop_assert!(back.input_channel_watermarks.is_empty() && back.input_event_time.is_none());
        }
    }
}
