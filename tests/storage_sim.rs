//! Deterministic storage-fault simulation: real jobs on a simulated disk
//! ([`weir_core::vfs::sim::SimFs`]), crashed at random operations and
//! recovered, with faults injected on the way.
//!
//! Each seed runs a keyed running count (checkpointed, state in the
//! memory-mapped backend, task states inline in the manifest or in
//! `shared/` files as the seed picks) into one sink (the WAL sink, the
//! two-phase file sink, or the direct sink at least once), with both its
//! checkpoints and its sink folders on the simulated disk. The seed picks,
//! run after run:
//!
//! - a crash point: the job's `k`-th filesystem operation and every later
//!   one fail as if the machine stopped there; the test waits for the job
//!   to end, drops it, and crashes the disk ([`SimFs::crash`]: unsynced data
//!   kept, lost or torn at 512-byte sectors, unsynced folder operations
//!   undone); then a new run recovers;
//! - injected `ENOSPC`/`EIO` on writes and syncs, and bit flips on reads:
//!   the run must end in an error or go on past declined checkpoints; it
//!   must never lose or duplicate committed output. Every flipped bit must
//!   fail the run with an error naming its file, or be reported by weir
//!   (`weir_core::corruption::report`) and not used, or lie in bytes the
//!   direct sink's open provably does not use (see `judge_flips`).
//!
//! After the seed's last run (which completes) the disk crashes once more
//! (what a finished job committed must be durable), and the committed
//! output is checked exactly: per key the running counts `1..=n` once each
//! for the exactly-once sinks; every count at least once for the direct
//! sink.
//!
//! `shard_folders_on_a_simulated_disk` puts the shard folders of a job
//! shared by several processes (`weir_io::shards`) on the simulated disk
//! the same way, but enumerates its crash points: every filesystem
//! operation of every start of a rescale 2 -> 3 -> 2 in turn.
//!
//! `WEIR_SIM_SEEDS=N` runs N seeds per sink (default below);
//! `WEIR_SIM_DEDUP=1` lets the exactly-once seeds run in dedup mode too
//! (where a subtask whose sink hits an injected error recovers alone, its
//! replacement restored on the same disk);
//! `WEIR_SIM_SEED=S` runs seed S alone; `WEIR_SIM_VERBOSE=1` prints each
//! run's crash point, faults and end; `WEIR_SIM_TRACE=1` prints every
//! filesystem operation (number, thread, call, path) and what each crash
//! undid. A failing seed is printed with the
//! command that replays it. Replaying a seed replays its crash points and
//! faults (they are functions of the seed and the operation's number);
//! the job's threads can still interleave their operations differently, so
//! a failure that depends on a thread schedule may need a few replays.

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{assert_exactly_once, assert_no_loss, keyed_counts, parse_rows, row_line, Job, Row, BASE};
use weir_core::corruption::Report;
use weir_core::vfs::sim::{Call, FaultKind, Faults, Injected, SimFs};
use weir_core::vfs::{self};
use weir_core::{CheckpointConfig, CheckpointMode, Pipeline, RestartStrategy, RuntimeConfig};
use weir_io::{DirectFileSink, WalSink, WalSinkConfig};

/// Seeds per sink in a default run: 3,600 crash points, some 20 s on a 2-core
/// machine (see `docs/design/testing.md#storage-faults-and-the-simulated-disk`).
const DEFAULT_SEEDS: u64 = 200;
/// Crash points per seed before its last, uncrashed run.
const CRASHES_PER_SEED: u32 = 6;
/// Crash points are drawn from the first this many filesystem operations
/// of a run: about what a whole run of the job does (the test prints the
/// average), so that most runs crash somewhere, and some finish.
const OPS_PER_RUN: u64 = 300;
/// A run that takes longer is a hang: the seed is printed and the process
/// aborts.
const HANG: Duration = Duration::from_secs(60);

const JOB: Job = Job {
    events: 3_000,
    keys: 12,
    failures: 0,
    rate: 400_000.0,
    sources: 1,
    keyed: 2,
    ..BASE
};

#[derive(Clone, Copy, Debug, PartialEq)]
enum SinkKind {
    Wal,
    TwoPhase,
    Direct,
}

/// A small deterministic generator for the test's own choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        weir_io::generator::splitmix64(self.0)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn no_stamp(_: &Row) -> u64 {
    0
}

