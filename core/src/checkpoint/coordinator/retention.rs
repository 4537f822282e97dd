//! Retention and cleanup: the newest `retained` completed checkpoints stay
//! on disk, oldest first, and the oldest is dropped as a new one
//! completes. Its folder goes at once; the shared state files it
//! referenced (`shared/`, written by incremental snapshots) wait in a
//! queue until no retained checkpoint references them and no checkpoint
//! pending when they were queued can still build on them. Removals of
//! checkpoint folders are made durable before any shared file is deleted,
//! so that a crash never brings back a manifest naming a deleted file.

use std::collections::HashSet;

use crate::checkpoint::storage::{self, Manifest, Removal};

use super::Coordinator;

impl Coordinator {
    /// Keeps completed checkpoint `id`, and drops the oldest retained ones
    /// past the number to retain. Oldest first, whatever the order of
    /// completion: retention drops from the front and so always keeps the
    /// newest.
    pub(super) fn retain(&mut self, id: u64) {
        let at = self.retained.partition_point(|&r| r < id);
        self.retained.insert(at, id);
        while self.retained.len() > self.cfg.retained {
            let old = self.retained.pop_front().expect("non-empty");
            self.drop_checkpoint(old);
        }
    }

    /// Notes the shared files checkpoint `id`'s manifest references, to
    /// queue them for deletion once it is dropped.
    pub(super) fn remember_shared_files(&mut self, id: u64, manifest: &Manifest) {
        self.shared_of.insert(
            id,
            manifest
                .files
                .iter()
                .filter(|f| f.path.starts_with(storage::SHARED))
                .map(|f| f.path.clone())
                .collect(),
        );
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
    pub(super) fn remove_folder(&mut self, id: u64) -> std::io::Result<()> {
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
    pub(super) fn collect_garbage(&mut self) {
        if self.doomed.is_empty() {
            return;
        }
        let oldest_pending = self.pending.keys().next().copied().unwrap_or(u64::MAX);
        let mut referenced = HashSet::new();
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

    /// Deletes every retained checkpoint, and the shared files with them
    /// (a cancelled job that keeps none).
    pub(super) fn delete_retained(&mut self) {
        for id in std::mem::take(&mut self.retained) {
            let _ = self.remove_folder(id);
        }
        // Their manifests gone durably first, as for any shared file.
        if self.sync_removals() {
            let _ = crate::storage::vfs::remove_dir_all(self.root.join(storage::SHARED));
        }
    }
}
