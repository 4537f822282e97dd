//! Checkpointing end to end: in every mode, a keyed job with failures
//! injected at random points restarts from its checkpoints, and its
//! committed output is checked exactly (see `common` for the job and the
//! transactional sink).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use weir_core::checkpoint::storage;
use weir_core::{CheckpointMode, Error, RestartStrategy, RestoreFrom, RuntimeConfig, StateBackend};

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
    assert_eq!(out.restarts, 3, "{:?}", out.restart_errors);
    assert_exactly_once(job, &out.rows);
}

/// The tests above take small keyed states whole and inline at each
/// barrier (the default for stores up to `inline_state_max`); with
/// `inline_state_max` 0 the same job writes incremental state files to
/// `shared/` on the snapshot pool, and still restores exactly.
#[test]
fn exactly_once_with_incremental_state_files() {
    for mode in [CheckpointMode::Aligned, CheckpointMode::Unaligned] {
        let job = Job { mode, ..BASE };
        let dir = tempfile::tempdir().unwrap();
        let target = Arc::new(Mutex::new(Target::default()));
        let result = run_with(job, dir.path(), &target, |c| {
            c.checkpointing.as_mut().unwrap().inline_state_max = 0;
        })
        .unwrap();
        assert_eq!(result.metrics.checkpoints.restarts.len(), 3, "{mode:?}");
        let shared = std::fs::read_dir(dir.path().join("shared")).map_or(0, |d| d.count());
        assert!(shared > 0, "{mode:?}: state files in shared/");
        let rows = std::mem::take(&mut target.lock().unwrap().rows);
        assert_exactly_once(job, &rows);
    }
}

#[test]
fn at_least_once_loses_nothing() {
    let job = Job {
        mode: CheckpointMode::AtLeastOnce,
        ..BASE
    };
    let dir = tempfile::tempdir().unwrap();
    let out = run(job, dir.path());
    assert_eq!(out.restarts, 3, "{:?}", out.restart_errors);
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
        assert_eq!(out.restarts, 2, "{mode:?}: {:?}", out.restart_errors);
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

#[test]
fn single_input_tasks_in_every_mode() {
    // One source subtask: every keyed task has exactly one input ring.
    for mode in [
        CheckpointMode::Aligned,
        CheckpointMode::Unaligned,
        CheckpointMode::AtLeastOnce,
    ] {
        let job = Job {
            mode,
            sources: 1,
            failures: 2,
            ..BASE
        };
        let dir = tempfile::tempdir().unwrap();
        let out = run(job, dir.path());
        assert_eq!(out.restarts, 2, "{mode:?}: {:?}", out.restart_errors);
        if mode.is_exactly_once() {
            assert_exactly_once(job, &out.rows);
        } else {
            assert_no_loss(job, &out.rows);
        }
    }
}

#[test]
fn aligned_past_its_alignment_timeout_goes_unaligned_and_stays_exactly_once() {
    let job = Job {
        mode: CheckpointMode::Aligned,
        events: 20_000,
        slow_us: 20,
        ring: 64,
        failures: 1,
        ..BASE
    };
    let dir = tempfile::tempdir().unwrap();
    let target = Arc::new(Mutex::new(Target::default()));
    let result = run_with(job, dir.path(), &target, |c| {
        if let Some(ck) = c.checkpointing.as_mut() {
            ck.alignment_timeout = Some(Duration::from_micros(1));
        }
    })
    .unwrap();
    let stats = &result.metrics.checkpoints;
    assert!(
        stats.history.iter().any(|r| r.channel_state_bytes > 0),
        "some aligned checkpoint switched to unaligned and stored in-flight records"
    );
    let rows = std::mem::take(&mut target.lock().unwrap().rows);
    assert_exactly_once(job, &rows);
}

#[test]
fn a_checkpoint_of_another_job_graph_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let target = Arc::new(Mutex::new(Target::default()));
    let job = Job { failures: 0, ..BASE };
    run_with(job, dir.path(), &target, |_| {}).unwrap();
    let other = Job { extra_map: true, ..job };
    let err = run_with(other, dir.path(), &target, |_| {}).expect_err("refused");
    match err {
        Error::Restore(msg) => {
            assert!(
                msg.contains("another job graph") && msg.contains("fingerprint"),
                "{msg}"
            );
        }
        e => panic!("expected a restore error, got {e}"),
    }
}

