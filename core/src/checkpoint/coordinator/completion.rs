//! Completing a checkpoint, once every task acknowledged it: its manifest
//! (the task states, inline or by file, and the shared files it builds on)
//! is written durably, which is the moment it is complete; then the tasks
//! are told (sinks commit), the statistics record it, older pending
//! checkpoints are subsumed and retention drops the oldest completed one.
//! If the manifest cannot be written, the checkpoint is aborted instead.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::checkpoint::snapshot::{AckedState, TaskAck};
use crate::checkpoint::stats::{CheckpointRecord, TaskCheckpointStats};
use crate::checkpoint::storage::{self, FileRef, Manifest, ManifestTask};
use crate::clock;

use super::pending::Pending;
use super::{Coordinator, CoordinatorError};

impl Coordinator {
    /// Completes pending checkpoint `id`, which every task acknowledged.
    pub(super) fn complete(&mut self, id: u64) -> Result<(), CoordinatorError> {
        let mut p = self.pending.remove(&id).expect("completing a pending checkpoint");
        let acks: Vec<TaskAck> = std::mem::take(&mut p.acks)
            .into_iter()
            .map(|a| a.expect("every task acked"))
            .collect();
        let duration = p.trigger.elapsed();
        let acked_us = duration.as_micros() as u64;
        let (manifest, files_written) = self.manifest(id, &p, &acks, acked_us);
        let shared_written = acks.iter().any(|a| a.wrote_shared);
        if let Err(e) = manifest.commit(&self.root, files_written, shared_written, p.prepared) {
            // Put it back so that abort() accounts for it.
            self.pending.insert(
                id,
                Pending {
                    trigger: p.trigger,
                    trigger_unix_ms: p.trigger_unix_ms,
                    is_final: p.is_final,
                    acks: Vec::new(),
                    received: 0,
                    prepared: p.prepared,
                },
            );
            return self.abort(id, format!("writing the manifest failed: {e}"));
        }
        self.remember_shared_files(id, &manifest);
        let duration = p.trigger.elapsed();
        self.signals.complete(id);
        self.prime_relay();
        self.last_completion = Instant::now();
        self.consecutive_failures = 0;
        tracing::debug!(checkpoint = id, ?duration, "checkpoint complete");
        self.record_completed(id, &p, &acks, acked_us, duration);
        // Older checkpoints still pending can only complete after this one.
        self.subsume_older(id);
        self.retain(id);
        self.collect_garbage();
        self.prepare_ahead();
        Ok(())
    }

    /// The manifest of checkpoint `id`, acknowledged by `acks` after
    /// `acked_us`, and whether any task state is a file of its own.
    fn manifest(&self, id: u64, p: &Pending, acks: &[TaskAck], acked_us: u64) -> (Manifest, bool) {
        let (tasks, task_files, inline) = self.manifest_tasks(id, acks);
        let files_written = !task_files.is_empty();
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
        (manifest, files_written)
    }

    /// The manifest's entry of each task of checkpoint `id`, the task
    /// state files and the manifest's inline part. Inline states go one
    /// after another into the inline part; the others are files of their
    /// own.
    fn manifest_tasks(&self, id: u64, acks: &[TaskAck]) -> (Vec<ManifestTask>, Vec<FileRef>, Vec<u8>) {
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
        (tasks, task_files, inline)
    }

    /// Records completed checkpoint `id` in the statistics.
    fn record_completed(&self, id: u64, p: &Pending, acks: &[TaskAck], acked_us: u64, duration: Duration) {
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
        let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        stats.record_completed(record);
        stats.in_progress = self.pending.len() as u64;
    }
}