/// What one seed's run settles.
struct Setup {
    sink: SinkKind,
    mode: CheckpointMode,
    inline_state_max: usize,
    root: PathBuf,
}

/// Runs the job once on the mounted disk.
fn run_job(s: &Setup) -> weir_core::Result<weir_core::JobResult> {
    let p = Pipeline::new("sim");
    let counted = keyed_counts(&p, JOB);
    let out = s.root.join("out");
    match s.sink {
        SinkKind::Wal => {
            let wal = WalSinkConfig::new(s.root.join("wal"), out);
            counted.sink("wal", move |i| WalSink::new(wal.clone(), i, row_line, no_stamp));
        }
        SinkKind::TwoPhase => {
            counted.sink("2pc", move |i| {
                weir_io::two_phase_file_sink(out.clone(), i, row_line, no_stamp)
            });
        }
        SinkKind::Direct => {
            counted.sink("direct", move |i| {
                DirectFileSink::new(out.clone(), i, row_line, no_stamp)
            });
        }
    }
    let config = RuntimeConfig {
        workers: 2,
        ring_capacity: 256,
        checkpointing: Some(CheckpointConfig {
            interval: Duration::from_millis(1),
            timeout: Duration::from_secs(20),
            tolerable_failures: 3,
            inline_state_max: s.inline_state_max,
            ..CheckpointConfig::new(s.mode, s.root.join("chk"))
        }),
        // Dedup: a subtask whose sink fails (an injected error) recovers
        // alone, once, its replacement restored on the same disk (the WAL
        // sink's from where its predecessor published); the other modes
        // stop at the first failure.
        restart: if s.mode == CheckpointMode::Dedup {
            RestartStrategy::FixedDelay {
                attempts: 2,
                delay: Duration::ZERO,
            }
        } else {
            RestartStrategy::None
        },
        ..RuntimeConfig::default()
    };
    p.run(config)?.join()
}

/// The committed rows: every line of every committed file in `out/`, and
/// how many lines were damaged.
fn committed_rows(root: &Path) -> (Vec<Row>, usize) {
    let mut all = (Vec::new(), 0);
    for f in weir_io::committed_files(&root.join("out")).unwrap() {
        let (rows, garbage) = parse_rows(&String::from_utf8_lossy(&vfs::read(&f).unwrap()));
        all.0.extend(rows);
        all.1 += garbage;
    }
    all
}

/// Counts of what the seeds did, printed at the end.
#[derive(Default, Debug)]
struct Tally {
    seeds: u64,
    runs: u64,
    crash_points: u64,
    crashes_that_lost_something: u64,
    injected_errors: u64,
    runs_failed_by_errors: u64,
    checkpoints_declined: u64,
    flips: u64,
    /// Flips the run's error names by file: (a).
    flips_failed_the_run: u64,
    /// Flips weir reported (`weir_core::corruption::report`) and went on
    /// without: (b).
    flips_reported_and_skipped: u64,
    /// Flips in bytes the direct sink reads at open and provably does not
    /// use (before its file's last `\n`): (c).
    flips_in_unused_bytes: u64,
    /// Flips in runs the crash point cut short before weir could act on
    /// them (the run's end says nothing): counted, not judged.
    flips_in_crashed_runs: u64,
    /// Reports of damaged bytes, flips or not (torn WAL tails and marker
    /// slots after crashes too).
    corruption_reports: u64,
    direct_garbage_lines: u64,
    ops_of_completed_runs: u64,
    finished_then_crashed: u64,
    /// Dedup: subtasks that failed (an injected error) and recovered alone
    /// in a run that completed.
    subtask_recoveries: u64,
}

/// The runs in progress: (sink, seed, start), one per test thread.
static RUNNING: Mutex<Vec<(SinkKind, u64, Instant)>> = Mutex::new(Vec::new());

/// Marks a run of `seed` as started (`Some`) or ended (`None`).
fn watch(sink: SinkKind, seed: Option<u64>) {
    let mut r = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
    r.retain(|(s, _, _)| *s != sink);
    if let Some(seed) = seed {
        r.push((sink, seed, Instant::now()));
    }
}

/// Aborts the process, naming the seed, if a run hangs.
fn start_watchdog() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::thread::spawn(|| loop {
            std::thread::sleep(Duration::from_secs(1));
            let r = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((sink, seed, _)) = r.iter().find(|(_, _, t)| t.elapsed() > HANG) {
                eprintln!(
                    "storage_sim: a run of {sink:?} seed {seed} hung for {HANG:?}; replay: WEIR_SIM_SEED={seed} cargo test --release --test storage_sim"
                );
                std::process::abort();
            }
        });
    });
}

