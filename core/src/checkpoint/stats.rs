//! Checkpoint statistics exposed through [`crate::JobHandle::metrics`].

use std::collections::VecDeque;

/// Most checkpoint records kept in memory (the oldest are dropped).
pub const MAX_HISTORY: usize = 4096;

/// One task's share of a completed checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskCheckpointStats {
    /// Chain name.
    pub task: String,
    /// Subtask index.
    pub subtask: usize,
    /// Synchronous part at the barrier, µs.
    pub sync_us: u64,
    /// Asynchronous part (state jobs and file write), µs.
    pub async_us: u64,
    /// From the first barrier at this task to its snapshot, µs.
    pub alignment_us: u64,
    /// Operator state bytes.
    pub state_bytes: u64,
    /// In-flight records stored (unaligned), bytes.
    pub channel_state_bytes: u64,
}

/// One completed checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointRecord {
    /// Checkpoint id.
    pub id: u64,
    /// The final checkpoint of a bounded job.
    pub is_final: bool,
    /// Trigger time, ms since the job started.
    pub trigger_ms: f64,
    /// Trigger time, ms since the Unix epoch (as in the manifest).
    pub trigger_unix_ms: u64,
    /// Trigger to the last task's acknowledgement, µs: the duration the
    /// manifest records (and `weir checkpoints` shows).
    pub acked_us: u64,
    /// Trigger to durable manifest, µs.
    pub duration_us: u64,
    /// Operator state bytes, all tasks.
    pub state_bytes: u64,
    /// Channel state bytes, all tasks.
    pub channel_state_bytes: u64,
    /// Per task.
    pub tasks: Vec<TaskCheckpointStats>,
}

/// A checkpoint that was aborted (failed, declined or timed out).
#[derive(Debug, Clone, PartialEq)]
pub struct FailedCheckpoint {
    /// Checkpoint id.
    pub id: u64,
    /// Trigger time, ms since the Unix epoch.
    pub trigger_unix_ms: u64,
    /// Trigger to abort, µs.
    pub duration_us: u64,
    /// Why it was aborted.
    pub reason: String,
}

/// A restart of the job after a failure.
#[derive(Debug, Clone, PartialEq)]
pub struct RestartRecord {
    /// 1-based restart number.
    pub attempt: u32,
    /// The failure that caused it.
    pub error: String,
    /// The checkpoint the restarted job restored from (`None`: from scratch).
    pub restored_from: Option<u64>,
    /// Dedup mode: the subtask that recovered alone, `(operator chain,
    /// subtask)`, while the rest of the job ran on; `None` for a restart of
    /// the whole job.
    pub subtask: Option<(String, usize)>,
}

/// Checkpointing counters and history of a job.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CheckpointStats {
    /// Checkpoints completed.
    pub completed: u64,
    /// Checkpoints aborted (failed, declined or timed out).
    pub failed: u64,
    /// Checkpoints given up because a newer one completed first (with
    /// `max_concurrent` above 1): discarded like aborted ones, but not a
    /// failure (they count neither here nor towards `tolerable_failures`).
    pub subsumed: u64,
    /// Checkpoints triggered and neither completed nor aborted yet.
    pub in_progress: u64,
    /// The latest completed checkpoints, oldest first (at most [`MAX_HISTORY`]).
    pub history: VecDeque<CheckpointRecord>,
    /// The latest aborted checkpoints, oldest first (at most [`MAX_HISTORY`]).
    pub failures: VecDeque<FailedCheckpoint>,
    /// Restarts after failures.
    pub restarts: Vec<RestartRecord>,
    /// The checkpoint the job (first) started from, if any.
    pub restored_from: Option<u64>,
}

impl CheckpointStats {
    pub(crate) fn record_completed(&mut self, r: CheckpointRecord) {
        self.completed += 1;
        if self.history.len() == MAX_HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(r);
    }

    pub(crate) fn record_failed(&mut self, f: FailedCheckpoint) {
        self.failed += 1;
        if self.failures.len() == MAX_HISTORY {
            self.failures.pop_front();
        }
        self.failures.push_back(f);
    }

    /// The id of the latest completed checkpoint, if any.
    pub fn latest_completed(&self) -> Option<u64> {
        self.history.iter().map(|r| r.id).max()
    }
}
