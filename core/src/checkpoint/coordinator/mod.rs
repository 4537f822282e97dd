//! The checkpoint coordinator: decides when to trigger, collects the
//! tasks' acknowledgements, makes completed checkpoints durable, notifies
//! the tasks, aborts what failed or timed out, and prunes old checkpoints.
//!
//! It runs on the job's own thread, never on a worker: its only contact
//! with the data path is [`Signals`] (a few atomics) and the [`Event`]
//! channel.
//!
//! Trigger rule (one place, like Flink's request decider): a new checkpoint
//! starts when fewer than `max_concurrent` are pending, `interval` has
//! passed since the last trigger and `min_pause` since the last completion.
//! Once every source is exhausted, the final checkpoint is triggered at
//! once (at most `max_concurrent` still applies) and nothing after it.
//!
//! Subsumption (as in Flink): with `max_concurrent` above 1, checkpoint
//! `n + 1` can complete before `n`. Its completion then gives up every
//! older pending checkpoint: `n` is aborted as subsumed (the tasks are told,
//! its folder and files are deleted, it counts in
//! [`CheckpointStats::subsumed`], not as a failure). So completions only go
//! forwards: the latest completed checkpoint, the one sinks committed
//! through and a restore takes, is always the newest, and retention (which
//! drops the oldest) never drops it.
//!
//! - this file: the [`Coordinator`], what it knows, and its entry points
//!   from the job thread (`tick`, `handle`, `shutdown`);
//! - `pending`: the checkpoints in flight, from the trigger to their
//!   acknowledgements, declines, timeouts, aborts and subsumption;
//! - `completion`: a fully acknowledged checkpoint made complete, its
//!   manifest written durably, the tasks and the statistics told;
//! - `retention`: the completed checkpoints kept on disk, and the deletion
//!   of old ones and of shared state files no checkpoint needs any more.

mod completion;
mod pending;
mod retention;

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::checkpoint::config::{CheckpointConfig, RetainOnCancel};
use crate::checkpoint::signals::{Event, Signals};
use crate::checkpoint::stats::CheckpointStats;
use crate::checkpoint::storage::ManifestGroup;
use crate::clock;

use pending::Pending;

/// Why the coordinator stops the job.
#[derive(Debug)]
pub(crate) enum CoordinatorError {
    /// More consecutive failures than tolerated, or the final checkpoint failed.
    Failed(String),
}

/// Identity of one task, in graph order.
#[derive(Debug, Clone)]
pub(crate) struct TaskInfo {
    pub(crate) group: usize,
    pub(crate) subtask: usize,
    pub(crate) name: String,
    pub(crate) is_source: bool,
}

pub(crate) struct Coordinator {
    /// Woken as checkpoints are triggered and completed (`set_relay`).
    relay: Option<Arc<crate::threads::relay::WakeRelay>>,
    cfg: CheckpointConfig,
    root: PathBuf,
    signals: Arc<Signals>,
    job: String,
    fingerprint: String,
    groups: Vec<ManifestGroup>,
    tasks: Vec<TaskInfo>,
    /// Per task, its current incarnation (dedup mode: one more each time
    /// it recovered alone); acknowledgements of older ones are refused.
    generations: Vec<u64>,
    sources_exhausted: Vec<bool>,
    /// First id of this attempt; lower ids belong to earlier runs.
    first_id: u64,
    next_id: u64,
    pending: BTreeMap<u64, Pending>,
    last_trigger: Instant,
    last_completion: Instant,
    consecutive_failures: u32,
    final_triggered: bool,
    retained: VecDeque<u64>,
    /// The shared files each retained checkpoint references, once known:
    /// recorded when this attempt completes it, read from its manifest
    /// (once) for one retained from an earlier run.
    shared_of: BTreeMap<u64, Vec<String>>,
    /// Shared files no longer referenced by a dropped checkpoint, with the
    /// highest checkpoint id triggered when they were queued.
    doomed: Vec<(String, u64)>,
    /// A manifest-only checkpoint folder was removed and `root` has not
    /// been fsynced since: no shared file may be deleted before it is
    /// ([`crate::checkpoint::storage::remove_checkpoint`] says why).
    root_sync_owed: bool,
    /// The folder of the next checkpoint, made ahead once the last one
    /// completed, and whether it was prepared (its empty manifest and both
    /// entries synced): the trigger then waits for no disk.
    ahead: Option<(u64, bool)>,
    stats: Arc<Mutex<CheckpointStats>>,
    job_start_ns: u64,
}

