//! Exactly-once by deduplication (`CheckpointMode::Dedup`): a failed keyed
//! subtask recovers alone while the rest of the job runs on; a whole-job
//! restart drops exactly the records each task took past its barrier; a
//! record that always fails stops the job, named; behind a second
//! exchange the tasks align their barriers and the output stays exact.
//!
//! The sink is the transactional test sink of `common` (output of epoch
//! `n` visible when checkpoint `n` completes), so the committed rows show
//! whether every record counted exactly once.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{assert_exactly_once, assert_no_loss, generator, run, running_count, Job, Row, Target, TxSink, BASE};
use weir_core::{CheckpointConfig, CheckpointMode, Pipeline, RestartStrategy, RuntimeConfig};
use weir_io::{GenContext, Generator};

/// How the keyed function of [`keyed_job`] fails.
#[derive(Clone, Copy)]
enum Fault {
    /// Panics once, on the record with this sequence number.
    Once(u64),
    /// Panics every time it sees the record with this sequence number.
    Always(u64),
}

/// What [`keyed_job`] built and ran.
struct Ran {
    result: weir_core::Result<weir_core::JobResult>,
    rows: Vec<Row>,
    /// Times each sink subtask was built (a rebuilt subtask: twice).
    sinks_built: Vec<u32>,
    /// Times each source subtask was built.
    sources_built: Vec<u32>,
}

/// The keyed running count of `job` (2 sources, 2 keyed subtasks), whose
/// keyed function fails as `fault` says, in dedup mode.
fn keyed_job(job: Job, fault: Fault, dir: &std::path::Path) -> Ran {
    keyed_job_with(job, fault, Duration::ZERO, usize::MAX, dir)
}

/// [`keyed_job`] whose failed subtask stays down for `down` before it is
/// rebuilt (the restart strategy's delay), each task keeping at most
/// `backup` bytes (`usize::MAX`: the default).
fn keyed_job_with(job: Job, fault: Fault, down: Duration, backup: usize, dir: &std::path::Path) -> Ran {
    let target = Arc::new(Mutex::new(Target::default()));
    let sinks_built: Arc<Vec<AtomicU32>> = Arc::new((0..job.keyed).map(|_| AtomicU32::new(0)).collect());
    let sources_built: Arc<Vec<AtomicU32>> = Arc::new((0..job.sources).map(|_| AtomicU32::new(0)).collect());
    let failed = Arc::new(AtomicU64::new(0));
    let keys = job.keys;
    let cfg = generator(job);
    let p = Pipeline::new("dedup-test");
    let built = sources_built.clone();
    let f = failed.clone();
    let (t, s) = (target.clone(), sinks_built.clone());
    p.source("fast", job.sources, move |i, n| {
        built[i].fetch_add(1, Ordering::Relaxed);
        Generator::new(cfg, i, n, move |c: GenContext| (c.random % keys, c.seq)).unwrap()
    })
    .key_by(|r: &(u64, u64)| r.0)
    .parallelism(job.keyed)
    .process(move |k: &u64, st: &mut [u64; 2], (_, v): (u64, u64), out| {
        match fault {
            Fault::Once(at) if v == at && f.fetch_add(1, Ordering::Relaxed) == 0 => {
                panic!("injected failure at record {v}")
            }
            Fault::Always(at) if v == at => {
                f.fetch_add(1, Ordering::Relaxed);
                panic!("poison record {v}")
            }
            _ => {}
        }
        st[0] += 1;
        st[1] = st[1].wrapping_add(v);
        out.emit((*k, st[0], st[1]));
    })
    .name("count")
    .sink("tx", move |i| {
        s[i].fetch_add(1, Ordering::Relaxed);
        TxSink::new(i, t.clone(), true)
    });
    let config = RuntimeConfig {
        workers: 2,
        ring_capacity: job.ring,
        checkpointing: Some(CheckpointConfig {
            // A small backup: checkpoints far apart, so that it has surely
            // outgrown its limit when the failure comes.
            interval: Duration::from_millis(if backup < 1 << 20 { 200 } else { 5 }),
            timeout: Duration::from_secs(20),
            dedup_backup_limit: backup.min(weir_core::checkpoint::DEFAULT_DEDUP_BACKUP_LIMIT),
            ..CheckpointConfig::new(CheckpointMode::Dedup, dir)
        }),
        restart: RestartStrategy::FixedDelay {
            attempts: 3,
            delay: down,
        },
        ..RuntimeConfig::default()
    };
    let result = p.run(config).and_then(|h| h.join());
    let rows = std::mem::take(&mut target.lock().unwrap().rows);
    let counts = |v: &[AtomicU32]| v.iter().map(|a| a.load(Ordering::Relaxed)).collect();
    Ran {
        result,
        rows,
        sinks_built: counts(&sinks_built),
        sources_built: counts(&sources_built),
    }
}