/// A fault profile: none, or some of the kinds at modest rates.
fn faults(rng: &mut Rng) -> Faults {
    let mut pick = |one_in: u64| {
        if rng.below(2) == 0 {
            0
        } else {
            (one_in + rng.below(one_in)) as u32
        }
    };
    Faults {
        write_enospc: pick(200),
        write_eio: pick(400),
        sync_enospc: pick(200),
        sync_eio: pick(200),
        read_flip: pick(60),
    }
}

/// One seed: crash after crash, then a clean run, then the checks.
fn one_seed(sink: SinkKind, seed: u64, tally: &Mutex<Tally>) {
    let mut rng = Rng(seed ^ 0xfa17);
    // `WEIR_SIM_DEDUP=1` lets exactly-once seeds pick the dedup mode too
    // (a third of them). Not on by default yet: in its first run of 1,200
    // seeds per sink, one WAL seed in dedup mode (162) ended in an error
    // with no fault injected and no crash, its message lost; not
    // reproduced in some 30,000 exactly-once seeds since, nor by replaying
    // 162 alone (docs/notebook/dedup-2026-12.md). With subtask recoveries
    // on (2026-12-08) it found a stall (the final checkpoint given up) and
    // an unreported flipped manifest byte, both fixed; 2,400 seeds of the
    // WAL and two-phase sinks passed after.
    let modes = if std::env::var("WEIR_SIM_DEDUP").is_ok_and(|v| v == "1") {
        3
    } else {
        2
    };
    let mode = match (sink, rng.below(modes)) {
        (SinkKind::Direct, _) => CheckpointMode::AtLeastOnce,
        (_, 0) => CheckpointMode::Aligned,
        (_, 1) => CheckpointMode::Unaligned,
        _ => CheckpointMode::Dedup,
    };
    let inline_state_max = if rng.below(2) == 0 {
        weir_core::checkpoint::DEFAULT_INLINE_STATE_MAX
    } else {
        0
    };
    let root = PathBuf::from(format!("/weir-sim/{sink:?}/{seed}"));
    let fs = SimFs::new(&root, seed, Faults::default());
    vfs::mount(&root, Arc::new(fs.clone()));
    let setup = Setup {
        sink,
        mode,
        inline_state_max,
        root: root.clone(),
    };
    let mut t = Tally {
        seeds: 1,
        ..Tally::default()
    };
    let mut crashes = 0;
    let mut fault_runs = 0;
    let mut runs = 0;
    loop {
        runs += 1;
        assert!(runs < 40, "no completed run after {runs} attempts");
        let crash = crashes < CRASHES_PER_SEED;
        let faulty = fault_runs < 3 && rng.below(2) == 0;
        // Where each direct-sink file's whole lines end before the run
        // (read with faults off): the sink's open decides on the bytes
        // from there on only.
        let line_ends = if sink == SinkKind::Direct {
            last_line_ends(&root)
        } else {
            Vec::new()
        };
        fs.set_faults(if faulty { faults(&mut rng) } else { Faults::default() });
        fault_runs += u32::from(faulty);
        let at = crash.then(|| 1 + rng.below(OPS_PER_RUN));
        fs.crash_after(at);
        let before = fs.ops();
        watch(sink, Some(seed));
        let result = run_job(&setup);
        // Each run stands for a `weir run` process: when it ends, so do
        // its threads (a failed job's snapshot threads may still be
        // winding down here; in a process that exited they are gone).
        fs.end_process();
        watch(sink, None);
        t.runs += 1;
        let injected: Vec<Injected> = fs.take_injected();
        let errors = injected.iter().filter(|i| i.kind != FaultKind::BitFlip).count();
        let flips: Vec<&Injected> = injected.iter().filter(|i| i.kind == FaultKind::BitFlip).collect();
        let detected: Vec<Report> = fs.take_detected();
        t.injected_errors += errors as u64;
        t.flips += flips.len() as u64;
        t.corruption_reports += detected.len() as u64;
        for d in &detected {
            assert!(
                d.what.contains(&*d.file.to_string_lossy()),
                "a report of damaged bytes must name the file: {d:?}"
            );
        }
        fs.crash_after(None);
        fs.set_faults(Faults::default());
        if verbose() {
            eprintln!(
                "seed {seed} run {runs}: crash point {at:?}, {} ops, down {}, injected {injected:?}, damage reported {detected:?}, result {:?}",
                fs.ops() - before,
                fs.is_down(),
                result
                    .as_ref()
                    .map(|r| (r.metrics.checkpoints.completed, r.metrics.checkpoints.failed))
                    .map_err(|e| e.to_string())
            );
        }
        judge_flips(
            &flips,
            &detected,
            &result,
            fs.is_down(),
            &line_ends,
            &root.join("chk"),
            &mut t,
        );
        if fs.is_down() {
            // The machine stopped: the job's end says nothing.
            t.crash_points += 1;
            if fs.crash() > 0 {
                t.crashes_that_lost_something += 1;
            }
            crashes += 1;
            continue;
        }
        match result {
            Ok(r) => {
                t.ops_of_completed_runs += fs.ops() - before;
                t.checkpoints_declined += r.metrics.checkpoints.failed;
                t.subtask_recoveries += r.metrics.checkpoints.restarts.len() as u64;
                if errors > 0 && r.metrics.checkpoints.failed == 0 && r.metrics.checkpoints.restarts.is_empty() {
                    // An error the job went on from must have declined a
                    // checkpoint or failed a subtask that recovered alone
                    // (dedup), unless it hit cleanup (deleting old
                    // checkpoints, which a later run redoes).
                    let unexplained: Vec<_> = injected
                        .iter()
                        .filter(|i| i.kind != FaultKind::BitFlip)
                        .filter(|i| !is_cleanup(i, &root))
                        .collect();
                    assert!(
                        unexplained.is_empty(),
                        "the job finished without a failed checkpoint or an error after injected faults: {unexplained:?}"
                    );
                }
                if crash {
                    // It finished before its crash point: the machine
                    // crashes right after (what it committed must hold),
                    // and the next run starts from what is left.
                    t.crash_points += 1;
                    t.finished_then_crashed += 1;
                    if fs.crash() > 0 {
                        t.crashes_that_lost_something += 1;
                    }
                    crashes += 1;
                    continue;
                }
                break;
            }
            Err(e) => {
                let msg = e.to_string();
                assert!(
                    errors > 0 || !flips.is_empty(),
                    "run {runs} failed with no fault injected and no crash: {msg}"
                );
                t.runs_failed_by_errors += 1;
                if errors > 0 {
                    assert!(
                        msg.contains("No space left") || msg.contains("Input/output error") || !flips.is_empty(),
                        "an injected I/O error must surface as one, with its cause: {msg}"
                    );
                }
            }
        }
    }
    // What a finished job committed survives a crash right after it.
    if verbose() {
        eprintln!("seed {seed} before the last crash: {:?}", committed_rows(&root).0.len());
    }
    fs.crash();
    if verbose() {
        for d in ["out", "chk", "wal", "wal/subtask-000"] {
            eprintln!("seed {seed} {d}: {:?}", vfs::read_dir(root.join(d)));
        }
    }
    let (rows, garbage) = committed_rows(&root);
    match sink {
        SinkKind::Direct => {
            t.direct_garbage_lines += garbage as u64;
            assert_no_loss(JOB, &rows);
        }
        _ => {
            assert_eq!(garbage, 0, "committed output holds damaged lines");
            assert_exactly_once(JOB, &rows);
        }
    }
    vfs::unmount(&root);
    let mut all = tally.lock().unwrap();
    all.seeds += t.seeds;
    all.runs += t.runs;
    all.crash_points += t.crash_points;
    all.crashes_that_lost_something += t.crashes_that_lost_something;
    all.injected_errors += t.injected_errors;
    all.runs_failed_by_errors += t.runs_failed_by_errors;
    all.checkpoints_declined += t.checkpoints_declined;
    all.flips += t.flips;
    all.flips_failed_the_run += t.flips_failed_the_run;
    all.flips_reported_and_skipped += t.flips_reported_and_skipped;
    all.flips_in_unused_bytes += t.flips_in_unused_bytes;
    all.flips_in_crashed_runs += t.flips_in_crashed_runs;
    all.corruption_reports += t.corruption_reports;
    all.direct_garbage_lines += t.direct_garbage_lines;
    all.ops_of_completed_runs += t.ops_of_completed_runs;
    all.finished_then_crashed += t.finished_then_crashed;
    all.subtask_recoveries += t.subtask_recoveries;
}

