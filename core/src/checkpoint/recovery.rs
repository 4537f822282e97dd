//! Finding and loading the checkpoint a job starts from.
//!
//! Only complete checkpoints (a manifest that verifies) are candidates.
//! Every file the manifest names is checked (present, size, CRC32) before
//! anything is restored; a failure is an error naming the checkpoint, the
//! file and the position, and the job does not start. Falling back to an
//! older checkpoint happens only with [`RestoreFrom::LatestValid`].

use std::path::{Path, PathBuf};

use super::config::RestoreFrom;
use super::snapshot::TaskState;
use super::storage::{self, Manifest};
use crate::error::{Error, Result};

/// A loaded checkpoint.
#[derive(Debug)]
pub(crate) struct Restored {
    pub(crate) manifest: Manifest,
    /// Task states by chain group.
    pub(crate) states: Vec<Vec<TaskState>>,
}

/// Loads and verifies checkpoint `id`.
pub(crate) fn load(root: &Path, id: u64, fingerprint: &str, groups: usize) -> Result<Restored> {
    load_located(root, id, fingerprint, groups).map_err(|(e, _)| e)
}

/// [`load`]; a failure with the damaged file and the byte it starts at, if
/// damaged bytes (a failed check) were the cause.
type Damaged = Option<(PathBuf, u64)>;

/// For one subtask recovering alone (dedup): checkpoint `id`, which this
/// job completed or restored from (so its folder is durable already), with
/// the task states of chain `group` only. Its files are not verified
/// ahead: every byte the replacement reads is checked as it is read (a
/// task state's frame CRC, a state file's checksums, the manifest's own);
/// a damaged one fails the recovery, and the whole job restarts, which
/// verifies everything ([`load`]). Verifying every task's files and
/// syncing the folder took 1-7 ms of a 20 ms recovery here. A failure
/// comes with the damaged file and the byte it starts at, if damaged
/// bytes were the cause (for the caller to report).
pub(crate) fn load_group(
    root: &Path,
    id: u64,
    fingerprint: &str,
    groups: usize,
    group: usize,
) -> std::result::Result<Restored, (Error, Damaged)> {
    load_checked(root, id, fingerprint, groups, Some(group))
}

fn load_located(
    root: &Path,
    id: u64,
    fingerprint: &str,
    groups: usize,
) -> std::result::Result<Restored, (Error, Damaged)> {
    load_checked(root, id, fingerprint, groups, None)
}