const JOB: Job = Job {
    mode: CheckpointMode::Dedup,
    events: 60_000,
    failures: 0,
    ..BASE
};

/// One keyed subtask panics on one record: it alone is built again and
/// restored, fed its backup, and the output stays exactly-once; the
/// sources and the other keyed subtask are never rebuilt, and the job's
/// restart history holds exactly that one subtask restart.
#[test]
fn one_failed_subtask_recovers_alone_and_the_output_stays_exact() {
    let dir = tempfile::tempdir().unwrap();
    let ran = keyed_job(JOB, Fault::Once(31_000), dir.path());
    let result = ran.result.expect("the job recovers and finishes");
    assert_exactly_once(JOB, &ran.rows);
    let restarts = &result.metrics.checkpoints.restarts;
    assert_eq!(restarts.len(), 1, "{restarts:?}");
    let (operator, subtask) = restarts[0].subtask.clone().expect("a subtask restart, not the job's");
    assert_eq!(operator, "count -> tx");
    assert!(
        restarts[0].error.contains("injected failure at record 31000"),
        "{}",
        restarts[0].error
    );
    let mut expected_builds = vec![1; JOB.keyed];
    expected_builds[subtask] = 2;
    assert_eq!(
        ran.sinks_built, expected_builds,
        "only the failed subtask is built again"
    );
    assert_eq!(ran.sources_built, vec![1; JOB.sources], "no source restarts");
}

/// A failed subtask that stays down for 300 ms (the restart delay): its
/// rings fill and its producers wait (backpressure), the records stay in
/// the rings, and the output is exact once it is back.
#[test]
fn a_subtask_that_stays_down_backpressures_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ran = keyed_job_with(
        JOB,
        Fault::Once(21_000),
        Duration::from_millis(300),
        usize::MAX,
        dir.path(),
    );
    let result = ran.result.expect("the job recovers and finishes");
    assert_exactly_once(JOB, &ran.rows);
    assert_eq!(result.metrics.checkpoints.restarts.len(), 1);
    assert!(
        result.elapsed >= Duration::from_millis(300),
        "the job waited for the subtask: {:?}",
        result.elapsed
    );
}

/// A backup that outgrew its limit (4 KiB, a few hundred records, with
/// checkpoints 200 ms apart: the failure comes before the first) cannot
/// recover its subtask alone: the whole job restarts instead, and the
/// output stays exact.
#[test]
fn past_the_backup_s_limit_a_failure_restarts_the_whole_job_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let ran = keyed_job_with(JOB, Fault::Once(33_000), Duration::ZERO, 4096, dir.path());
    let result = ran.result.expect("the job restarts and finishes");
    assert_exactly_once(JOB, &ran.rows);
    let restarts = &result.metrics.checkpoints.restarts;
    let whole = restarts.iter().filter(|r| r.subtask.is_none()).count();
    assert_eq!(whole, 1, "{restarts:?}");
    assert!(
        restarts
            .iter()
            .any(|r| r.error.contains("dedup_backup_limit") && r.error.contains("cannot be replayed from checkpoint")),
        "the restart says why: {restarts:?}"
    );
    assert_eq!(ran.sources_built, vec![2; JOB.sources], "the whole job was built again");
    // The job thread saw the backup could not serve before it built and
    // restored a replacement for nothing: each sink was built twice.
    assert_eq!(ran.sinks_built, vec![2; JOB.keyed], "no replacement before the restart");
}