/// Every flipped bit of a run is one of: (a) the run failed with an error
/// naming the flipped file (or an attempt did, and the job restarted); (b) weir reported damaged bytes in that file,
/// at or before the flipped byte, and went on without them
/// (`weir_core::corruption::report`, through `SimFs::take_detected`);
/// (c) a byte the direct sink's open read and provably did not use (before
/// the last `\n` of its file, which the open decides on). A flip in a run
/// the crash point stopped is counted apart: that run's end says nothing
/// (its error may be the crash's). Anything else is a flipped byte read and
/// neither refused nor reported: the test fails, naming it.
fn judge_flips(
    flips: &[&Injected],
    detected: &[Report],
    result: &weir_core::Result<weir_core::JobResult>,
    crashed: bool,
    line_ends: &[(PathBuf, u64)],
    chk: &Path,
    t: &mut Tally,
) {
    let msg = result.as_ref().err().map(|e| e.to_string());
    // Errors an attempt failed with before the job restarted and went on
    // (dedup: a subtask whose replacement could not be restored): they
    // refused the bytes as the run's own error would have.
    let restarts: Vec<String> = result
        .as_ref()
        .map(|r| r.metrics.checkpoints.restarts.iter().map(|x| x.error.clone()).collect())
        .unwrap_or_default();
    // The file as an error names it: its whole path, or (a state file's
    // `Error::Corrupt`) its path in the checkpoint folder.
    let named = |f: &Injected, m: &str| {
        m.contains(&*f.path.to_string_lossy())
            || f.path
                .strip_prefix(chk)
                .is_ok_and(|rel| m.contains(&*rel.to_string_lossy()))
    };
    for f in flips {
        let at = f.offset.expect("a flip has its byte");
        if msg.as_ref().is_some_and(|m| named(f, m)) || restarts.iter().any(|m| named(f, m)) {
            t.flips_failed_the_run += 1;
        } else if detected.iter().any(|d| d.file == f.path && d.offset <= at) {
            t.flips_reported_and_skipped += 1;
        } else if line_ends.iter().any(|(p, end)| *p == f.path && at + 1 < *end) {
            t.flips_in_unused_bytes += 1;
        } else if crashed {
            t.flips_in_crashed_runs += 1;
        } else {
            panic!(
                "a flipped bit was read and neither failed the run nor was reported: {f:?}; run result {:?}; reports {detected:?}",
                msg
            );
        }
    }
}