#[test]
fn a_corrupt_checkpoint_is_never_restored_silently() {
    // Task states in task files (inline_state_max 0), then inline in the
    // manifest (the default): one flipped byte is refused either way, with
    // the file named.
    for inline in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let target = Arc::new(Mutex::new(Target::default()));
        let job = Job { failures: 0, ..BASE };
        let files_only = |c: &mut RuntimeConfig| {
            if !inline {
                c.checkpointing.as_mut().unwrap().inline_state_max = 0;
            }
        };
        run_with(job, dir.path(), &target, files_only).unwrap();
        let ids = weir_core::checkpoint::storage::list_ids(dir.path()).unwrap();
        let latest = weir_core::checkpoint::storage::checkpoint_dir(dir.path(), *ids.last().unwrap());
        let file = std::fs::read_dir(&latest)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| match inline {
                false => p.extension().is_some_and(|e| e == "state"),
                true => p.ends_with(weir_core::checkpoint::storage::MANIFEST),
            })
            .unwrap();
        let mut bytes = std::fs::read(&file).unwrap();
        // In a task file's payload, or in the last inline state.
        let last = bytes.len() - 6;
        bytes[last] ^= 0x10;
        std::fs::write(&file, bytes).unwrap();
        let err = run_with(job, dir.path(), &target, |c| {
            files_only(c);
            c.restart = RestartStrategy::None;
        })
        .expect_err("refused");
        let msg = err.to_string();
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        assert!(matches!(err, Error::Restore(_)), "{msg}");
        assert!(msg.contains(&name) && msg.contains("CRC mismatch"), "{msg}");
        if inline {
            assert!(msg.contains("inline state of task"), "{msg}");
        }
    }
}

#[test]
fn keyed_state_rescales_from_parallelism_2_to_1_and_4() {
    for q in [1, 4] {
        let dir = tempfile::tempdir().unwrap();
        let target = Arc::new(Mutex::new(Target::default()));
        // First run: 20,000 records at keyed parallelism 2, ends with its
        // final checkpoint.
        let first = Job {
            failures: 0,
            events: 20_000,
            rebalance_sink: true,
            ..BASE
        };
        run_with(first, dir.path(), &target, |_| {}).unwrap();
        // Second run: the sources continue to 40,000 from their offsets; the
        // keyed state, taken at parallelism 2, is restored at `q` by key group.
        let second = Job {
            events: 40_000,
            keyed: q,
            ..first
        };
        let result = run_with(second, dir.path(), &target, |_| {}).unwrap();
        assert!(result.metrics.checkpoints.restored_from.is_some(), "q={q}: resumed");
        let rows = std::mem::take(&mut target.lock().unwrap().rows);
        assert_exactly_once(second, &rows);
    }
}

/// Each file of checkpoint `id`'s folder: its name and inode (a file
/// written again under the same name gets a new inode: the rename).
fn folder_files(dir: &std::path::Path, id: u64) -> Vec<(String, u64)> {
    use std::os::unix::fs::MetadataExt;
    let mut files: Vec<(String, u64)> = std::fs::read_dir(storage::checkpoint_dir(dir, id))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                e.metadata().unwrap().ino(),
            )
        })
        .collect();
    files.sort();
    files
}