/// A record that fails every time: the subtask recovers until the restart
/// strategy's attempts are spent, then the job stops with an error naming
/// the operator, the subtask and the record (its input channel and
/// position); what was committed before stays exactly-once.
#[test]
fn a_poison_record_stops_the_job_naming_operator_subtask_and_record() {
    let dir = tempfile::tempdir().unwrap();
    let ran = keyed_job(JOB, Fault::Always(20_000), dir.path());
    let e = ran.result.expect_err("a poison record stops the job").to_string();
    for part in [
        "count -> tx",
        "subtask",
        "poison record 20000",
        "input channel",
        "position",
        "4 times",
    ] {
        assert!(e.contains(part), "{part:?} missing from: {e}");
    }
    // Committed output: per key, counts 1..m once each (a prefix).
    let mut by_key: HashMap<u64, Vec<u64>> = HashMap::new();
    for &(k, c, _) in &ran.rows {
        by_key.entry(k).or_default().push(c);
    }
    assert!(!by_key.is_empty(), "output was committed before the poison record");
    for (k, mut counts) in by_key {
        counts.sort();
        assert_eq!(counts, (1..=counts.len() as u64).collect::<Vec<_>>(), "key {k}");
    }
}

/// Whole-job restarts (failures in the source chain, which cannot recover
/// alone) with a slow keyed operator, so that its rings queue and the
/// keyed tasks take records past their barriers before snapshotting: dedup drops exactly those on replay and
/// the output is exact, where at-least-once, on the same job, duplicates
/// them (so this test can fail).
#[test]
fn whole_job_restarts_drop_exactly_the_records_taken_past_the_barrier() {
    let mut at_least_once_duplicates = 0;
    for seed_events in [40_000, 52_000, 64_000] {
        let job = Job {
            mode: CheckpointMode::Dedup,
            slow_us: 2,
            failures: 3,
            events: seed_events,
            ..BASE
        };
        let dir = tempfile::tempdir().unwrap();
        let out = run(job, dir.path());
        assert_eq!(out.restarts, 3, "{:?}", out.restart_errors);
        assert_exactly_once(job, &out.rows);
        let alo = Job {
            mode: CheckpointMode::AtLeastOnce,
            ..job
        };
        let dir = tempfile::tempdir().unwrap();
        let out = run(alo, dir.path());
        at_least_once_duplicates += assert_no_loss(alo, &out.rows);
    }
    assert!(
        at_least_once_duplicates > 0,
        "the jobs took no record past a barrier: nothing was tested"
    );
}

/// A second exchange: the count reads rings written by a keyed stage that
/// reads rings itself, which after a restore interleaves its inputs anew
/// and cannot replay the same records in the same order. Dedup aligns the
/// count's barriers (its state holds nothing past a barrier, a replay has
/// nothing to drop by position) and the output stays exact through
/// whole-job restarts. Dropping by position there instead (the count
/// unaligned, as behind the first exchange) lost or doubled counts in this
/// test.
#[test]
fn a_second_exchange_under_dedup_aligns_and_stays_exact() {
    for events in [40_000, 56_000] {
        let job = Job {
            mode: CheckpointMode::Dedup,
            second_stage: true,
            slow_us: 2,
            failures: 3,
            events,
            ..BASE
        };
        let dir = tempfile::tempdir().unwrap();
        let out = run(job, dir.path());
        assert_eq!(out.restarts, 3, "{:?}", out.restart_errors);
        assert_exactly_once(job, &out.rows);
    }
}

/// Dedup mode with deterministic operators (producers recover alone), 5 ms
/// checkpoints, two workers, three restarts without delay.
fn dedup_config(ring: usize, dir: &std::path::Path) -> RuntimeConfig {
    RuntimeConfig {
        workers: 2,
        ring_capacity: ring,
        checkpointing: Some(CheckpointConfig {
            interval: Duration::from_millis(5),
            timeout: Duration::from_secs(20),
            dedup_deterministic: true,
            ..CheckpointConfig::new(CheckpointMode::Dedup, dir)
        }),
        restart: RestartStrategy::FixedDelay {
            attempts: 3,
            delay: Duration::ZERO,
        },
        ..RuntimeConfig::default()
    }
}