/// Each direct-sink output file and the length of its whole lines (up to
/// and including its last `\n`), read with faults off.
fn last_line_ends(root: &Path) -> Vec<(PathBuf, u64)> {
    let out = root.join("out");
    let Ok(names) = vfs::read_dir(&out) else {
        return Vec::new();
    };
    names
        .into_iter()
        .filter_map(|n| {
            let p = out.join(n);
            let bytes = vfs::read(&p).ok()?;
            let end = memchr_last_newline(&bytes);
            Some((p, end))
        })
        .collect()
}

fn memchr_last_newline(bytes: &[u8]) -> u64 {
    bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i as u64 + 1)
}

/// Deleting what is no longer needed: an error there leaves garbage that
/// the next start removes, never a gap.
fn is_cleanup(i: &Injected, root: &Path) -> bool {
    let p = i.path.to_string_lossy();
    // Folder syncs of the checkpoint root after removals.
    if p.ends_with("/chk") || p.ends_with("/chk/shared") {
        return true;
    }
    let chk = root.join("chk");
    // Preparing a checkpoint's folder ahead of its trigger: its empty
    // MANIFEST and the fsync of its folder (`storage::prepare_checkpoint`).
    // If either fails, the manifest is written by rename as any other
    // file, and its folder and `chk/` are synced after it
    // (`Manifest::commit`, `prepared` false), whose failure declines the
    // checkpoint. The folder's fsync is then made again, as `chk/`'s always
    // was after a failed sync at the trigger: a folder's entries live in
    // the file system's journal, not in pages a failed writeback can drop,
    // and the sim keeps unsynced folder operations until a sync succeeds.
    let in_chk_folder = i.path.parent() == Some(&*chk)
        && i.path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("chk-"));
    if i.call == Call::SyncDir && in_chk_folder {
        return true;
    }
    if i.call == Call::CreateFile
        && i.path
            .file_name()
            .is_some_and(|n| n == weir_core::checkpoint::storage::MANIFEST)
    {
        return true;
    }
    // Creating a checkpoint's folder at the trigger, ahead of its files:
    // if that fails, the checkpoint goes on and the first file written
    // for it creates the folder and syncs `chk/` (`storage::write_durable`,
    // whose failure declines the checkpoint), and the manifest's commit
    // syncs `chk/` again (`Manifest::commit`, `prepared` false). A
    // failed `mkdir` changed nothing on disk, so making it again is no
    // retry of a step whose outcome is unknown (as a retried fsync would
    // be). Whether the folder the checkpoint then completes in is durable
    // is checked by the crashes and the exactly-once check, not here.
    if i.call == Call::CreateDir && i.path.parent() == Some(&*chk) {
        return true;
    }
    // In a checkpoint's folder: harmless only if that checkpoint cannot be
    // restored (retention deleted it, or it never completed). An error
    // ignored while writing a checkpoint that is now restorable is not.
    match i.path.strip_prefix(&chk).ok().and_then(|r| r.components().next()) {
        Some(std::path::Component::Normal(name)) if name.to_string_lossy().starts_with("chk-") => {
            let id = name.to_string_lossy().strip_prefix("chk-").and_then(|n| n.parse().ok());
            id.is_none_or(|id| !weir_core::checkpoint::storage::is_complete(&chk, id))
        }
        _ => false,
    }
}