impl Coordinator {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        cfg: CheckpointConfig,
        signals: Arc<Signals>,
        job: String,
        fingerprint: String,
        groups: Vec<ManifestGroup>,
        tasks: Vec<TaskInfo>,
        first_id: u64,
        retained: VecDeque<u64>,
        stats: Arc<Mutex<CheckpointStats>>,
    ) -> Self {
        let now = Instant::now();
        let n = tasks.len();
        Coordinator {
            root: cfg.dir.clone(),
            cfg,
            signals,
            job,
            fingerprint,
            groups,
            tasks,
            generations: vec![0; n],
            sources_exhausted: vec![false; n],
            first_id,
            next_id: first_id,
            pending: BTreeMap::new(),
            last_trigger: now,
            last_completion: now,
            consecutive_failures: 0,
            final_triggered: false,
            retained,
            shared_of: BTreeMap::new(),
            doomed: Vec::new(),
            root_sync_owed: false,
            ahead: None,
            stats,
            job_start_ns: clock::now_ns(),
            relay: None,
        }
    }

    /// Primes `relay` as each checkpoint is triggered and as it completes
    /// (`WakeRelay::prime`): the workers' hand-offs for it follow at once.
    pub(crate) fn set_relay(&mut self, relay: Arc<crate::threads::relay::WakeRelay>) {
        self.relay = Some(relay);
    }

    fn prime_relay(&self) {
        if let Some(r) = &self.relay {
            r.prime();
        }
    }

    /// How long the job thread may wait for events before calling `tick`.
    pub(crate) fn next_wakeup(&self) -> Duration {
        let now = Instant::now();
        let mut wake = Duration::from_millis(10);
        let due = (self.last_trigger + self.cfg.interval).saturating_duration_since(now);
        wake = wake.min(due);
        for p in self.pending.values() {
            wake = wake.min((p.trigger + self.cfg.timeout).saturating_duration_since(now));
        }
        wake.max(Duration::from_micros(100))
    }

    fn all_sources_exhausted(&self) -> bool {
        self.tasks
            .iter()
            .zip(&self.sources_exhausted)
            .all(|(t, e)| !t.is_source || *e)
    }

    /// Triggers and times out checkpoints as due.
    pub(crate) fn tick(&mut self) -> Result<(), CoordinatorError> {
        let now = Instant::now();
        self.abort_timed_out(now)?;
        if self.final_triggered || self.pending.len() >= self.cfg.max_concurrent {
            return Ok(());
        }
        let is_final = self.all_sources_exhausted();
        let due = now.duration_since(self.last_trigger) >= self.cfg.interval
            && now.duration_since(self.last_completion) >= self.cfg.min_pause;
        if is_final || due {
            self.trigger(now, is_final)?;
        }
        Ok(())
    }

    /// Handles one event from a task.
    pub(crate) fn handle(&mut self, event: Event) -> Result<(), CoordinatorError> {
        match event {
            Event::Ack(ack) => self.on_ack(ack),
            Event::Decline { id, task, reason } => self.on_decline(id, task, reason),
            Event::SourceExhausted { task } => {
                self.sources_exhausted[task] = true;
                Ok(())
            }
            // The job thread's (a dedup recovery), never passed here.
            Event::TaskFailed { .. } => Ok(()),
        }
    }

    /// Whether the final checkpoint was triggered and is still pending. A
    /// subtask that fails then cannot recover alone: giving the pending
    /// checkpoints up ([`Coordinator::task_failed`]) would give up the
    /// final one, which is triggered once, and the sources would wait for
    /// its completion for ever (found by the storage simulation with
    /// dedup recoveries, WAL seed 118). The whole job restarts instead.
    pub(crate) fn final_in_flight(&self) -> bool {
        self.final_triggered && self.pending.values().any(|p| p.is_final)
    }

    /// Task `task` failed and recovers alone (dedup mode): its next
    /// incarnation gets a new generation, and every pending checkpoint is
    /// given up (the failed incarnation may have taken part in it; the
    /// sinks fold an aborted checkpoint's output into the next one). Not
    /// counted as a checkpoint failure. Returns the new generation and the
    /// latest completed checkpoint, the one the task restores from.
    pub(crate) fn task_failed(&mut self, task: usize) -> (u64, u64) {
        self.generations[task] += 1;
        let ids: Vec<u64> = self.pending.keys().copied().collect();
        for id in ids {
            if self.discard(id).is_some() {
                let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
                stats.subsumed += 1;
                stats.in_progress = self.pending.len() as u64;
            }
        }
        self.collect_garbage();
        (self.generations[task], self.signals.completed())
    }

    /// Waits (at most `limit`) until no task snapshot of this attempt is
    /// still being written on the snapshot pool; false if one still is.
    pub(crate) fn wait_snapshot_jobs(&self, limit: std::time::Duration) -> bool {
        self.signals.wait_snapshot_jobs(limit)
    }

    /// The job is over: abort what is pending; on cancel, apply retention.
    pub(crate) fn shutdown(&mut self, cancelled: bool) {
        let ids: Vec<u64> = self.pending.keys().copied().collect();
        for id in ids {
            self.pending.remove(&id);
            self.signals.abort(id);
            let _ = self.remove_folder(id);
        }
        if let Some((id, _)) = self.ahead.take() {
            let _ = self.remove_folder(id);
        }
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).in_progress = 0;
        if cancelled && self.cfg.retain_on_cancel == RetainOnCancel::Delete {
            self.delete_retained();
        }
    }

    /// The id the next checkpoint would get.
    pub(crate) fn next_id(&self) -> u64 {
        self.next_id
    }

    /// Completed checkpoints on disk, oldest first.
    pub(crate) fn retained(&self) -> VecDeque<u64> {
        self.retained.clone()
    }
}

#[cfg(test)]
mod tests;