/// The transactional sink into `target`, counting its builds in `built`.
fn counted_tx(
    target: &Arc<Mutex<Target>>,
    built: &Arc<AtomicU32>,
) -> impl FnMut(usize) -> TxSink<Row> + Send + 'static {
    let (t, b) = (target.clone(), built.clone());
    move |i| {
        b.fetch_add(1, Ordering::Relaxed);
        TxSink::new(i, t.clone(), true)
    }
}

/// Runs `p` to its end in dedup mode ([`dedup_config`]) and checks that
/// its history holds one restart, of one subtask alone; the operator chain
/// that restarted.
fn recovers_alone_once(p: Pipeline, dir: &std::path::Path) -> String {
    let result = p
        .run(dedup_config(JOB.ring, dir))
        .and_then(|h| h.join())
        .expect("the job recovers and finishes");
    let restarts = &result.metrics.checkpoints.restarts;
    assert_eq!(restarts.len(), 1, "{restarts:?}");
    restarts[0].subtask.clone().expect("a subtask restart, not the job's").0
}

/// What [`two_stage_job`] built and ran.
struct TwoStages {
    result: weir_core::Result<weir_core::JobResult>,
    rows: Vec<Row>,
    /// Times each subtask of the count (with its sink), and each source,
    /// was built.
    counts_built: Vec<u32>,
    sources_built: Vec<u32>,
}

/// Two sources, a first keyed stage (keyed by sequence number, so the
/// second exchange is a real shuffle) that panics once on the record with
/// sequence number `fail_at`, then the keyed running count into the
/// transactional sink; dedup mode, 5 ms checkpoints ([`dedup_config`]),
/// with `deterministic` as `CheckpointConfig::dedup_deterministic`.
fn two_stage_job(job: Job, fail_at: u64, deterministic: bool, dir: &std::path::Path) -> TwoStages {
    let target = Arc::new(Mutex::new(Target::default()));
    let built = |n: usize| -> Arc<Vec<AtomicU32>> { Arc::new((0..n).map(|_| AtomicU32::new(0)).collect()) };
    let (counts, sources) = (built(job.keyed), built(job.sources));
    let failed = Arc::new(AtomicU64::new(0));
    let keys = job.keys;
    let cfg = generator(job);
    let p = Pipeline::new("dedup-two-stages");
    let (s, c) = (sources.clone(), counts.clone());
    let t = target.clone();
    let first = p
        .source("fast", job.sources, move |i, n| {
            s[i].fetch_add(1, Ordering::Relaxed);
            Generator::new(cfg, i, n, move |c: GenContext| (c.random % keys, c.seq)).unwrap()
        })
        .key_by(|r: &(u64, u64)| r.1 % 13)
        .parallelism(job.keyed)
        .process_heap(move |_: &u64, seen: &mut u64, r: (u64, u64), out| {
            if r.1 == fail_at && failed.fetch_add(1, Ordering::Relaxed) == 0 {
                panic!("injected failure at record {}", r.1)
            }
            *seen += 1;
            out.emit(r);
        })
        .name("first");
    let keyed = first.key_by(|r: &(u64, u64)| r.0).parallelism(job.keyed);
    running_count(keyed).sink("tx", move |i| {
        c[i].fetch_add(1, Ordering::Relaxed);
        TxSink::new(i, t.clone(), true)
    });
    let mut config = dedup_config(job.ring, dir);
    if let Some(c) = &mut config.checkpointing {
        c.dedup_deterministic = deterministic;
    }
    let result = p.run(config).and_then(|h| h.join());
    let rows = std::mem::take(&mut target.lock().unwrap().rows);
    let counted = |v: &[AtomicU32]| v.iter().map(|a| a.load(Ordering::Relaxed)).collect();
    TwoStages {
        result,
        rows,
        counts_built: counted(&counts),
        sources_built: counted(&sources),
    }
}