/// `WEIR_SIM_VERBOSE=1`: every run's crash point, faults and end.
fn verbose() -> bool {
    std::env::var("WEIR_SIM_VERBOSE").is_ok_and(|v| v == "1")
}

fn seeds() -> Vec<u64> {
    if let Ok(s) = std::env::var("WEIR_SIM_SEED") {
        return vec![s.parse().expect("WEIR_SIM_SEED is a number")];
    }
    let n = std::env::var("WEIR_SIM_SEEDS")
        .ok()
        .map(|s| s.parse().expect("WEIR_SIM_SEEDS is a number"))
        .unwrap_or(DEFAULT_SEEDS);
    (1..=n).collect()
}

fn simulate(sink: SinkKind) {
    start_watchdog();
    let tally = Mutex::new(Tally::default());
    let started = Instant::now();
    for seed in seeds() {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| one_seed(sink, seed, &tally)));
        if let Err(panic) = r {
            eprintln!(
                "storage_sim: {sink:?} failed at seed {seed}; replay: WEIR_SIM_SEED={seed} cargo test --release --test storage_sim {}",
                match sink {
                    SinkKind::Wal => "wal",
                    SinkKind::TwoPhase => "two_phase",
                    SinkKind::Direct => "direct",
                }
            );
            std::panic::resume_unwind(panic);
        }
    }
    let t = tally.into_inner().unwrap();
    println!("storage_sim {sink:?}: {t:?} in {:.1?}", started.elapsed());
    assert!(t.crash_points >= t.seeds, "crash points were reached: {t:?}");
}

#[test]
fn wal_sink_on_a_simulated_disk() {
    simulate(SinkKind::Wal);
}

#[test]
fn two_phase_file_sink_on_a_simulated_disk() {
    simulate(SinkKind::TwoPhase);
}

#[test]
fn direct_sink_on_a_simulated_disk() {
    simulate(SinkKind::Direct);
}

// ---------------------------------------------------------------- shard folders

/// One start of a process of a job shared by several processes
/// (`weir run --instances N --instance I --rescale-from ...`): its folder,
/// the folders it may adopt shards from, N and I.
struct Start {
    folder: usize,
    from: &'static [usize],
    n: usize,
    i: usize,
}

/// Two processes, then three from the two old folders, then two again
/// from all three (where p0 holds a stale copy of shard 2 and p1 of
/// shard 5, generation 0, beside the live ones in p2).
const STARTS: &[Start] = &[
    Start {
        folder: 0,
        from: &[],
        n: 2,
        i: 0,
    },
    Start {
        folder: 1,
        from: &[],
        n: 2,
        i: 1,
    },
    Start {
        folder: 0,
        from: &[0, 1],
        n: 3,
        i: 0,
    },
    Start {
        folder: 1,
        from: &[0, 1],
        n: 3,
        i: 1,
    },
    Start {
        folder: 2,
        from: &[0, 1],
        n: 3,
        i: 2,
    },
    Start {
        folder: 0,
        from: &[0, 1, 2],
        n: 2,
        i: 0,
    },
    Start {
        folder: 1,
        from: &[0, 1, 2],
        n: 2,
        i: 1,
    },
];