/// [`load_located`]; with `only`, [`load_group`]'s.
fn load_checked(
    root: &Path,
    id: u64,
    fingerprint: &str,
    groups: usize,
    only: Option<usize>,
) -> std::result::Result<Restored, (Error, Damaged)> {
    let checked = |e: storage::CheckFailed| (Error::Restore(e.message), e.damaged);
    let plain = |e: Error| (e, None);
    let manifest = match storage::read_manifest_file(root, id).map_err(checked)? {
        Some(storage::ManifestFile::Complete(m)) => m,
        Some(storage::ManifestFile::Unfinished(why)) => {
            return Err(plain(Error::Restore(format!(
                "checkpoint {id} in {} is not complete: its MANIFEST is unfinished ({why})",
                root.display()
            ))))
        }
        None => {
            return Err(plain(Error::Restore(format!(
                "checkpoint {id} in {} is not complete (no manifest)",
                root.display()
            ))))
        }
    };
    if manifest.fingerprint != fingerprint {
        let theirs: Vec<String> = manifest.groups.iter().map(|g| g.operators.join(" -> ")).collect();
        return Err(plain(Error::Restore(format!(
            "checkpoint {id} in {} belongs to another job graph (job '{}', fingerprint {}, chains [{}]); \
             this job's fingerprint is {fingerprint}: use another checkpoint directory or start fresh",
            root.display(),
            manifest.job,
            manifest.fingerprint,
            theirs.join("; ")
        ))));
    }
    if only.is_none() {
        storage::verify_files_located(root, &manifest).map_err(checked)?;
        // The manifest may be the work of an earlier process that stopped, or
        // whose folder fsync failed, between its rename and that sync: found is
        // not durable. Sinks are about to commit through this checkpoint, so
        // a crash must not take it back: its folder is synced first (every
        // file it names was synced before the manifest was written).
        let dir = storage::checkpoint_dir(root, id);
        storage::sync_dir(&dir).map_err(|e| {
            plain(Error::Restore(format!(
                "checkpoint {id}: cannot fsync its folder {} before restoring from it: {e}",
                dir.display()
            )))
        })?;
    }
    let mut states: Vec<Vec<TaskState>> = (0..groups).map(|_| Vec::new()).collect();
    for t in manifest.tasks.iter().filter(|t| only.is_none_or(|g| g == t.group)) {
        let path = root.join(&t.file.path);
        let what = match t.inline_offset {
            Some(off) => format!("checkpoint {id}: {} (inline state at {off})", path.display()),
            None => format!("checkpoint {id}: {}", path.display()),
        };
        let bytes = t
            .state_bytes_in(root, &manifest)
            .map_err(|e| plain(Error::Restore(format!("{what}: {e}"))))?;
        // Its bytes were verified above (whole-file CRC, or the manifest's
        // inline CRC), but a task file is read again here: its own CRC
        // checks this read. (Inline bytes are not read again: a frame that
        // passed its CRC and does not decode is no damage on disk.)
        let state = TaskState::decode(&bytes, &what).map_err(|e| {
            let damaged = t.inline_offset.is_none().then(|| (path.clone(), 0));
            (Error::Restore(e), damaged)
        })?;
        let g = states.get_mut(t.group).ok_or_else(|| {
            plain(Error::Restore(format!(
                "checkpoint {id}: chain {} does not exist in this job",
                t.group
            )))
        })?;
        g.push(state);
    }
    Ok(Restored { manifest, states })
}

/// Completed checkpoint ids on disk, ascending: with a manifest that is not
/// unfinished ([`storage::is_complete`]; a damaged one counts, so that a
/// restore stops at it).
pub(crate) fn completed_ids(root: &Path) -> Result<Vec<u64>> {
    let ids = storage::list_ids(root).map_err(|e| Error::Restore(format!("listing {}: {e}", root.display())))?;
    Ok(ids.into_iter().filter(|&id| storage::is_complete(root, id)).collect())
}

/// Deletes checkpoint folders that never got a whole manifest (a crash or
/// an abort left them); they are never restored.
pub(crate) fn remove_incomplete(root: &Path) {
    if let Ok(ids) = storage::list_ids(root) {
        for id in ids {
            if let Some(why) = storage::incomplete(root, id) {
                tracing::debug!(checkpoint = id, why = %why, "deleting an incomplete checkpoint");
                let _ = storage::remove_checkpoint(root, id);
            }
        }
    }
}

/// Deletes files in `shared/` that no complete checkpoint references:
/// written for checkpoints that never completed before a crash. Runs before
/// any task starts, so no snapshot in flight can need them.
pub(crate) fn remove_orphaned_shared_files(root: &Path) -> Result<usize> {
    let shared = root.join(storage::SHARED);
    let names = match crate::storage::vfs::read_dir(&shared) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(Error::Restore(format!("listing {}: {e}", shared.display()))),
    };
    let mut referenced = std::collections::HashSet::new();
    for id in completed_ids(root)? {
        match storage::read_manifest_located(root, id) {
            Ok(Some(m)) => referenced.extend(m.files.into_iter().map(|f| f.path)),
            Ok(None) => {}
            // A manifest that does not parse protects everything: never
            // delete what a checkpoint we cannot read might need.
            Err(e) => {
                e.report_damage("read to find orphaned shared state files at the start: none is deleted");
                return Ok(0);
            }
        }
    }
    let mut removed = 0;
    for name in names {
        let rel = format!("{}/{name}", storage::SHARED);
        if !referenced.contains(&rel) && crate::storage::vfs::remove_file(shared.join(&name)).is_ok() {
            removed += 1;
        }
    }
    Ok(removed)
}