/// A subtask of a keyed stage that feeds another exchange fails once: it
/// alone is built again, restored, and fed its backup; its exchange keeps
/// its predecessor's rings and drops what the predecessor had already
/// sent, so the count behind it reads on as if nothing failed. Nothing
/// else is rebuilt, the restart history holds that one subtask restart,
/// and the output is exact. Failures early (before most checkpoints) and
/// late, so that the replay starts at a completed checkpoint and carries
/// a few thousand records.
#[test]
fn a_failed_subtask_that_feeds_an_exchange_recovers_alone_and_the_output_stays_exact() {
    for fail_at in [3_001, 41_000] {
        let dir = tempfile::tempdir().unwrap();
        let ran = two_stage_job(JOB, fail_at, true, dir.path());
        let result = ran.result.expect("the job recovers and finishes");
        assert_exactly_once(JOB, &ran.rows);
        let restarts = &result.metrics.checkpoints.restarts;
        assert_eq!(restarts.len(), 1, "{restarts:?}");
        let (operator, _) = restarts[0].subtask.clone().expect("a subtask restart, not the job's");
        assert_eq!(operator, "first -> key_by");
        assert!(
            restarts[0]
                .error
                .contains(&format!("injected failure at record {fail_at}")),
            "{}",
            restarts[0].error
        );
        assert_eq!(ran.counts_built, vec![1; JOB.keyed], "the count is never rebuilt");
        assert_eq!(ran.sources_built, vec![1; JOB.sources], "no source restarts");
    }
}

/// Without `CheckpointConfig::dedup_deterministic` a task that feeds an
/// exchange does not recover alone (its exchange would drop by count what
/// its predecessor sent, exact only for deterministic operators): its
/// failure restarts the whole job, and the output stays exact.
#[test]
fn without_deterministic_operators_a_producer_s_failure_restarts_the_whole_job() {
    let dir = tempfile::tempdir().unwrap();
    let ran = two_stage_job(JOB, 41_000, false, dir.path());
    let result = ran.result.expect("the job restarts and finishes");
    assert_exactly_once(JOB, &ran.rows);
    let restarts = &result.metrics.checkpoints.restarts;
    assert_eq!(restarts.len(), 1, "{restarts:?}");
    assert!(restarts[0].subtask.is_none(), "the whole job: {restarts:?}");
    assert_eq!(ran.sources_built, vec![2; JOB.sources], "the whole job was built again");
}

