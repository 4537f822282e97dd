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

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use super::config::{CheckpointConfig, RetainOnCancel};
use super::signals::{Event, Signals};
use super::snapshot::{AckedState, TaskAck};
use super::stats::{CheckpointRecord, CheckpointStats, FailedCheckpoint, TaskCheckpointStats};
use super::storage::{self, FileRef, Manifest, ManifestGroup, ManifestTask, Removal};
use crate::clock;

struct Pending {
    trigger: Instant,
    trigger_unix_ms: u64,
    is_final: bool,
    acks: Vec<Option<TaskAck>>,
    received: usize,
    /// Whether the checkpoint's folder was made and its entry synced at
    /// the trigger, so that the manifest's commit need not sync the root.
    folder_synced: bool,
}

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
    /// ([`storage::remove_checkpoint`] says why).
    root_sync_owed: bool,
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
        let timed_out: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| now.duration_since(p.trigger) >= self.cfg.timeout)
            .map(|(&id, _)| id)
            .collect();
        for id in timed_out {
            self.abort(id, format!("not complete after the timeout of {:?}", self.cfg.timeout))?;
        }
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

    fn trigger(&mut self, now: Instant, is_final: bool) -> Result<(), CoordinatorError> {
        let id = self.next_id;
        // The checkpoint's folder is made before the tasks hear of the id,
        // and must be new: ids start past every folder on disk and never
        // repeat, so an existing one means that something else writes into
        // this directory. Writing into it would break that checkpoint's
        // manifest; the attempt fails instead (a restart numbers past it).
        let created = match storage::create_checkpoint_dir(&self.root, id) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(CoordinatorError::Failed(format!(
                    "cannot trigger checkpoint {id}: its folder {} exists already, and a checkpoint never \
                     writes into another one's folder; is another job using the checkpoint directory {}? \
                     Give each job a directory of its own",
                    storage::checkpoint_dir(&self.root, id).display(),
                    self.root.display()
                )));
            }
            Err(e) => {
                tracing::debug!(checkpoint = id, error = %e, "could not create the checkpoint folder ahead");
                false
            }
        };
        self.next_id += 1;
        self.last_trigger = now;
        self.final_triggered = is_final;
        let trigger_unix_ms = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        tracing::debug!(checkpoint = id, is_final, "triggering checkpoint");
        self.signals.trigger(id, clock::now_ns(), is_final);
        self.prime_relay();
        // The folder's entry, synced while the barriers travel and the
        // tasks snapshot (sinks sync their pre-commits meanwhile, so this
        // journal commit often joins theirs): one disk wait fewer after the
        // last acknowledgement. If the folder could not be made or synced,
        // the manifest's commit syncs the root (and the first file written
        // creates the folder). (Acknowledgements are handled on this
        // thread, so none arrives before the checkpoint is pending below.)
        let folder_synced = created
            && match storage::sync_dir(&self.root) {
                Ok(()) => {
                    // The same sync made every earlier folder removal durable.
                    self.root_sync_owed = false;
                    true
                }
                Err(e) => {
                    tracing::debug!(checkpoint = id, error = %e, "could not sync the new checkpoint folder's entry");
                    false
                }
            };
        self.pending.insert(
            id,
            Pending {
                trigger: now,
                trigger_unix_ms,
                is_final,
                acks: vec![None; self.tasks.len()],
                received: 0,
                folder_synced,
            },
        );
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).in_progress = self.pending.len() as u64;
        Ok(())
    }

    /// Handles one event from a task.
    pub(crate) fn handle(&mut self, event: Event) -> Result<(), CoordinatorError> {
        match event {
            Event::Ack(ack) => {
                let id = ack.id;
                let Some(p) = self.pending.get_mut(&id) else {
                    // Late ack of an aborted checkpoint of this attempt: its
                    // folder is gone or going; remove what the task wrote.
                    if id < self.first_id || self.retained.contains(&id) {
                        return Ok(());
                    }
                    let _ = self.remove_folder(id);
                    let fence = self.next_id.saturating_sub(1);
                    self.doomed
                        .extend(ack.shared_files.iter().map(|f| (f.path.clone(), fence)));
                    self.collect_garbage();
                    return Ok(());
                };
                let task = ack.task;
                if p.acks[task].is_none() {
                    p.received += 1;
                }
                p.acks[task] = Some(*ack);
                if p.received == self.tasks.len() {
                    let latest = self.signals.completed();
                    if id < latest {
                        // Never reached: a completion gives up every older
                        // pending checkpoint at once. Kept as the rule's
                        // last guard: completions never go backwards.
                        self.subsume(id, latest);
                        self.collect_garbage();
                    } else {
                        self.complete(id)?;
                    }
                }
                Ok(())
            }
            Event::Decline { id, task, reason } => {
                if self.pending.contains_key(&id) {
                    let t = &self.tasks[task];
                    self.abort(
                        id,
                        format!("task '{}' subtask {} declined: {reason}", t.name, t.subtask),
                    )?;
                }
                Ok(())
            }
            Event::SourceExhausted { task } => {
                self.sources_exhausted[task] = true;
                Ok(())
            }
        }
    }

    fn complete(&mut self, id: u64) -> Result<(), CoordinatorError> {
        let p = self.pending.remove(&id).expect("completing a pending checkpoint");
        let acks: Vec<TaskAck> = p.acks.into_iter().map(|a| a.expect("every task acked")).collect();
        let duration = p.trigger.elapsed();
        let acked_us = duration.as_micros() as u64;
        // Inline states go one after another into the manifest's inline
        // part; the others are files of their own.
        let manifest_path = storage::checkpoint_dir(Path::new(""), id)
            .join(storage::MANIFEST)
            .to_string_lossy()
            .into_owned();
        let mut inline = Vec::new();
        let mut task_files = Vec::new();
        let tasks = acks
            .iter()
            .map(|a| {
                let (file, inline_offset) = match &a.state {
                    AckedState::File(f) => {
                        task_files.push(f.clone());
                        (f.clone(), None)
                    }
                    AckedState::Inline(frame) => {
                        let offset = inline.len() as u64;
                        inline.extend_from_slice(frame);
                        let file = FileRef {
                            path: manifest_path.clone(),
                            size: frame.len() as u64,
                            crc32: crc32fast::hash(frame),
                        };
                        (file, Some(offset))
                    }
                };
                ManifestTask {
                    group: self.tasks[a.task].group,
                    subtask: self.tasks[a.task].subtask,
                    file,
                    inline_offset,
                    state_bytes: a.state_bytes,
                    channel_state_bytes: a.channel_state_bytes,
                    sync_us: a.sync_ns / 1000,
                    async_us: a.async_ns / 1000,
                    alignment_us: a.alignment_ns / 1000,
                }
            })
            .collect();
        let files_written = !task_files.is_empty();
        let shared_written = acks.iter().any(|a| a.wrote_shared);
        let manifest = Manifest {
            version: storage::MANIFEST_VERSION,
            job: self.job.clone(),
            fingerprint: self.fingerprint.clone(),
            id,
            mode: self.cfg.mode,
            is_final: p.is_final,
            trigger_unix_ms: p.trigger_unix_ms,
            duration_us: acked_us,
            groups: self.groups.clone(),
            tasks,
            files: {
                let mut files = task_files;
                let mut shared: Vec<_> = acks.iter().flat_map(|a| a.shared_files.iter().cloned()).collect();
                shared.sort_by(|a, b| a.path.cmp(&b.path));
                shared.dedup_by(|a, b| a.path == b.path);
                files.extend(shared);
                files
            },
            inline,
        };
        if let Err(e) = manifest.commit(&self.root, files_written, shared_written, p.folder_synced) {
            // Put it back so that abort() accounts for it.
            self.pending.insert(
                id,
                Pending {
                    trigger: p.trigger,
                    trigger_unix_ms: p.trigger_unix_ms,
                    is_final: p.is_final,
                    acks: Vec::new(),
                    received: 0,
                    folder_synced: p.folder_synced,
                },
            );
            return self.abort(id, format!("writing the manifest failed: {e}"));
        }
        self.shared_of.insert(
            id,
            manifest
                .files
                .iter()
                .filter(|f| f.path.starts_with(storage::SHARED))
                .map(|f| f.path.clone())
                .collect(),
        );
        let duration = p.trigger.elapsed();
        self.signals.complete(id);
        self.prime_relay();
        self.last_completion = Instant::now();
        self.consecutive_failures = 0;
        tracing::debug!(checkpoint = id, ?duration, "checkpoint complete");
        let record = CheckpointRecord {
            id,
            is_final: p.is_final,
            trigger_ms: (clock::now_ns().saturating_sub(self.job_start_ns) as f64 / 1e6) - duration.as_secs_f64() * 1e3,
            trigger_unix_ms: p.trigger_unix_ms,
            acked_us,
            duration_us: duration.as_micros() as u64,
            state_bytes: acks.iter().map(|a| a.state_bytes).sum(),
            channel_state_bytes: acks.iter().map(|a| a.channel_state_bytes).sum(),
            tasks: acks
                .iter()
                .map(|a| TaskCheckpointStats {
                    task: self.tasks[a.task].name.clone(),
                    subtask: self.tasks[a.task].subtask,
                    sync_us: a.sync_ns / 1000,
                    async_us: a.async_ns / 1000,
                    alignment_us: a.alignment_ns / 1000,
                    state_bytes: a.state_bytes,
                    channel_state_bytes: a.channel_state_bytes,
                })
                .collect(),
        };
        {
            let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
            stats.record_completed(record);
            stats.in_progress = self.pending.len() as u64;
        }
        // Older checkpoints still pending can only complete after this
        // one: they are subsumed now, so that none of them ever becomes
        // the latest (sinks commit through `id` already; a restore must
        // never go back behind it).
        let older: Vec<u64> = self.pending.range(..id).map(|(&k, _)| k).collect();
        for k in older {
            self.subsume(k, id);
        }
        // Oldest first, whatever the order of completion: retention drops
        // from the front and so always keeps the newest.
        let at = self.retained.partition_point(|&r| r < id);
        self.retained.insert(at, id);
        while self.retained.len() > self.cfg.retained {
            let old = self.retained.pop_front().expect("non-empty");
            self.drop_checkpoint(old);
        }
        self.collect_garbage();
        Ok(())
    }

    /// Gives up pending checkpoint `id` because `by`, a newer one, has
    /// completed (Flink's subsumption): discarded like an aborted
    /// checkpoint, but no failure. Acknowledgements still to come are
    /// handled as late ones (their files deleted).
    fn subsume(&mut self, id: u64, by: u64) {
        if self.discard(id).is_none() {
            return;
        }
        {
            let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
            stats.subsumed += 1;
            stats.in_progress = self.pending.len() as u64;
        }
        tracing::debug!(checkpoint = id, by, "checkpoint subsumed by a newer completed one");
    }

    /// Removes pending checkpoint `id`: tells the tasks it is aborted,
    /// deletes its folder and queues the shared files written for it.
    fn discard(&mut self, id: u64) -> Option<Pending> {
        let p = self.pending.remove(&id)?;
        self.signals.abort(id);
        if let Err(e) = self.remove_folder(id) {
            tracing::warn!(checkpoint = id, error = %e, "could not delete an aborted checkpoint's files");
        }
        // Shared files written for it are queued like dropped ones.
        let fence = self.next_id.saturating_sub(1);
        for a in p.acks.iter().flatten() {
            self.doomed
                .extend(a.shared_files.iter().map(|f| (f.path.clone(), fence)));
        }
        Some(p)
    }

    /// The shared files retained checkpoint `id` references: known since
    /// it completed, or read from its manifest once. An error if the
    /// manifest cannot be read or verified: then nobody can tell which
    /// shared files it needs, and its caller deletes none.
    fn shared_files(&mut self, id: u64) -> Result<&[String], String> {
        if !self.shared_of.contains_key(&id) {
            let files = match storage::read_manifest_located(&self.root, id) {
                Ok(Some(m)) => m
                    .files
                    .into_iter()
                    .filter(|f| f.path.starts_with(storage::SHARED))
                    .map(|f| f.path)
                    .collect(),
                Ok(None) => return Err(format!("checkpoint {id} has no manifest")),
                Err(e) => {
                    e.report_damage(&format!(
                        "read to tell which shared state files checkpoint {id} uses: none is deleted"
                    ));
                    return Err(e.message);
                }
            };
            self.shared_of.insert(id, files);
        }
        Ok(&self.shared_of[&id])
    }

    /// Removes a retained checkpoint's own folder; its shared files wait in
    /// the deletion queue until no checkpoint pending now could still
    /// build on them. If its manifest cannot be read, its shared files are
    /// left for the next start's sweep of orphaned files (which keeps every
    /// file while any manifest is unreadable).
    fn drop_checkpoint(&mut self, id: u64) {
        let fence = self.next_id.saturating_sub(1);
        match self.shared_files(id) {
            Ok(files) => {
                let files: Vec<(String, u64)> = files.iter().map(|f| (f.clone(), fence)).collect();
                self.doomed.extend(files);
            }
            Err(e) => tracing::warn!(checkpoint = id, error = %e,
                "cannot tell which shared state files an old checkpoint used: they are kept"),
        }
        self.shared_of.remove(&id);
        if let Err(e) = self.remove_folder(id) {
            tracing::warn!(checkpoint = id, error = %e, "could not delete an old checkpoint");
        }
    }

    /// Removes checkpoint `id`'s folder; notes whether `root` must be
    /// synced before shared files are deleted (also when the removal
    /// failed midway: a sync too many is harmless).
    fn remove_folder(&mut self, id: u64) -> std::io::Result<()> {
        match storage::remove_checkpoint(&self.root, id) {
            Ok(Removal::Durable) => Ok(()),
            Ok(Removal::SyncRootFirst) => {
                self.root_sync_owed = true;
                Ok(())
            }
            Err(e) => {
                self.root_sync_owed = true;
                Err(e)
            }
        }
    }

    /// Makes every checkpoint folder removal so far durable, if one is not:
    /// called before any shared file is deleted, so that no manifest a
    /// crash could bring back names a deleted file. False if the sync
    /// failed (then nothing may be deleted).
    fn sync_removals(&mut self) -> bool {
        if !self.root_sync_owed {
            return true;
        }
        match storage::sync_dir(&self.root) {
            Ok(()) => {
                self.root_sync_owed = false;
                true
            }
            Err(e) => {
                tracing::warn!(dir = %self.root.display(), error = %e,
                    "could not sync the removal of old checkpoints: their shared files are kept for now");
                false
            }
        }
    }

    /// Deletes queued shared files that no retained checkpoint references,
    /// once every checkpoint that was pending when they were queued has
    /// completed or aborted (a snapshot started then may build on them; if
    /// it completed, its manifest references them and keeps them).
    fn collect_garbage(&mut self) {
        if self.doomed.is_empty() {
            return;
        }
        let oldest_pending = self.pending.keys().next().copied().unwrap_or(u64::MAX);
        let mut referenced = std::collections::HashSet::new();
        for i in 0..self.retained.len() {
            match self.shared_files(self.retained[i]) {
                Ok(files) => referenced.extend(files.iter().cloned()),
                Err(e) => {
                    // A checkpoint whose files cannot be listed protects
                    // every file: deleting one it needs would make it
                    // unrestorable.
                    tracing::warn!(checkpoint = self.retained[i], error = %e,
                        "cannot tell which shared state files a retained checkpoint uses: none is deleted");
                    return;
                }
            }
        }
        // Files no retained checkpoint lists are forgotten; of the others,
        // those no pending checkpoint may build on are deleted now.
        self.doomed.retain(|(path, _)| !referenced.contains(path));
        if !self.doomed.iter().any(|(_, fence)| oldest_pending > *fence) {
            return;
        }
        // A manifest removed without a sync may name these files: its
        // removal is made durable first (see `storage::remove_checkpoint`).
        if !self.sync_removals() {
            return;
        }
        let root = self.root.clone();
        self.doomed.retain(|(path, fence)| {
            if oldest_pending <= *fence {
                return true;
            }
            match crate::storage::vfs::remove_file(root.join(path)) {
                Ok(()) => crate::storage::disk::trace::note(|| format!("delete {}", root.join(path).display())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!(file = %path, error = %e, "could not delete an unreferenced state file"),
            }
            false
        });
    }

    fn abort(&mut self, id: u64, reason: String) -> Result<(), CoordinatorError> {
        let Some(p) = self.discard(id) else {
            return Ok(());
        };
        self.collect_garbage();
        self.consecutive_failures += 1;
        {
            let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
            stats.record_failed(FailedCheckpoint {
                id,
                trigger_unix_ms: p.trigger_unix_ms,
                duration_us: p.trigger.elapsed().as_micros() as u64,
                reason: reason.clone(),
            });
            stats.in_progress = self.pending.len() as u64;
        }
        tracing::warn!(checkpoint = id, %reason, "checkpoint aborted");
        if p.is_final {
            return Err(CoordinatorError::Failed(format!(
                "the final checkpoint {id} failed: {reason}"
            )));
        }
        if self.consecutive_failures > self.cfg.tolerable_failures {
            return Err(CoordinatorError::Failed(format!(
                "{} consecutive checkpoints failed (tolerated: {}); last: checkpoint {id}: {reason}",
                self.consecutive_failures, self.cfg.tolerable_failures
            )));
        }
        Ok(())
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
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).in_progress = 0;
        if cancelled && self.cfg.retain_on_cancel == RetainOnCancel::Delete {
            for id in std::mem::take(&mut self.retained) {
                let _ = self.remove_folder(id);
            }
            // Their manifests gone durably first, as for any shared file.
            if self.sync_removals() {
                let _ = crate::storage::vfs::remove_dir_all(self.root.join(storage::SHARED));
            }
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
mod tests {
    use super::super::config::RestoreFrom;
    use super::super::recovery;
    use super::super::snapshot::TaskState;
    use super::super::CheckpointMode;
    use super::*;

    /// A coordinator of two source tasks (chain 0, subtasks 0 and 1) over
    /// `root`, whose first checkpoint is `first_id` (the ones before it
    /// retained), with its signals and statistics.
    fn coordinator(
        root: &Path,
        first_id: u64,
        tweak: impl FnOnce(&mut CheckpointConfig),
    ) -> (Coordinator, Arc<Signals>, Arc<Mutex<CheckpointStats>>) {
        let mut cfg = CheckpointConfig::new(CheckpointMode::Aligned, root);
        tweak(&mut cfg);
        let signals = Arc::new(Signals::new(cfg.mode, 0, first_id - 1, first_id));
        let stats = Arc::new(Mutex::new(CheckpointStats::default()));
        let tasks = (0..2)
            .map(|subtask| TaskInfo {
                group: 0,
                subtask,
                name: "src".into(),
                is_source: true,
            })
            .collect();
        let groups = vec![ManifestGroup {
            operators: vec!["0.0:src".into()],
            parallelism: 2,
        }];
        let c = Coordinator::new(
            cfg,
            signals.clone(),
            "test".into(),
            "fp".into(),
            groups,
            tasks,
            first_id,
            (1..first_id).collect(),
            stats.clone(),
        );
        (c, signals, stats)
    }

    /// Checkpoint 1 in `root`: inline states only (no task file, so its
    /// folder holds its manifest alone), relying on one state-backend file
    /// in `shared/`, which is returned.
    fn checkpoint_1_on_a_shared_file(root: &Path) -> FileRef {
        std::fs::create_dir(root.join(storage::SHARED)).unwrap();
        let shared = storage::write_durable(
            root,
            &root.join(storage::SHARED),
            "op-c1-s0.full.pages",
            b"pages",
            storage::DirSync::Now,
        )
        .unwrap();
        let m1 = Manifest {
            version: storage::MANIFEST_VERSION,
            job: "test".into(),
            fingerprint: "fp".into(),
            id: 1,
            mode: CheckpointMode::Aligned,
            is_final: false,
            trigger_unix_ms: 0,
            duration_us: 0,
            groups: Vec::new(),
            tasks: Vec::new(),
            files: vec![shared.clone()],
            inline: Vec::new(),
        };
        m1.commit(root, false, false, false).unwrap();
        shared
    }

    /// Task `task`'s acknowledgement of checkpoint `id`, its state inline.
    fn ack(id: u64, task: usize) -> Event {
        let state = TaskState {
            checkpoint: id,
            group: 0,
            subtask: task as u32,
            parallelism: 2,
            source_offset: Some(id.to_le_bytes().to_vec()),
            ..TaskState::default()
        };
        Event::Ack(Box::new(TaskAck {
            id,
            task,
            state: AckedState::Inline(state.encode()),
            shared_files: Vec::new(),
            wrote_shared: false,
            state_bytes: 8,
            channel_state_bytes: 0,
            sync_ns: 0,
            async_ns: 0,
            alignment_ns: 0,
        }))
    }

    /// With two checkpoints in flight and one retained, the older one
    /// completing after the newer must not push the newer one out: it is
    /// subsumed (aborted and discarded), and the newer stays the latest,
    /// the one a restore takes and sinks committed.
    #[test]
    fn a_checkpoint_completing_after_a_newer_one_is_subsumed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let (mut c, signals, stats) = coordinator(root, 1, |cfg| {
            cfg.max_concurrent = 2;
            cfg.retained = 1;
        });
        c.trigger(Instant::now(), false).unwrap();
        c.trigger(Instant::now(), false).unwrap();
        assert_eq!(signals.triggered(), 2);
        // Checkpoint 2's snapshots are quicker than 1's.
        c.handle(ack(2, 0)).unwrap();
        c.handle(ack(2, 1)).unwrap();
        assert_eq!(signals.completed(), 2, "checkpoint 2 completes first");
        c.handle(ack(1, 0)).unwrap();
        c.handle(ack(1, 1)).unwrap();
        assert_eq!(
            c.retained(),
            VecDeque::from([2]),
            "the newest completed checkpoint must be the one retained"
        );
        assert_eq!(signals.completed(), 2, "the latest completed checkpoint stays 2");
        assert_eq!(recovery::completed_ids(root).unwrap(), vec![2]);
        assert!(
            !storage::checkpoint_dir(root, 1).exists(),
            "the subsumed checkpoint's folder is deleted"
        );
        let restored = recovery::find(root, RestoreFrom::Latest, "fp", 1).unwrap().unwrap();
        assert_eq!(restored.manifest.id, 2, "a restore takes the newest checkpoint");
        let st = stats.lock().unwrap();
        assert_eq!(
            (st.completed, st.subsumed, st.failed),
            (1, 1, 0),
            "1 is counted as subsumed, not completed nor failed"
        );
        assert_eq!(st.history.iter().map(|r| r.id).collect::<Vec<_>>(), vec![2]);
        drop(st);
        assert_eq!(signals.aborted_after(0), vec![1], "the tasks are told 1 was aborted");
    }

    /// The coordinator's half of unique checkpoint ids (the job's half is
    /// in `tests/checkpoints.rs`): a checkpoint never writes into an
    /// existing folder. Ids start past every folder on disk, so one found
    /// at the trigger belongs to something else: the attempt fails, the
    /// tasks never hear of the id, and the folder is left as it was.
    #[test]
    fn a_trigger_never_takes_an_existing_folder() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let theirs = storage::checkpoint_dir(root, 1);
        std::fs::create_dir(&theirs).unwrap();
        std::fs::write(theirs.join(storage::MANIFEST), b"someone else's").unwrap();
        let (mut c, signals, _) = coordinator(root, 1, |_| {});
        let Err(CoordinatorError::Failed(e)) = c.trigger(Instant::now(), false) else {
            panic!("triggering into an existing folder must fail");
        };
        assert!(e.contains("chk-0000000001") && e.contains("exists already"), "{e}");
        assert_eq!(signals.triggered(), 0, "no task hears of checkpoint 1");
        assert_eq!(
            std::fs::read(theirs.join(storage::MANIFEST)).unwrap(),
            b"someone else's"
        );
    }

    /// A checkpoint whose task states are all inline is a folder with only
    /// its manifest, which may still name `shared/` files.
    /// Once retention drops it, garbage collection deletes those files; if
    /// the folder's removal were not durable by then, a crash could bring
    /// the manifest back naming deleted files. So `<dir>` is synced after
    /// the removal and before the first such deletion.
    #[test]
    fn a_dropped_manifest_only_checkpoint_is_gone_for_good_before_its_shared_files() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let shared = checkpoint_1_on_a_shared_file(root);
        let chk1 = storage::checkpoint_dir(root, 1);
        assert_eq!(
            std::fs::read_dir(&chk1).unwrap().count(),
            1,
            "checkpoint 1's folder holds its manifest only"
        );
        let (mut c, _signals, _stats) = coordinator(root, 2, |cfg| cfg.retained = 1);
        crate::storage::disk::trace::start();
        // Checkpoint 2 completes (it no longer uses the shared file):
        // retention drops 1, and the shared file goes with it.
        c.trigger(Instant::now(), false).unwrap();
        c.handle(ack(2, 0)).unwrap();
        c.handle(ack(2, 1)).unwrap();
        let log = crate::storage::disk::trace::take();
        assert_eq!(c.retained(), VecDeque::from([2]));
        assert!(!chk1.exists() && !root.join(&shared.path).exists(), "{log:#?}");
        let removed = log
            .iter()
            .position(|s| *s == format!("remove {}", chk1.display()))
            .unwrap_or_else(|| panic!("checkpoint 1's folder was not removed: {log:#?}"));
        let deleted = log
            .iter()
            .position(|s| *s == format!("delete {}", root.join(&shared.path).display()))
            .unwrap_or_else(|| panic!("the shared file was not deleted: {log:#?}"));
        assert!(
            log[removed..deleted].contains(&format!("sync {}", root.display())),
            "the removal of checkpoint 1's folder must be synced (an fsync of {}) before \
             the shared file it names is deleted: {log:#?}",
            root.display()
        );
    }

    /// Found by the storage simulation (two-phase seed 288): a retained
    /// checkpoint's manifest read back damaged (a flipped bit) while
    /// garbage was collected counted as "references nothing", and a shared
    /// file it needed was deleted; the next restore failed with the file
    /// missing. A retained checkpoint whose manifest cannot be read must
    /// protect every shared file.
    #[test]
    fn an_unreadable_retained_manifest_keeps_every_shared_file() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let shared = checkpoint_1_on_a_shared_file(root);
        // Checkpoint 1, retained from an earlier run, now reads back damaged.
        let manifest = storage::checkpoint_dir(root, 1).join(storage::MANIFEST);
        let mut bytes = std::fs::read(&manifest).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x10;
        std::fs::write(&manifest, bytes).unwrap();
        assert!(storage::read_manifest(root, 1).is_err());
        let (mut c, _signals, _stats) = coordinator(root, 2, |_| {});
        // Checkpoint 2 builds on the shared file (its ack lists it), then
        // fails: its shared files are queued for deletion, unless a
        // retained checkpoint references them.
        c.trigger(Instant::now(), false).unwrap();
        let Event::Ack(mut a) = ack(2, 0) else { unreachable!() };
        a.shared_files = vec![shared.clone()];
        c.handle(Event::Ack(a)).unwrap();
        c.handle(Event::Decline {
            id: 2,
            task: 1,
            reason: "test".into(),
        })
        .unwrap();
        // A later checkpoint completes, past the deletion fence.
        c.trigger(Instant::now(), false).unwrap();
        c.handle(ack(3, 0)).unwrap();
        c.handle(ack(3, 1)).unwrap();
        assert_eq!(c.retained(), VecDeque::from([1, 3]));
        assert!(
            root.join(&shared.path).exists(),
            "a shared file a retained checkpoint may need was deleted"
        );
        assert_damage_reported(&manifest, mid as u64);
    }

    /// Flips one bit of checkpoint `id`'s manifest (in its JSON line);
    /// returns the manifest's path and the byte flipped.
    fn damage_manifest(root: &Path, id: u64) -> (std::path::PathBuf, u64) {
        let manifest = storage::checkpoint_dir(root, id).join(storage::MANIFEST);
        let mut bytes = std::fs::read(&manifest).unwrap();
        let at = bytes.iter().position(|&b| b == b'\n').unwrap() / 2;
        bytes[at] ^= 0x10;
        std::fs::write(&manifest, bytes).unwrap();
        (manifest, at as u64)
    }

    /// The damaged bytes of `file` were reported (`corruption::report`),
    /// at or before byte `flipped`, the message naming the file.
    fn assert_damage_reported(file: &Path, flipped: u64) {
        let reports = crate::storage::corruption::recent_under(file);
        let r = reports
            .last()
            .unwrap_or_else(|| panic!("no damage reported in {}", file.display()));
        assert!(r.offset <= flipped, "{r:?}");
        assert!(r.what.contains(&*file.to_string_lossy()), "{r:?}");
    }

    /// The start's sweep of orphaned shared files reads every complete
    /// checkpoint's manifest: one that does not verify keeps every file,
    /// and is reported with its file and position.
    #[test]
    fn the_orphan_sweep_reports_a_damaged_manifest_and_deletes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let shared = checkpoint_1_on_a_shared_file(root);
        let orphan = root.join(storage::SHARED).join("op-c9-s0.full.pages");
        std::fs::write(&orphan, b"orphan").unwrap();
        let (manifest, at) = damage_manifest(root, 1);
        assert_eq!(recovery::remove_orphaned_shared_files(root).unwrap(), 0);
        assert!(root.join(&shared.path).exists() && orphan.exists());
        assert_damage_reported(&manifest, at);
    }

    /// `RestoreFrom::LatestValid` skips a checkpoint that does not verify
    /// for an older one: the damage it skipped is reported.
    #[test]
    fn latest_valid_reports_the_damage_of_the_checkpoint_it_skips() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let (mut c, _signals, _stats) = coordinator(root, 1, |cfg| cfg.retained = 2);
        for id in 1..=2 {
            c.trigger(Instant::now(), false).unwrap();
            c.handle(ack(id, 0)).unwrap();
            c.handle(ack(id, 1)).unwrap();
        }
        let (manifest, at) = damage_manifest(root, 2);
        assert!(recovery::find(root, RestoreFrom::Latest, "fp", 1).is_err());
        let restored = recovery::find(root, RestoreFrom::LatestValid, "fp", 1)
            .unwrap()
            .unwrap();
        assert_eq!(restored.manifest.id, 1);
        assert_damage_reported(&manifest, at);
    }

    /// Found by the storage simulation: a manifest found on disk may be an
    /// earlier process's whose folder fsync failed or never ran. A restore
    /// makes its folder durable before sinks commit through it.
    #[test]
    fn a_restore_syncs_the_checkpoint_folder_before_using_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let (mut c, _signals, _stats) = coordinator(root, 1, |_| {});
        c.trigger(Instant::now(), false).unwrap();
        c.handle(ack(1, 0)).unwrap();
        c.handle(ack(1, 1)).unwrap();
        crate::storage::disk::trace::start();
        let restored = recovery::find(root, RestoreFrom::Latest, "fp", 1).unwrap().unwrap();
        let log = crate::storage::disk::trace::take();
        assert_eq!(restored.manifest.id, 1);
        let chk1 = format!("sync {}", storage::checkpoint_dir(root, 1).display());
        assert!(log.contains(&chk1), "{log:#?}");
    }
}