/// Shards of the job (the partitions of its input topic at its first start).
const SHARDS: usize = 6;

/// What each shard's live copy holds: its state file's text and its
/// generation, after the starts so far (each start's shard jobs ran and
/// wrote their state).
#[derive(Clone, Default)]
struct Live(Vec<Option<(String, u64)>>);

fn shard_shape() -> weir_io::shards::JobShape {
    weir_io::shards::JobShape {
        shards: 0,
        parallelism: 1,
        inputs: "kafka:sim/in".into(),
        output: "kafka:sim/out".into(),
    }
}

fn process_folder(root: &Path, p: usize) -> PathBuf {
    root.join(format!("p{p}"))
}

/// Writes a shard job's state (a file longer than a sector, so that a
/// torn copy would show), durably.
fn put_state(shard: &Path, text: &str) {
    use std::io::Write;
    let path = shard.join("state");
    let mut f = vfs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f.sync_data().unwrap();
    drop(f);
    vfs::sync_dir(shard).unwrap();
}

fn state_text(s: usize, start: usize) -> String {
    format!("shard {s} after start {start}\n{}", ".".repeat(1500))
}

/// Start `k`'s settling of its shard folders (`weir_io::shards::prepare`).
fn settle(root: &Path, k: usize) -> weir_io::Result<weir_io::shards::Plan> {
    let st = &STARTS[k];
    let folder = process_folder(root, st.folder);
    let from: Vec<PathBuf> = st.from.iter().map(|&p| process_folder(root, p)).collect();
    weir_io::shards::prepare(&folder, &from, st.n, st.i, shard_shape(), || {
        Ok::<_, weir_io::Error>(SHARDS)
    })
}

/// Start `k`: settles, checks what it settled against `live`, and runs
/// its shards' jobs (each writes a new state); `live` follows.
fn start(root: &Path, k: usize, live: &mut Live) -> weir_io::Result<()> {
    let plan = settle(root, k)?;
    run_shards(root, k, &plan, live);
    Ok(())
}

/// What start `k` does once settled: the checks, then its shards' jobs.
fn run_shards(root: &Path, k: usize, plan: &weir_io::shards::Plan, live: &mut Live) {
    check_plan(root, k, plan, live);
    for (s, dir) in &plan.owned {
        let text = state_text(*s, k);
        put_state(dir, &text);
        let generation = live.0[*s].as_ref().map_or(0, |l| l.1);
        live.0[*s] = Some((text, generation));
    }
}

/// The plan of start `k` owns the shards `s mod N == I`, each folder the
/// live copy: its state whole and its generation one more than the copy
/// it was adopted from.
fn check_plan(root: &Path, k: usize, plan: &weir_io::shards::Plan, live: &mut Live) {
    let st = &STARTS[k];
    let folder = process_folder(root, st.folder);
    let owned: Vec<usize> = plan.owned.iter().map(|o| o.0).collect();
    let expected: Vec<usize> = (0..SHARDS).filter(|s| s % st.n == st.i).collect();
    assert_eq!(owned, expected, "start {k}");
    for (s, dir) in &plan.owned {
        assert_eq!(*dir, weir_io::shards::shard_dir(&folder, *s));
        let generation = weir_io::shards::read_generation(dir).unwrap();
        match &live.0[*s] {
            None => assert_eq!(generation, 0, "start {k}: new shard {s}"),
            Some((text, g)) => {
                let adopted = plan.adopted.iter().any(|a| a.0 == *s);
                let here = String::from_utf8(vfs::read(dir.join("state")).unwrap()).unwrap();
                assert_eq!(&here, text, "start {k}: shard {s} holds the live state");
                // Adopted by this start, or by an earlier one of this
                // folder that a crash cut short (then not in `adopted`).
                assert!(
                    generation == *g || generation == g + 1,
                    "start {k}: shard {s} at generation {generation}, live {g}"
                );
                assert!(!adopted || generation == g + 1, "start {k}: shard {s}");
                live.0[*s] = Some((text.clone(), generation));
            }
        }
    }
    // No adoption is left half done.
    let names = vfs::read_dir(&folder).unwrap();
    assert!(!names.iter().any(|n| n.ends_with(".incoming")), "start {k}: {names:?}");
}

