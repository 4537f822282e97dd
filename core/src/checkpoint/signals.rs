//! The few words the coordinator and the tasks exchange, off the data path.
//!
//! Coordinator to tasks: the latest triggered checkpoint (sources inject a
//! barrier when it moves), the latest completed checkpoint (sinks commit
//! when it moves), aborted checkpoints, and which checkpoint is the final
//! one of a bounded job. A task reads these with one atomic load per
//! scheduling turn; the locks here are taken only when a value changed.
//!
//! Tasks to coordinator: an [`Event`] channel carrying acknowledgements
//! with state handles, refusals, and "source exhausted" notices.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex};

use super::config::CheckpointMode;
use super::snapshot::TaskAck;

/// Slots of the trigger-time table; a checkpoint's trigger time is found at
/// `id % TRIGGER_SLOTS`. Larger than `MAX_CONCURRENT` so that no pending
/// checkpoint's slot is reused while it is in flight.
const TRIGGER_SLOTS: usize = 64;

/// Shared between the coordinator and every task of one job attempt.
#[derive(Debug)]
pub(crate) struct Signals {
    pub(crate) mode: CheckpointMode,
    /// Latest triggered checkpoint id (0: none yet).
    triggered: AtomicU64,
    trigger_ns: [AtomicU64; TRIGGER_SLOTS],
    /// The final checkpoint of a bounded job (0: not yet decided).
    final_id: AtomicU64,
    /// Latest completed checkpoint id (0: none).
    completed: AtomicU64,
    /// Incremented whenever `aborted` grows.
    abort_seq: AtomicU64,
    aborted: Mutex<Vec<u64>>,
    /// Alignment timeout in nanoseconds (0: none).
    pub(crate) alignment_timeout_ns: u64,
    /// The first checkpoint id of this attempt, past every checkpoint
    /// folder on disk: lower ids belong to earlier runs and attempts and are
    /// never injected (every task's `last_barrier` starts at
    /// `first_id - 1`, whatever checkpoint it restored).
    pub(crate) first_id: u64,
    /// Task snapshots being written on the snapshot pool
    /// ([`super::snapshot`]); the attempt's end waits for them
    /// ([`Signals::wait_snapshot_jobs`]).
    snapshot_jobs: Mutex<usize>,
    snapshot_jobs_done: Condvar,
}

/// A task snapshot job counted in [`Signals`] while it runs; dropping it
/// (at the job's end, or in a panic) uncounts it.
pub(crate) struct SnapshotJob(Arc<Signals>);

impl Drop for SnapshotJob {
    fn drop(&mut self) {
        let mut n = self.0.snapshot_jobs.lock().unwrap_or_else(|p| p.into_inner());
        *n -= 1;
        if *n == 0 {
            self.0.snapshot_jobs_done.notify_all();
        }
    }
}

impl Signals {
    /// Counts a task snapshot job about to run on the snapshot pool.
    pub(crate) fn snapshot_job(self: &Arc<Self>) -> SnapshotJob {
        *self.snapshot_jobs.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        SnapshotJob(Arc::clone(self))
    }

    /// Waits until no task snapshot job runs, at most `limit`; false if
    /// some still ran then. The end of an attempt waits for them before it
    /// deletes the folders of its pending checkpoints: a job still writing
    /// would create its checkpoint's folder again, under an id the next
    /// attempt (or the next job on the same folder) reuses.
    pub(crate) fn wait_snapshot_jobs(&self, limit: std::time::Duration) -> bool {
        let n = self.snapshot_jobs.lock().unwrap_or_else(|p| p.into_inner());
        let (n, _) = self
            .snapshot_jobs_done
            .wait_timeout_while(n, limit, |n| *n > 0)
            .unwrap_or_else(|p| p.into_inner());
        *n == 0
    }

    pub(crate) fn new(mode: CheckpointMode, alignment_timeout_ns: u64, completed: u64, first_id: u64) -> Self {
        debug_assert!(first_id > completed);
        Signals {
            mode,
            first_id,
            triggered: AtomicU64::new(first_id - 1),
            trigger_ns: std::array::from_fn(|_| AtomicU64::new(0)),
            final_id: AtomicU64::new(0),
            completed: AtomicU64::new(completed),
            abort_seq: AtomicU64::new(0),
            aborted: Mutex::new(Vec::new()),
            alignment_timeout_ns,
            snapshot_jobs: Mutex::new(0),
            snapshot_jobs_done: Condvar::new(),
        }
    }

    /// Coordinator: trigger checkpoint `id` (ids strictly increase).
    pub(crate) fn trigger(&self, id: u64, now_ns: u64, is_final: bool) {
        debug_assert!(id > self.triggered.load(Ordering::Relaxed));
        self.trigger_ns[id as usize % TRIGGER_SLOTS].store(now_ns, Ordering::Relaxed);
        if is_final {
            self.final_id.store(id, Ordering::Relaxed);
        }
        // Release: a task that sees `id` also sees its trigger time and flag.
        self.triggered.store(id, Ordering::Release);
    }

