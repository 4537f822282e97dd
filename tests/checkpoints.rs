//! Checkpointing end to end: in every mode, a keyed job with failures
//! injected at random points restarts from its checkpoints, and its
//! committed output is checked exactly (see `common` for the job and the
//! transactional sink).

mod common;

use common::*;
use weir_core::CheckpointMode;

#[test]
fn aligned_survives_failures_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(BASE, dir.path());
    assert_eq!(out.restarts, 3, "three injected failures, three restarts");
    assert!(out.completed >= 2, "checkpoints completed: {}", out.completed);
    assert_exactly_once(BASE, &out.rows);
}

#[test]
fn unaligned_survives_failures_exactly_once() {
    let job = Job {
        mode: CheckpointMode::Unaligned,
        ..BASE
    };
    let dir = tempfile::tempdir().unwrap();
    let out = run(job, dir.path());
    assert_eq!(out.restarts, 3);
    assert_exactly_once(job, &out.rows);
}

#[test]
fn at_least_once_loses_nothing() {
    let job = Job {
        mode: CheckpointMode::AtLeastOnce,
        ..BASE
    };
    let dir = tempfile::tempdir().unwrap();
    let out = run(job, dir.path());
    assert_eq!(out.restarts, 3);
    let duplicates = assert_no_loss(job, &out.rows);
    eprintln!("at-least-once: {duplicates} duplicate counts");
}

#[test]
fn union_of_uneven_inputs_in_every_mode() {
    for mode in [
        CheckpointMode::Aligned,
        CheckpointMode::Unaligned,
        CheckpointMode::AtLeastOnce,
    ] {
        let job = Job {
            mode,
            union_slow: true,
            failures: 2,
            ..BASE
        };
        let dir = tempfile::tempdir().unwrap();
        let out = run(job, dir.path());
        assert_eq!(out.restarts, 2, "{mode:?}");
        if mode.is_exactly_once() {
            assert_exactly_once(job, &out.rows);
        } else {
            assert_no_loss(job, &out.rows);
        }
    }
}

#[test]
fn unaligned_under_backpressure_stores_and_replays_channel_state() {
    let job = Job {
        mode: CheckpointMode::Unaligned,
        events: 20_000,
        slow_us: 20,
        ring: 64,
        failures: 1,
        ..BASE
    };
    let dir = tempfile::tempdir().unwrap();
    let out = run(job, dir.path());
    // Speed is for the benchmark; here: checkpoints do complete while the
    // queues are full, and none fails.
    assert!(
        out.completed >= 2,
        "checkpoints complete under backpressure: {} (failed {})",
        out.completed,
        out.failed
    );
    assert_eq!(out.failed, 0);
    assert!(out.channel_state_bytes > 0, "in-flight records were stored");
    assert_exactly_once(job, &out.rows);
}

#[test]
fn failure_free_runs_agree_in_every_mode() {
    for mode in [
        CheckpointMode::Aligned,
        CheckpointMode::Unaligned,
        CheckpointMode::AtLeastOnce,
    ] {
        let job = Job {
            mode,
            failures: 0,
            ..BASE
        };
        let dir = tempfile::tempdir().unwrap();
        let out = run(job, dir.path());
        assert_eq!(out.restarts, 0);
        assert_exactly_once(job, &out.rows);
    }
}