/// A shard's copy in a process folder: `((folder, shard), (state,
/// generation))`, `None` where the folder has none.
type ShardCopy = ((usize, usize), Option<(Vec<u8>, u64)>);

/// The shard copies of every process folder but `except`.
fn copies(root: &Path, except: usize) -> Vec<ShardCopy> {
    let mut all = Vec::new();
    for p in (0..3).filter(|&p| p != except) {
        for s in 0..SHARDS {
            let dir = weir_io::shards::shard_dir(&process_folder(root, p), s);
            let copy = vfs::is_dir(&dir).then(|| {
                (
                    vfs::read(dir.join("state")).unwrap_or_default(),
                    weir_io::shards::read_generation(&dir).unwrap(),
                )
            });
            all.push(((p, s), copy));
        }
    }
    all
}

/// A disk with the starts before `k` done, mounted at a root of its own.
fn disk_before(k: usize, name: &str, seed: u64) -> (PathBuf, SimFs, Live) {
    let root = PathBuf::from(format!("/weir-sim/shards/{name}"));
    let fs = SimFs::new(&root, seed, Faults::default());
    vfs::mount(&root, Arc::new(fs.clone()));
    let mut live = Live(vec![None; SHARDS]);
    for j in 0..k {
        start(&root, j, &mut live).unwrap_or_else(|e| panic!("start {j} before {k}: {e}"));
    }
    (root, fs, live)
}

/// The shard folders of a job shared by several processes
/// (`weir_io::shards`, behind `weir run --instances`) on the simulated
/// disk: the starts of a rescale from two processes to three and back to
/// two, each start crashed at every one of its filesystem operations in
/// turn (the crash point's number seeding what the crash keeps, loses or
/// tears of what was not synced), then started again. The start after a
/// crash must succeed and find each shard it owns whole, at the live
/// copy's state; a crash must never change another process's folder (an
/// adoption only reads it). Then each start again with `ENOSPC` and `EIO`
/// injected: it fails or succeeds, and the start after it (faults off)
/// settles the same.
#[test]
fn shard_folders_on_a_simulated_disk() {
    let mut crash_points = 0;
    let mut fault_failures = 0;
    for (k, st) in STARTS.iter().enumerate() {
        // The settling's operations, counted on a disk of its own.
        let steps = {
            let (root, fs, mut live) = disk_before(k, &format!("count-{k}"), 0);
            let before = fs.ops();
            let plan = settle(&root, k).unwrap();
            let n = fs.ops() - before;
            run_shards(&root, k, &plan, &mut live);
            vfs::unmount(&root);
            n
        };
        for at in 1..=steps {
            let (root, fs, mut live) = disk_before(k, &format!("crash-{k}-{at}"), at);
            let before = copies(&root, st.folder);
            fs.crash_after(Some(at));
            let crashed = settle(&root, k);
            assert!(crashed.is_err(), "start {k}, crash point {at} of {steps}: not reached");
            fs.crash();
            crash_points += 1;
            assert!(
                copies(&root, st.folder) == before,
                "start {k}, crash point {at}: another process's folder changed"
            );
            start(&root, k, &mut live)
                .unwrap_or_else(|e| panic!("start {k}, crash point {at} of {steps}: the next start failed: {e}"));
            vfs::unmount(&root);
        }
        for seed in 0..16 {
            let (root, fs, mut live) = disk_before(k, &format!("faults-{k}-{seed}"), seed);
            fs.set_faults(Faults {
                write_enospc: 9,
                write_eio: 13,
                sync_enospc: 11,
                sync_eio: 7,
                read_flip: 0,
            });
            let first = settle(&root, k);
            fs.set_faults(Faults::default());
            match first {
                Ok(plan) => run_shards(&root, k, &plan, &mut live),
                Err(e) => {
                    fault_failures += 1;
                    start(&root, k, &mut live)
                        .unwrap_or_else(|e2| panic!("start {k}, seed {seed}: after {e}, the next start failed: {e2}"))
                }
            }
            // And the start after that finds it settled.
            start(&root, k, &mut live).unwrap();
            vfs::unmount(&root);
        }
    }
    println!(
        "shard folders: {crash_points} crash points over {} starts; {fault_failures} starts failed on injected faults",
        STARTS.len()
    );
    assert!(
        crash_points > 100 && fault_failures > 0,
        "{crash_points} {fault_failures}"
    );
}
