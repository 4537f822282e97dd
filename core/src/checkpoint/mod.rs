//! Consistent checkpoints by asynchronous barrier snapshotting, and
//! recovery from them.
//!
//! A coordinator (its own thread) triggers checkpoint `n`; every source
//! injects barrier `n` between two batches and stores its offset; every task
//! snapshots its operators' state when barrier `n` has passed (how depends
//! on the [`CheckpointMode`]) and acknowledges with the files it wrote; when
//! every task has acknowledged, the coordinator writes the manifest durably
//! and the checkpoint is complete. Sinks commit on the completion notice.
//! On failure, the job restarts by its [`RestartStrategy`] from the latest
//! completed checkpoint: operator state restored, sources rewound to their
//! offsets, in-flight records of an unaligned checkpoint replayed first.
//!
//! See `docs/design/checkpoints.md` for the modes and file layout, and
//! `docs/guide/configuration.md` for the settings.

pub(crate) mod channel;
mod config;
pub(crate) mod coordinator;
pub(crate) mod recovery;
pub(crate) mod signals;
pub(crate) mod snapshot;
pub(crate) mod spawner;
pub(crate) mod stats;
pub mod storage;
pub mod task_frame;

pub use config::{
    CheckpointConfig, CheckpointMode, RestartStrategy, RestoreFrom, RetainOnCancel, DEFAULT_DEDUP_BACKUP_LIMIT,
    DEFAULT_INLINE_STATE_MAX, MAX_CONCURRENT, MAX_INLINE_STATE, MAX_RETAINED, MIN_INTERVAL,
};
pub use stats::{CheckpointRecord, CheckpointStats, FailedCheckpoint, RestartRecord, TaskCheckpointStats, MAX_HISTORY};
