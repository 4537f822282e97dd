//! Crash consistency of checkpoint files: a fault injected at every durable
//! step of writing a checkpoint (task state files, inline states in the
//! manifest, and the manifest) fails
//! that checkpoint; the job, stopped right there as if it had crashed, is
//! resumed by a new run from the same directory, and the committed output
//! of both runs together is exactly-once.
//!
//! Fault points are process-wide, so this file holds one test that walks
//! the points one after the other (its own test binary: nothing else runs
//! beside it).

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use weir_core::checkpoint::storage;
use weir_core::fault::{self, Action};
use weir_core::{CheckpointMode, Error, RestartStrategy};

/// Each point, how many hits to let pass first, and whether a checkpoint
/// of inline states hits it: task files are written once per task per
/// checkpoint (temporary name, fsync, rename), the manifest once per
/// checkpoint, into the empty file made ahead of the trigger (no rename).
const POINTS: &[(&str, u32, bool)] = &[
    ("checkpoint.write.before", 6, true),
    ("checkpoint.write.before-fsync", 7, true),
    ("checkpoint.write.before-rename", 8, false),
    ("checkpoint.manifest.before", 2, true),
];

#[test]
fn a_fault_at_any_durable_step_leaves_the_previous_checkpoint_restorable() {
    // Task states inline in the manifest (the default: the write points
    // but the rename are hit by the manifest's write), and in task files
    // of their own.
    for inline_state_max in [weir_core::checkpoint::DEFAULT_INLINE_STATE_MAX, 0] {
        let inline = inline_state_max > 0;
        for &(point, skip, _) in POINTS.iter().filter(|p| p.2 || !inline) {
            for mode in [CheckpointMode::Aligned, CheckpointMode::Unaligned] {
                one_fault(point, skip, mode, inline_state_max);
            }
        }
    }
}

fn one_fault(point: &str, skip: u32, mode: CheckpointMode, inline_state_max: usize) {
    let job = Job {
        mode,
        failures: 0,
        // Long enough for the fault to hit: 1 s at 5 ms intervals. The
        // points need at most 9 checkpoints; 0.3 s was too short on a
        // loaded 2-core machine, whose slow fsyncs stretch checkpoints
        // (the job finished first in 3 of 5 runs there).
        events: 100_000,
        rate: 100_000.0,
        ..BASE
    };
    let dir = tempfile::tempdir().unwrap();
    let target = Arc::new(Mutex::new(Target::default()));
    // Let a few checkpoints succeed, then fail one step; with no
    // tolerance and no restart the job stops there.
    fault::arm(point, Action::FailAfter(skip));
    let first = run_with(job, dir.path(), &target, |c| {
        c.restart = RestartStrategy::None;
        if let Some(ck) = c.checkpointing.as_mut() {
            ck.tolerable_failures = 0;
            ck.inline_state_max = inline_state_max;
        }
    });
    fault::disarm_all();
    match first {
        Err(Error::Checkpoint(msg)) => assert!(msg.contains("injected fault"), "{point}: {msg}"),
        other => panic!(
            "{point} {mode:?}: expected a checkpoint failure, got {:?}",
            other.map(|r| r.outcome)
        ),
    }
    // Every complete checkpoint on disk verifies.
    let ids = storage::list_ids(dir.path()).unwrap();
    let mut complete = 0;
    for id in &ids {
        if let Some(m) = storage::read_manifest(dir.path(), *id).unwrap() {
            storage::verify_files(dir.path(), &m).unwrap();
            complete += 1;
        }
    }
    assert!(complete >= 1, "{point}: a previous checkpoint remains ({ids:?})");
    // Resume: the new run restores the latest complete checkpoint
    // and the two runs' committed output is exactly-once.
    let second = run_with(job, dir.path(), &target, |c| {
        if let Some(ck) = c.checkpointing.as_mut() {
            ck.inline_state_max = inline_state_max;
        }
    })
    .unwrap();
    assert!(
        second.metrics.checkpoints.restored_from.is_some(),
        "{point}: resumed from a checkpoint"
    );
    let rows = std::mem::take(&mut target.lock().unwrap().rows);
    assert_exactly_once(job, &rows);
}
