//! What a snapshot hands to the checkpoint coordinator: the files a restore
//! needs, and enough about their layout to refuse a mismatched restore.

use std::ops::Range;

use serde::{Deserialize, Serialize};

/// The kind of keyed state a file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StateKind {
    /// One inline value per key ([`crate::state::ValueStore`]).
    Value,
    /// Per key, a map from user key to value ([`crate::state::MapStore`]).
    Map,
    /// Per key, an append-only list ([`crate::state::ListStore`]).
    List,
}

/// The byte layout of the slots of a store; a restore refuses handles
/// written with another layout (another key or value type, page size or
/// value capacity).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotLayout {
    /// Which state this is.
    pub kind: StateKind,
    /// Page size in bytes.
    pub page_size: u32,
    /// Bytes per slot (header, key, value, padding).
    pub slot_size: u32,
    /// Bytes of the key area, at offset 8 of a slot.
    pub key_bytes: u32,
    /// Offset of the value area in a slot.
    pub value_offset: u32,
    /// Bytes of the value area.
    pub value_bytes: u32,
}

/// One file of a snapshot, immutable once written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateFile {
    /// Path relative to the checkpoint root, `shared/<unique>.pages`.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// CRC32 (IEEE, as `crc32fast`) of the whole file.
    pub crc32: u32,
}

/// A completed snapshot of one store: what the coordinator records in the
/// checkpoint manifest and passes back to `restore`.
///
/// `files` lists every file a restore reads, in the order it applies them
/// (or `inline` holds the one full snapshot, see [`StateHandle::inline`]):
/// the full base snapshot first, then each incremental one, the last being
/// the file this checkpoint wrote. Earlier files are shared with the
/// checkpoints they were written by.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateHandle {
    /// The checkpoint this snapshot belongs to.
    pub checkpoint_id: u64,
    /// The job's number of key groups.
    pub max_parallelism: usize,
    /// The key groups the snapshotted store owned.
    pub key_groups: Range<usize>,
    /// The slot layout of the files.
    pub layout: SlotLayout,
    /// Every file a restore needs, base first; empty for an inline
    /// snapshot.
    pub files: Vec<StateFile>,
    /// A full snapshot carried in the handle itself rather than in a file:
    /// the bytes of a snapshot file (same format, checked the same way on
    /// restore). Small stores are snapshotted so at the barrier (see
    /// [`crate::checkpoint::CheckpointConfig::inline_state_max`]); such a
    /// snapshot is never the base of an incremental one.
    #[serde(with = "serde_bytes")]
    pub inline: Option<Vec<u8>>,
    /// Logical size of the state: allocated pages times page size (the
    /// size of a full snapshot's page data).
    pub state_bytes: u64,
    /// Bytes this checkpoint wrote (its own file only).
    pub written_bytes: u64,
    /// Microseconds the task spent in the synchronous part at the barrier.
    pub sync_micros: u64,
    /// Microseconds of the asynchronous part (capture, checksums, write).
    pub async_micros: u64,
    /// Whether this checkpoint's own file is a full snapshot (`files` has
    /// one entry) rather than an increment.
    pub full: bool,
}
