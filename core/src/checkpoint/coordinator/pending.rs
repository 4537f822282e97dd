//! Pending checkpoints: triggered, not yet complete. A checkpoint is
//! pending from its trigger (its folder made, the tasks told) until every
//! task acknowledged it, a task declined it, it timed out, or a newer one
//! completed first and subsumed it. An abort counts as a failure, and too
//! many in a row (or the final checkpoint's) stop the job; a subsumption
//! does not.

use std::time::{Instant, SystemTime};

use crate::checkpoint::snapshot::TaskAck;
use crate::checkpoint::stats::FailedCheckpoint;
use crate::checkpoint::storage;
use crate::clock;

use super::{Coordinator, CoordinatorError};

/// A checkpoint in flight, and the acknowledgements received so far.
pub(super) struct Pending {
    pub(super) trigger: Instant,
    pub(super) trigger_unix_ms: u64,
    pub(super) is_final: bool,
    /// Per task, its acknowledgement once received.
    pub(super) acks: Vec<Option<TaskAck>>,
    pub(super) received: usize,
    /// Whether the checkpoint's folder and empty manifest were made and
    /// their entries synced ahead or at the trigger
    /// ([`storage::prepare_checkpoint`]), so that the manifest's commit
    /// is one write and one `fdatasync`.
    pub(super) prepared: bool,
}

impl Coordinator {
    /// Starts checkpoint `next_id`: makes its folder, tells the tasks, and
    /// makes it pending.
    pub(super) fn trigger(&mut self, now: Instant, is_final: bool) -> Result<(), CoordinatorError> {
        let id = self.next_id;
        let (created, prepared_ahead) = match self.ahead.take() {
            Some((ahead, prepared)) if ahead == id => (true, prepared),
            stale => {
                if let Some((ahead, _)) = stale {
                    let _ = self.remove_folder(ahead);
                }
                (self.create_folder(id)?, false)
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
        // The folder's and the empty manifest's entries, synced ahead
        // (`prepare_ahead`, after the last completion) or else now, while
        // the barriers travel and the tasks snapshot: the manifest's commit
        // is then one data sync after the last acknowledgement, where a
        // rename would need two. If they could not be made or synced, the
        // commit writes the manifest by rename and syncs the folders (and
        // the first file written creates the folder). (Acknowledgements
        // are handled on this thread, so none arrives before the
        // checkpoint is pending below.)
        let prepared = prepared_ahead || (created && self.prepare_folder(id));
        self.pending.insert(
            id,
            Pending {
                trigger: now,
                trigger_unix_ms,
                is_final,
                acks: vec![None; self.tasks.len()],
                received: 0,
                prepared,
            },
        );
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).in_progress = self.pending.len() as u64;
        Ok(())
    }

    /// Makes the next checkpoint's folder and prepares it, once the
    /// coordinator has nothing else to do (after a completion, well before
    /// the next trigger), so that the trigger waits for no disk: two folder
    /// syncs at the trigger delayed the acknowledgements handled after
    /// them. An error is left for the trigger to meet again (an existing
    /// folder fails it there, naming it).
    pub(super) fn prepare_ahead(&mut self) {
        if self.ahead.is_some() || self.final_triggered {
            return;
        }
        let id = self.next_id;
        if storage::create_checkpoint_dir(&self.root, id).is_ok() {
            let prepared = self.prepare_folder(id);
            self.ahead = Some((id, prepared));
        }
    }

    /// Makes checkpoint `id`'s folder, before the tasks hear of the id;
    /// false if it could not be made (the first file written makes it).
    ///
    /// The folder must be new: ids start past every folder on disk and
    /// never repeat, so an existing one means that something else writes
    /// into this directory. Writing into it would break that checkpoint's
    /// manifest; the attempt fails instead (a restart numbers past it).
    fn create_folder(&self, id: u64) -> Result<bool, CoordinatorError> {
        match storage::create_checkpoint_dir(&self.root, id) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(CoordinatorError::Failed(format!(
                "cannot trigger checkpoint {id}: its folder {} exists already, and a checkpoint never \
                 writes into another one's folder; is another job using the checkpoint directory {}? \
                 Give each job a directory of its own",
                storage::checkpoint_dir(&self.root, id).display(),
                self.root.display()
            ))),
            Err(e) => {
                tracing::debug!(checkpoint = id, error = %e, "could not create the checkpoint folder ahead");
                Ok(false)
            }
        }
    }