    /// Latest triggered checkpoint.
    #[inline]
    pub(crate) fn triggered(&self) -> u64 {
        self.triggered.load(Ordering::Acquire)
    }

    pub(crate) fn trigger_ns(&self, id: u64) -> u64 {
        self.trigger_ns[id as usize % TRIGGER_SLOTS].load(Ordering::Relaxed)
    }

    pub(crate) fn final_id(&self) -> u64 {
        self.final_id.load(Ordering::Relaxed)
    }

    /// Coordinator: checkpoint `id` is complete and durable.
    pub(crate) fn complete(&self, id: u64) {
        self.completed.fetch_max(id, Ordering::Release);
    }

    #[inline]
    pub(crate) fn completed(&self) -> u64 {
        self.completed.load(Ordering::Acquire)
    }

    /// Coordinator: checkpoint `id` was aborted.
    pub(crate) fn abort(&self, id: u64) {
        let mut a = self.aborted.lock().unwrap_or_else(|p| p.into_inner());
        a.push(id);
        // Bounded: tasks only need recent aborts.
        if a.len() > 1024 {
            a.drain(..512);
        }
        self.abort_seq.fetch_add(1, Ordering::Release);
    }

    #[inline]
    pub(crate) fn abort_seq(&self) -> u64 {
        self.abort_seq.load(Ordering::Acquire)
    }

    /// Aborted checkpoint ids greater than `after`.
    pub(crate) fn aborted_after(&self, after: u64) -> Vec<u64> {
        let a = self.aborted.lock().unwrap_or_else(|p| p.into_inner());
        a.iter().copied().filter(|&id| id > after).collect()
    }
}

/// What tasks tell the coordinator.
#[derive(Debug)]
pub(crate) enum Event {
    /// A task finished its part of a checkpoint (state durable in files).
    Ack(Box<TaskAck>),
    /// A task could not take part in checkpoint `id` (it is aborted).
    Decline { id: u64, task: usize, reason: String },
    /// A source task has no more input; it will take part in the final
    /// checkpoint and then end its stream.
    SourceExhausted { task: usize },
    /// Dedup mode: a task failed and waits, dropped, for a replacement
    /// that recovers it alone (handled by the job thread, not the
    /// coordinator). `record`: the records it failed on, if known, as
    /// `(input, first position, last position)`.
    TaskFailed {
        task: usize,
        message: String,
        record: Option<(u32, u64, u64)>,
        /// The checkpoints its backup can be replayed from.
        replayable_from: Vec<u64>,
    },
}

/// A task's handle on checkpointing.
#[derive(Debug, Clone)]
pub(crate) struct TaskCheckpointing {
    pub(crate) signals: Arc<Signals>,
    pub(crate) events: Sender<Event>,
    /// Global index of the task in the job (graph order).
    pub(crate) task: usize,
    /// Chain group index and subtask, for file names.
    pub(crate) group: usize,
    /// Root of the job's checkpoint directory.
    pub(crate) root: Arc<std::path::Path>,
    /// `CheckpointConfig::inline_state_max`.
    pub(crate) inline_max: usize,
    /// Where asynchronous snapshot work runs (the job's snapshot pool).
    pub(crate) pool: Arc<super::spawner::SnapshotPool>,
    /// The task's incarnation in this attempt: 0, then one more each time
    /// it recovers alone (dedup mode). The coordinator refuses a snapshot
    /// of an older incarnation (a zombie's).
    pub(crate) generation: u64,
    /// `CheckpointConfig::dedup_backup_limit`.
    pub(crate) backup_limit: usize,
    /// Dedup mode: an input of this task comes from a chain that reads
    /// rings itself (behind an exchange after the first), which after a
    /// restore interleaves its inputs anew and so does not replay the same
    /// records in the same order. The task then aligns its barriers, as in
    /// aligned mode: its snapshot holds nothing of any input past the
    /// barrier, and a replay has nothing to drop by position.
    pub(crate) align_inputs: bool,
}

impl TaskCheckpointing {
    pub(crate) fn send(&self, e: Event) {
        // The coordinator outlives every task of its attempt; if it is gone
        // the job is stopping and the event has no reader.
        let _ = self.events.send(e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_attempt_end_waits_for_snapshot_jobs_within_its_limit() {
        let s = Arc::new(Signals::new(CheckpointMode::Aligned, 0, 0, 1));
        assert!(s.wait_snapshot_jobs(Duration::ZERO), "none running");
        let a = s.snapshot_job();
        let b = s.snapshot_job();
        assert!(!s.wait_snapshot_jobs(Duration::from_millis(20)), "two still run");
        drop(a);
        assert!(!s.wait_snapshot_jobs(Duration::from_millis(20)), "one still runs");
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            drop(b);
        });
        assert!(s.wait_snapshot_jobs(Duration::from_secs(10)), "the last one ended");
        t.join().unwrap();
    }
}