/// A job that restores an older checkpoint than the newest on disk
/// (`Id(1)`), or nothing (`Nothing`), while checkpoints 1 to 3 exist,
/// numbers its checkpoints after them, from 4, and writes nothing into
/// their folders: they still verify, with every file untouched. Task
/// states are in task files (`inline_state_max` 0), the case where a
/// barrier numbered like an existing checkpoint would overwrite that
/// checkpoint's files.
#[test]
fn a_restore_from_an_older_checkpoint_never_writes_into_newer_ones() {
    for from in [RestoreFrom::Nothing, RestoreFrom::Id(1)] {
        let dir = tempfile::tempdir().unwrap();
        let config = |restore: RestoreFrom| {
            move |c: &mut RuntimeConfig| {
                let ck = c.checkpointing.as_mut().unwrap();
                ck.inline_state_max = 0;
                ck.retained = 3;
                ck.restore = restore;
                // No periodic checkpoint: each bounded run takes exactly
                // one, its final checkpoint.
                ck.interval = Duration::from_secs(3600);
            }
        };
        let ids_of =
            |r: &weir_core::JobResult| -> Vec<u64> { r.metrics.checkpoints.history.iter().map(|c| c.id).collect() };
        // Three runs, each resuming the last and reading 2,000 records
        // further: checkpoints 1, 2 and 3, of three different states.
        for k in 1..=3 {
            let job = Job {
                failures: 0,
                events: 2_000 * k,
                ..BASE
            };
            let target = Arc::new(Mutex::new(Target::default()));
            let r = run_with(job, dir.path(), &target, config(RestoreFrom::Latest)).unwrap();
            assert_eq!(ids_of(&r), vec![k], "run {k}");
        }
        let before: Vec<_> = (1..=3).map(|id| folder_files(dir.path(), id)).collect();
        assert!(
            before
                .iter()
                .all(|f| f.iter().any(|(name, _)| name.ends_with(".state"))),
            "task files in every checkpoint: {before:?}"
        );

        let job = Job {
            failures: 0,
            events: 8_000,
            ..BASE
        };
        let target = Arc::new(Mutex::new(Target::default()));
        let r = run_with(job, dir.path(), &target, config(from)).unwrap();
        assert_eq!(ids_of(&r), vec![4], "{from:?}: the first new checkpoint is 4");
        for id in [2, 3] {
            let m = storage::read_manifest(dir.path(), id)
                .unwrap_or_else(|e| panic!("{from:?}: checkpoint {id}: {e}"))
                .unwrap_or_else(|| panic!("{from:?}: checkpoint {id} lost its manifest"));
            if let Err(e) = storage::verify_files(dir.path(), &m) {
                panic!("{from:?}: checkpoint {id} no longer verifies: {e}");
            }
            assert_eq!(
                folder_files(dir.path(), id),
                before[id as usize - 1],
                "{from:?}: files of checkpoint {id} were written again"
            );
        }
        // The command-line verification agrees (2, 3 and 4; 1 went by
        // retention).
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
            .args(["checkpoints", "verify"])
            .arg(dir.path())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{from:?}: weir checkpoints verify failed:\n{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(stdout.matches("  OK  ").count(), 3, "{from:?}: {stdout}");
    }
}

/// The final checkpoint behind an unaligned one, end to end
/// (docs/design/checkpoints.md#barrier-flow). A fast source ends early, so
/// its channel into the union carries an unaligned barrier `n` and then
/// the final barrier back to back, while the other input reaches the union
/// through a slow task that still holds `n`. With `max_concurrent` 2 the
/// final checkpoint is triggered while `n` is pending, so the union task
/// is often still recording `n` when the final barrier arrives. The final
/// checkpoint must still be taken aligned: no channel state, and nothing
/// overtaken that would reach the sink after its final pre-commit (lost
/// from the output).
#[test]
fn final_checkpoint_stays_aligned_behind_concurrent_unaligned_ones() {
    use weir_core::{CheckpointConfig, Pipeline};
    use weir_io::{GenContext, Generator, GeneratorConfig};

    for round in 0..10 {
        let dir = tempfile::tempdir().unwrap();
        let target: Arc<Mutex<Target<u64>>> = Arc::default();
        let t = target.clone();
        let gen = |seed, events| GeneratorConfig {
            seed,
            events: Some(events),
            rate: None,
            start_ns: None,
        };
        let (fast, slow) = (gen(1, 1_000), gen(2, 2_000));
        let p = Pipeline::new("final-aligned");
        let a = p.source("fast", 1, move |i, n| {
            Generator::new(fast, i, n, |c: GenContext| c.seq).unwrap()
        });
        let b = p
            .source("slow", 1, move |i, n| {
                Generator::new(slow, i, n, |c: GenContext| 1_000_000 + c.seq).unwrap()
            })
            .rebalance(1)
            .map(|x: u64| {
                let t0 = std::time::Instant::now();
                while t0.elapsed() < Duration::from_micros(50) {
                    std::hint::spin_loop();
                }
                x
            })
            .name("slow-map");
        a.union(vec![b]).sink("tx", move |i| TxSink::new(i, t.clone(), true));
        let config = RuntimeConfig {
            workers: 2,
            ring_capacity: 64,
            checkpointing: Some(CheckpointConfig {
                interval: Duration::from_millis(1),
                max_concurrent: 2,
                // Concurrent unaligned checkpoints subsume one another at
                // the union (declined, counted as failed): not the point here.
                tolerable_failures: 1_000_000,
                timeout: Duration::from_secs(20),
                ..CheckpointConfig::new(CheckpointMode::Unaligned, dir.path())
            }),
            ..RuntimeConfig::default()
        };
        let result = p.run(config).unwrap().join().unwrap();
        let history = &result.metrics.checkpoints.history;
        let last = history.back().expect("checkpoints completed");
        assert!(last.is_final, "round {round}: the last checkpoint is the final one");
        assert_eq!(
            last.channel_state_bytes, 0,
            "round {round}: the final checkpoint {} was taken unaligned",
            last.id
        );
        let mut rows = std::mem::take(&mut target.lock().unwrap().rows);
        rows.sort_unstable();
        let expected: Vec<u64> = (0..1_000).chain(1_000_000..1_002_000).collect();
        assert!(
            rows == expected,
            "round {round}: {} records committed, expected {} (records overtaken by the final barrier are lost)",
            rows.len(),
            expected.len()
        );
    }
}

/// `RuntimeConfig::state_backend` moves the same job's `process` state to
/// a hash map on the heap: the failures and restarts of the tests above
/// still end exactly once, and no state file is written.
#[test]
fn the_heap_state_backend_survives_failures_exactly_once() {
    for mode in [CheckpointMode::Aligned, CheckpointMode::Unaligned] {
        let job = Job { mode, ..BASE };
        let dir = tempfile::tempdir().unwrap();
        let target = Arc::new(Mutex::new(Target::default()));
        let result = run_with(job, dir.path(), &target, |c| {
            c.state_backend = StateBackend::Heap;
            c.checkpointing.as_mut().unwrap().inline_state_max = 0;
        })
        .unwrap();
        assert_eq!(result.metrics.checkpoints.restarts.len(), 3, "{mode:?}");
        let shared = std::fs::read_dir(dir.path().join("shared")).map_or(0, |d| d.count());
        assert_eq!(shared, 0, "{mode:?}: the heap backend writes no state files");
        let rows = std::mem::take(&mut target.lock().unwrap().rows);
        assert_exactly_once(job, &rows);
    }
}

/// A checkpoint's keyed state is read back only by the backend that wrote
/// it: the other one refuses it by name instead of misreading it.
#[test]
fn a_checkpoint_of_the_other_state_backend_is_refused_by_name() {
    for (first, second, named) in [
        (StateBackend::Mapped, StateBackend::Heap, "mapped state backend"),
        (StateBackend::Heap, StateBackend::Mapped, "heap state backend"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let target = Arc::new(Mutex::new(Target::default()));
        run_with(BASE, dir.path(), &target, |c| c.state_backend = first).unwrap();
        let err = run_with(BASE, dir.path(), &target, |c| {
            c.state_backend = second;
            c.restart = RestartStrategy::None;
        })
        .expect_err("a restore by the other backend fails");
        assert!(err.to_string().contains(named), "{first:?} then {second:?}: {err}");
    }
}