/// Picks and loads the checkpoint to start from.
pub(crate) fn find(root: &Path, from: RestoreFrom, fingerprint: &str, groups: usize) -> Result<Option<Restored>> {
    match from {
        RestoreFrom::Nothing => Ok(None),
        RestoreFrom::Id(id) => load(root, id, fingerprint, groups).map(Some),
        RestoreFrom::Latest => match completed_ids(root)?.last() {
            Some(&id) => load(root, id, fingerprint, groups).map(Some),
            None => Ok(None),
        },
        RestoreFrom::LatestValid => {
            for &id in completed_ids(root)?.iter().rev() {
                match load_located(root, id, fingerprint, groups) {
                    Ok(r) => return Ok(Some(r)),
                    Err((e, Some((file, at)))) => crate::storage::corruption::report(
                        &file,
                        at,
                        &format!("{e}; restoring an older checkpoint instead of {id}"),
                    ),
                    Err((e, None)) => {
                        tracing::warn!(checkpoint = id, error = %e, "skipping a checkpoint that does not verify")
                    }
                }
            }
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::snapshot::TaskState;
    use crate::checkpoint::storage::{DirSync, FileRef, ManifestGroup, ManifestTask, MANIFEST};
    use crate::fuzzing::bit_flips;
    use crate::storage::vfs::sim::{Faults, SimFs};
    use std::io::Write;
    use std::sync::Arc;

    const ID: u64 = 7;

    fn state(subtask: u32, operator: Vec<u8>) -> TaskState {
        TaskState {
            checkpoint: ID,
            group: 0,
            subtask,
            parallelism: 3,
            source_offset: Some(format!("partition-{subtask}@1042").into_bytes()),
            operators: vec![(0, operator), (1, vec![])],
            ..TaskState::default()
        }
    }

    /// Checkpoint 7 of a job of one chain of three subtasks: subtasks 0 and
    /// 1 inline in the manifest, subtask 2 in its own file. Returns the
    /// states and the two files (manifest, task file).
    fn write_checkpoint(root: &Path) -> (Vec<TaskState>, [PathBuf; 2]) {
        let states: Vec<TaskState> = (0..3).map(|s| state(s, vec![s as u8 + 1; 24 << s])).collect();
        let frames: Vec<Vec<u8>> = states.iter().map(TaskState::encode).collect();
        storage::create_checkpoint_dir(root, ID).unwrap();
        let dir = storage::checkpoint_dir(root, ID);
        let own = storage::write_durable(root, &dir, &storage::task_file_name(0, 2), &frames[2], DirSync::Now).unwrap();
        let task = |subtask: usize, file: FileRef, inline_offset: Option<u64>| ManifestTask {
            group: 0,
            subtask,
            state_bytes: file.size,
            file,
            inline_offset,
            channel_state_bytes: 0,
            sync_us: 11,
            async_us: 0,
            alignment_us: 3,
        };
        let inline = |bytes: &[u8]| FileRef {
            path: format!("chk-{ID:010}/{MANIFEST}"),
            size: bytes.len() as u64,
            crc32: crc32fast::hash(bytes),
        };
        let m = Manifest {
            version: storage::MANIFEST_VERSION,
            job: "flips".into(),
            fingerprint: "fp-1".into(),
            id: ID,
            mode: crate::checkpoint::CheckpointMode::Aligned,
            is_final: false,
            trigger_unix_ms: 1_700_000_000_000,
            duration_us: 850,
            groups: vec![ManifestGroup {
                operators: vec!["0.0:source".into(), "0.1:map".into()],
                parallelism: 3,
            }],
            tasks: vec![
                task(0, inline(&frames[0]), Some(0)),
                task(1, inline(&frames[1]), Some(frames[0].len() as u64)),
                task(2, own.clone(), None),
            ],
            files: vec![own.clone()],
            inline: [&frames[0][..], &frames[1][..]].concat(),
        };
        m.commit(root, true, false, false).unwrap();
        (states, [dir.join(MANIFEST), root.join(&own.path)])
    }

    fn put(path: &Path, bytes: &[u8]) {
        let mut f = crate::storage::vfs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(path)
            .unwrap();
        f.write_all(bytes).unwrap();
    }

    /// A subtask recovering alone loads its own chain's states only and
    /// checks what it reads: a damaged task file of its chain fails it, and
    /// a recovery in another chain never reads that file (a whole restore
    /// verifies every file first).
    #[test]
    fn a_recovery_alone_loads_and_checks_its_own_chain_only() {
        let root = Path::new("/weir-recovery-group");
        crate::storage::vfs::mount(root, Arc::new(SimFs::new(root, 1, Faults::default())));
        let (states, files) = write_checkpoint(root);
        let group = |g| load_group(root, ID, "fp-1", 2, g).map_err(|(e, _)| e);
        assert_eq!(group(0).unwrap().states, vec![states, vec![]]);
        let mut bytes = crate::storage::vfs::read(&files[1]).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x10;
        put(&files[1], &bytes);
        let e = group(0).unwrap_err().to_string();
        assert!(e.contains(&*files[1].to_string_lossy()), "{e}");
        assert_eq!(group(1).unwrap().states, vec![vec![], vec![]]);
        assert!(
            load(root, ID, "fp-1", 2).is_err(),
            "a whole restore verifies every file"
        );
        crate::storage::vfs::unmount(root);
    }

    /// What `find` with `RestoreFrom::LatestValid` reports for a
    /// checkpoint that does not load (`corruption::report` of the file and
    /// the position): every flipped bit of the manifest or of a task file,
    /// and every cut of a task file, is a failure that names the damaged
    /// file and a position at or before the flipped byte (the cut). A
    /// manifest cut short is an unfinished one: the checkpoint is not
    /// complete. A failure without
    /// a position would be skipped with a log line only, unreported.
    #[test]
    fn every_flipped_bit_and_cut_of_a_checkpoint_is_located_at_or_before_it() {
        let root = Path::new("/weir-recovery-flips");
        crate::storage::vfs::mount(root, Arc::new(SimFs::new(root, 1, Faults::default())));
        let (states, files) = write_checkpoint(root);
        let load = || load_located(root, ID, "fp-1", 1);
        assert_eq!(load().unwrap().states, vec![states]);
        for path in &files {
            let bytes = crate::storage::vfs::read(path).unwrap();
            let located = |damaged: &[u8], what: &str| -> u64 {
                put(path, damaged);
                match load() {
                    Ok(_) => panic!("{}: {what} accepted", path.display()),
                    Err((e, None)) => panic!("{}: {what} not located: {e}", path.display()),
                    Err((e, Some((file, at)))) => {
                        assert_eq!(&file, path, "{what}: {e}");
                        at
                    }
                }
            };
            for (i, bit, b) in bit_flips(&bytes) {
                let at = located(&b, &format!("flip of bit {bit} at {i}"));
                assert!(
                    at <= i as u64,
                    "{}: flip of bit {bit} at {i} located at {at}",
                    path.display()
                );
            }
            for len in 0..bytes.len() {
                if path == &files[0] {
                    // A manifest cut short is what a crash leaves of its
                    // write: unfinished, the checkpoint incomplete.
                    put(path, &bytes[..len]);
                    match load() {
                        Err((e, None)) => assert!(e.to_string().contains("not complete"), "cut at {len}: {e}"),
                        other => panic!("manifest cut at {len}: {:?}", other.map(|r| r.states)),
                    }
                    continue;
                }
                let at = located(&bytes[..len], &format!("cut at {len}"));
                assert!(at <= len as u64, "{}: cut at {len} located at {at}", path.display());
            }
            put(path, &bytes);
        }
        assert!(load().is_ok());
        crate::storage::vfs::unmount(root);
    }
}