    /// Makes checkpoint `id`'s empty manifest and syncs its entry and the
    /// new folder's; false if that failed.
    fn prepare_folder(&mut self, id: u64) -> bool {
        match storage::prepare_checkpoint(&self.root, id) {
            Ok(()) => {
                // The root's sync made every earlier folder removal durable.
                self.root_sync_owed = false;
                true
            }
            Err(e) => {
                tracing::debug!(checkpoint = id, error = %e, "could not prepare the checkpoint's manifest");
                false
            }
        }
    }

    /// Aborts the pending checkpoints not complete after the timeout.
    pub(super) fn abort_timed_out(&mut self, now: Instant) -> Result<(), CoordinatorError> {
        let timed_out: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| now.duration_since(p.trigger) >= self.cfg.timeout)
            .map(|(&id, _)| id)
            .collect();
        for id in timed_out {
            self.abort(id, format!("not complete after the timeout of {:?}", self.cfg.timeout))?;
        }
        Ok(())
    }

    /// A task's acknowledgement: the checkpoint completes with the last one.
    pub(super) fn on_ack(&mut self, ack: Box<TaskAck>) -> Result<(), CoordinatorError> {
        let id = ack.id;
        if ack.generation < self.generations[ack.task] {
            // A zombie: an incarnation that failed and was replaced (dedup
            // recovery), whose snapshot finished late. Its checkpoints were
            // given up when it failed; one still pending here (never
            // expected) is given up too, since the zombie's files may have
            // replaced the live incarnation's. Its files go like a late
            // ack's.
            tracing::warn!(
                checkpoint = id,
                task = ack.task,
                generation = ack.generation,
                "refused a snapshot of a replaced incarnation"
            );
            if self.discard(id).is_some() {
                self.stats.lock().unwrap_or_else(|e| e.into_inner()).subsumed += 1;
            }
            self.late_ack(&ack);
            return Ok(());
        }
        let Some(p) = self.pending.get_mut(&id) else {
            self.late_ack(&ack);
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

    /// Late ack of an aborted checkpoint of this attempt: its folder is
    /// gone or going; removes what the task wrote.
    fn late_ack(&mut self, ack: &TaskAck) {
        let id = ack.id;
        if id < self.first_id || self.retained.contains(&id) {
            return;
        }
        let _ = self.remove_folder(id);
        let fence = self.next_id.saturating_sub(1);
        self.doomed
            .extend(ack.shared_files.iter().map(|f| (f.path.clone(), fence)));
        self.collect_garbage();
    }

    /// A task declined checkpoint `id`: it is aborted.
    pub(super) fn on_decline(&mut self, id: u64, task: usize, reason: String) -> Result<(), CoordinatorError> {
        if self.pending.contains_key(&id) {
            let t = &self.tasks[task];
            self.abort(
                id,
                format!("task '{}' subtask {} declined: {reason}", t.name, t.subtask),
            )?;
        }
        Ok(())
    }

    /// Gives up pending checkpoint `id` as failed, for `reason`: discarded,
    /// counted and reported. An error when the job must stop: the final
    /// checkpoint failed, or more checkpoints in a row than tolerated.
    pub(super) fn abort(&mut self, id: u64, reason: String) -> Result<(), CoordinatorError> {
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
    pub(super) fn discard(&mut self, id: u64) -> Option<Pending> {
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

    /// Gives up every checkpoint still pending that is older than `id`,
    /// which completed: they could only complete after it, and none of them
    /// may ever become the latest (sinks commit through `id` already; a
    /// restore must never go back behind it).
    pub(super) fn subsume_older(&mut self, id: u64) {
        let older: Vec<u64> = self.pending.range(..id).map(|(&k, _)| k).collect();
        for k in older {
            self.subsume(k, id);
        }
    }
}
