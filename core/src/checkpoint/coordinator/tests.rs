//! The coordinator driven by hand, without a job: checkpoints triggered
//! and acknowledged by the test, then the folders, manifests, shared files
//! and statistics it leaves checked.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::checkpoint::config::{CheckpointConfig, RestoreFrom};
use crate::checkpoint::recovery;
use crate::checkpoint::signals::{Event, Signals};
use crate::checkpoint::snapshot::{AckedState, TaskAck, TaskState};
use crate::checkpoint::stats::CheckpointStats;
use crate::checkpoint::storage::{self, FileRef, Manifest, ManifestGroup};
use crate::checkpoint::CheckpointMode;

use super::{Coordinator, CoordinatorError, TaskInfo};

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
        generation: 0,
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

/// The final checkpoint is in flight from its trigger to its completion:
/// a subtask failing then restarts the whole job (its pending checkpoints
/// cannot be given up, the final one is never triggered again).
#[test]
fn the_final_checkpoint_is_in_flight_until_it_completes() {
    let dir = tempfile::tempdir().unwrap();
    let (mut c, _, _) = coordinator(dir.path(), 1, |_| {});
    c.handle(Event::SourceExhausted { task: 0 }).unwrap();
    c.tick().unwrap();
    assert!(!c.final_in_flight(), "one source still reads: no final checkpoint");
    c.handle(Event::SourceExhausted { task: 1 }).unwrap();
    c.tick().unwrap();
    assert!(c.final_in_flight(), "the final checkpoint 1 pending");
    c.handle(ack(1, 0)).unwrap();
    assert!(c.final_in_flight());
    c.handle(ack(1, 1)).unwrap();
    assert!(!c.final_in_flight(), "completed");
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

/// Once a checkpoint completes, the next one's folder is made and prepared
/// ahead (its empty manifest: an incomplete checkpoint, never restored),
/// so that the trigger waits for no disk; the trigger takes it, and a
/// shutdown deletes one never triggered.
#[test]
fn the_next_folder_is_prepared_ahead_and_never_restored() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (mut c, signals, _) = coordinator(root, 1, |_| {});
    c.trigger(Instant::now(), false).unwrap();
    c.handle(ack(1, 0)).unwrap();
    c.handle(ack(1, 1)).unwrap();
    assert_eq!(signals.completed(), 1);
    let next = storage::checkpoint_dir(root, 2);
    assert_eq!(
        std::fs::read(next.join(storage::MANIFEST)).unwrap(),
        b"",
        "made ahead, empty"
    );
    assert!(storage::incomplete(root, 2).is_some_and(|why| why.contains("empty")));
    assert_eq!(recovery::completed_ids(root).unwrap(), vec![1]);
    c.trigger(Instant::now(), false).unwrap();
    assert_eq!(c.ahead, None, "the trigger took the folder made ahead");
    c.handle(ack(2, 0)).unwrap();
    c.handle(ack(2, 1)).unwrap();
    assert_eq!(recovery::completed_ids(root).unwrap().last(), Some(&2));
    assert_eq!(c.ahead, Some((3, true)));
    c.shutdown(false);
    assert!(!storage::checkpoint_dir(root, 3).exists(), "never triggered: deleted");
    let restored = recovery::find(root, RestoreFrom::Latest, "fp", 1).unwrap().unwrap();
    assert_eq!(restored.manifest.id, 2);
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

/// Dedup recovery: when task 0 fails and recovers alone, every pending
/// checkpoint is given up (not counted as a failure), the restore point is
/// the latest completed one, and a snapshot of the replaced incarnation
/// (a zombie's, generation 0) is refused, even for a checkpoint triggered
/// after the failure; the replacement's (generation 1) completes it.
#[test]
fn a_replaced_incarnation_s_snapshot_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (mut c, signals, stats) = coordinator(root, 1, |cfg| cfg.max_concurrent = 2);
    c.trigger(Instant::now(), false).unwrap();
    c.handle(ack(1, 0)).unwrap();
    c.handle(ack(1, 1)).unwrap();
    assert_eq!(signals.completed(), 1);
    c.trigger(Instant::now(), false).unwrap();
    c.handle(ack(2, 1)).unwrap();
    let (generation, restore_from) = c.task_failed(0);
    assert_eq!((generation, restore_from), (1, 1));
    assert_eq!(signals.aborted_after(1), vec![2], "the pending checkpoint is given up");
    assert!(!storage::checkpoint_dir(root, 2).exists());
    c.trigger(Instant::now(), false).unwrap();
    // A zombie's snapshot (generation 0) is refused, and the checkpoint
    // it reached is given up, since its files might replace the live
    // incarnation's.
    c.handle(ack(3, 1)).unwrap();
    c.handle(ack(3, 0)).unwrap();
    assert_eq!(signals.completed(), 1, "a zombie's snapshot does not count");
    assert!(!storage::checkpoint_dir(root, 3).exists());
    c.trigger(Instant::now(), false).unwrap();
    let Event::Ack(mut a) = ack(4, 0) else { unreachable!() };
    a.generation = 1;
    c.handle(Event::Ack(a)).unwrap();
    c.handle(ack(4, 1)).unwrap();
    assert_eq!(
        signals.completed(),
        4,
        "the replacement's snapshot completes the next one"
    );
    let st = stats.lock().unwrap();
    assert_eq!(
        (st.completed, st.failed),
        (2, 0),
        "the given-up checkpoints are no failures"
    );
}