/// The same with event time: the first stage is a tumbling window per key
/// (1 s of event time, the records' sequence numbers as milliseconds),
/// whose results go through a second exchange to a running count of
/// windows and their records per key; one window result makes the stage
/// fail once. The replacement starts from the restored checkpoint's event
/// time and replays the watermarks it took since in their places, so its
/// windows fire where its predecessor's did and its exchange drops exactly
/// what was sent: every window reaches the count once (the running
/// numbers of windows per key are 1..=n once each) and the records they
/// hold add up to the input.
#[test]
fn a_failed_window_stage_recovers_alone_and_fires_where_it_did() {
    use weir_core::time::WatermarkStrategy;
    use weir_core::window::{Windowed, Windows};
    for fail_window in [4_000i64, 37_000] {
        let dir = tempfile::tempdir().unwrap();
        let target = Arc::new(Mutex::new(Target::default()));
        let counts = Arc::new(AtomicU32::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let keys = JOB.keys;
        let cfg = generator(JOB);
        let p = Pipeline::new("dedup-windows");
        p.source("fast", JOB.sources, move |i, n| {
            Generator::new(cfg, i, n, move |c: GenContext| (c.random % keys, c.seq as i64)).unwrap()
        })
        .assign_watermarks(WatermarkStrategy::bounded(50, |r: &(u64, i64)| r.1))
        .key_by(|r: &(u64, i64)| r.0)
        .parallelism(JOB.keyed)
        .window(Windows::tumbling(1_000), |r: &(u64, i64)| r.1)
        .process(|k: &u64, w, records: &[(u64, i64)], out: &mut Vec<(u64, i64, u64)>| {
            out.push((*k, w.start, records.len() as u64))
        })
        .flat_map(move |w: Windowed<(u64, i64, u64), (u64, i64)>| match w {
            Windowed::Result(r) => {
                if r.0 == 1 && r.1 == fail_window && failed.fetch_add(1, Ordering::Relaxed) == 0 {
                    panic!("injected failure at window {}", r.1)
                }
                Some(r)
            }
            Windowed::Late(e) => panic!("late record {e:?} within the bound"),
        })
        .name("windows")
        .key_by(|r: &(u64, i64, u64)| r.0)
        .parallelism(JOB.keyed)
        .process(move |k: &u64, st: &mut [u64; 2], (_, _, n): (u64, i64, u64), out| {
            st[0] += 1;
            st[1] += n;
            out.emit((*k, st[0], st[1]));
        })
        .name("count")
        .sink("tx", counted_tx(&target, &counts));
        recovers_alone_once(p, dir.path());
        assert_eq!(
            counts.load(Ordering::Relaxed),
            JOB.keyed as u32,
            "the count is never rebuilt"
        );
        let rows = std::mem::take(&mut target.lock().unwrap().rows);
        let mut by_key: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
        for &(k, windows, records) in &rows {
            by_key.entry(k).or_default().push((windows, records));
        }
        let mut total = 0;
        for (k, mut seen) in by_key {
            seen.sort();
            let numbers: Vec<u64> = seen.iter().map(|s| s.0).collect();
            assert_eq!(
                numbers,
                (1..=seen.len() as u64).collect::<Vec<_>>(),
                "key {k}: windows once each"
            );
            total += seen.last().unwrap().1;
        }
        assert_eq!(total, JOB.events, "the windows hold every record once");
    }
}

/// The count fails once and feeds a round-robin exchange (`rebalance`) to
/// the sink: it alone is built again, its exchange starts from its cursor
/// at the restored snapshot and drops what its predecessor had sent, so the
/// sink's subtasks see each row once; nothing else is rebuilt.
#[test]
fn a_failed_subtask_that_feeds_a_rebalance_recovers_alone_and_the_output_stays_exact() {
    for fail_at in [2_999, 43_000] {
        let dir = tempfile::tempdir().unwrap();
        let target = Arc::new(Mutex::new(Target::default()));
        let sinks = Arc::new(AtomicU32::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let keys = JOB.keys;
        let cfg = generator(JOB);
        let p = Pipeline::new("dedup-rebalance");
        p.source("fast", JOB.sources, move |i, n| {
            Generator::new(cfg, i, n, move |c: GenContext| (c.random % keys, c.seq)).unwrap()
        })
        .key_by(|r: &(u64, u64)| r.0)
        .parallelism(JOB.keyed)
        .process(move |k: &u64, st: &mut [u64; 2], (_, v): (u64, u64), out| {
            if v == fail_at && failed.fetch_add(1, Ordering::Relaxed) == 0 {
                panic!("injected failure at record {v}")
            }
            st[0] += 1;
            st[1] = st[1].wrapping_add(v);
            out.emit((*k, st[0], st[1]));
        })
        .name("count")
        .rebalance(2)
        .sink("tx", counted_tx(&target, &sinks));
        assert_eq!(recovers_alone_once(p, dir.path()), "count");
        assert_eq!(sinks.load(Ordering::Relaxed), 2, "the sinks are never rebuilt");
        let rows = std::mem::take(&mut target.lock().unwrap().rows);
        assert_exactly_once(JOB, &rows);
    }
}

/// A sink whose replacement's restore waits until the other sink subtask
/// has taken `more` records since: it passes only if the replacement is
/// restored while the worker runs on (both subtasks share one worker).
struct RestoresBeside {
    inner: TxSink<Row>,
    subtask: usize,
    /// Records each subtask's sink took.
    taken: Arc<Vec<AtomicU64>>,
    replacement: bool,
    more: u64,
}

impl weir_core::Sink<Row> for RestoresBeside {
    fn write(&mut self, batch: &mut Vec<Row>, ctx: &mut weir_core::SinkContext<'_>) -> Result<(), weir_core::BoxError> {
        self.taken[self.subtask].fetch_add(batch.len() as u64, Ordering::Relaxed);
        self.inner.write(batch, ctx)
    }
    fn finish(&mut self, ctx: &mut weir_core::SinkContext<'_>) -> Result<(), weir_core::BoxError> {
        self.inner.finish(ctx)
    }
    fn pre_commit(&mut self, checkpoint: u64) -> Result<Vec<u8>, weir_core::BoxError> {
        self.inner.pre_commit(checkpoint)
    }
    fn commit(&mut self, checkpoint: u64) -> Result<(), weir_core::BoxError> {
        self.inner.commit(checkpoint)
    }
    fn restore(&mut self, checkpoint: u64, state: &[u8]) -> Result<(), weir_core::BoxError> {
        if self.replacement {
            let name = std::thread::current().name().unwrap_or("").to_string();
            if name.starts_with("weir-worker") {
                return Err(format!("the replacement was restored on its worker ({name})").into());
            }
            let other = &self.taken[1 - self.subtask];
            let from = other.load(Ordering::Relaxed);
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while other.load(Ordering::Relaxed) < from + self.more {
                if std::time::Instant::now() > deadline {
                    return Err(
                        "the other subtask took nothing while this one was restored: its worker stalled".into(),
                    );
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        self.inner.restore(checkpoint, state)
    }
}

/// The failed subtask's old chain is dropped and its replacement restored
/// on the job thread: the other keyed subtask, on the same worker, goes on
/// taking records meanwhile (its rings are large enough that the sources
/// never wait on the failed one's), and the output stays exact.
#[test]
fn a_replacement_is_restored_while_its_worker_runs_the_other_subtasks() {
    let dir = tempfile::tempdir().unwrap();
    let job = Job {
        events: 60_000,
        rate: 200_000.0,
        ring: 16_384,
        ..JOB
    };
    let target = Arc::new(Mutex::new(Target::default()));
    let taken: Arc<Vec<AtomicU64>> = Arc::new((0..2).map(|_| AtomicU64::new(0)).collect());
    let built: Arc<Vec<AtomicU32>> = Arc::new((0..2).map(|_| AtomicU32::new(0)).collect());
    let failed = Arc::new(AtomicU64::new(0));
    let keys = job.keys;
    let cfg = generator(job);
    let p = Pipeline::new("dedup-restore-beside");
    let (t, tk, b) = (target.clone(), taken.clone(), built.clone());
    p.source("fast", 2, move |i, n| {
        Generator::new(cfg, i, n, move |c: GenContext| (c.random % keys, c.seq)).unwrap()
    })
    .key_by(|r: &(u64, u64)| r.0)
    .parallelism(2)
    .process(move |k: &u64, st: &mut [u64; 2], (_, v): (u64, u64), out| {
        if v == 10_000 && failed.fetch_add(1, Ordering::Relaxed) == 0 {
            panic!("injected failure at record {v}");
        }
        st[0] += 1;
        st[1] = st[1].wrapping_add(v);
        out.emit((*k, st[0], st[1]));
    })
    .name("count")
    .sink("tx", move |i| RestoresBeside {
        inner: TxSink::new(i, t.clone(), true),
        subtask: i,
        taken: tk.clone(),
        replacement: b[i].fetch_add(1, Ordering::Relaxed) > 0,
        more: 500,
    });
    let config = RuntimeConfig {
        workers: 1,
        ..dedup_config(job.ring, dir.path())
    };
    let result = p
        .run(config)
        .and_then(|h| h.join())
        .expect("the job recovers and finishes");
    let restarts = &result.metrics.checkpoints.restarts;
    assert_eq!(restarts.len(), 1, "{restarts:?}");
    assert!(
        restarts[0].subtask.is_some(),
        "a subtask restart, not the job's: {restarts:?}"
    );
    let built: Vec<u32> = built.iter().map(|a| a.load(Ordering::Relaxed)).collect();
    assert_eq!(built.iter().sum::<u32>(), 3, "one sink subtask built again: {built:?}");
    let rows = std::mem::take(&mut target.lock().unwrap().rows);
    assert_exactly_once(job, &rows);
}
