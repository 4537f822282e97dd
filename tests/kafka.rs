//! The Kafka source against a real broker (`bench/peers/kafka/kafka.sh`,
//! started once for this binary by `common::kafka`): exact keyed counts over
//! multi-partition topics, with more and fewer partitions than subtasks;
//! failures restored from checkpoints with exactly the same result; start
//! positions; malformed records; transactions; watermarks.
//!
//! Every test creates topics of its own, so the tests run in parallel
//! against the one broker. If the broker cannot start, every test here
//! fails.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::kafka::{broker, send_all, unique_topic, CLIENT_TIMEOUT};
use common::{Target, TxSink};
use weir_core::harness::Harness;
use weir_core::window::{AggregateFunction, Windowed, Windows};
use weir_core::{
    CheckpointConfig, CheckpointMode, CollectSink, Outcome, Pipeline, RestartStrategy, RuntimeConfig, SourcePoll,
};
use weir_io::kafka::KafkaSourceConfig;
use weir_io::rdkafka::consumer::{BaseConsumer, Consumer};
use weir_io::rdkafka::producer::Producer;
use weir_io::rdkafka::{Offset, TopicPartitionList};
use weir_io::{KafkaRecordInfo, KafkaSource, ParseError, StartFrom};

/// The standard output of a `weir` command that must have succeeded; its
/// status, output and errors in the panic otherwise.
fn stdout_of_success(what: &str, out: &std::process::Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what}: {}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// key, value, record timestamp (ms)
type Rec = (u64, u64, i64);

/// `key,value` values, as the file sources read lines.
fn parse(v: &[u8], info: &KafkaRecordInfo<'_>) -> Result<Rec, ParseError> {
    let s = std::str::from_utf8(v).map_err(|_| ParseError::new("not UTF-8"))?;
    let (k, v) = s.split_once(',').ok_or("expected key,value")?;
    let k = k.parse().map_err(|e| ParseError::new(format!("key {k:?}: {e}")))?;
    let v = v.parse().map_err(|e| ParseError::new(format!("value {v:?}: {e}")))?;
    Ok((k, v, info.timestamp_ms.unwrap_or(0)))
}

type Parse = fn(&[u8], &KafkaRecordInfo<'_>) -> Result<Rec, ParseError>;
type Src = KafkaSource<Rec, Parse>;

fn source(config: &KafkaSourceConfig, i: usize, n: usize) -> Src {
    KafkaSource::new(config.clone(), i, n, parse as Parse)
}

/// Record `i` of a test topic: key `i % keys`, value `i`, partition
/// `i % partitions`, timestamp `base_ts + i`.
fn record(i: u64, keys: u64, partitions: i32, base_ts: i64) -> (i32, &'static str, String, Option<i64>) {
    (
        (i % partitions as u64) as i32,
        "k",
        format!("{},{i}", i % keys),
        Some(base_ts + i as i64),
    )
}

/// A topic of `partitions` partitions holding records `from..to`.
fn fill(topic: &str, partitions: i32, from: u64, to: u64, keys: u64) {
    broker().produce(topic, (from..to).map(|i| record(i, keys, partitions, 1_000_000)));
}

fn new_topic(prefix: &str, partitions: i32, n: u64, keys: u64) -> String {
    let topic = unique_topic(prefix);
    broker().create_topic(&topic, partitions);
    fill(&topic, partitions, 0, n, keys);
    topic
}

/// Per key: (count, sum of values) of records `from..to`.
fn expected(from: u64, to: u64, keys: u64) -> HashMap<u64, (u64, u64)> {
    let mut m: HashMap<u64, (u64, u64)> = HashMap::new();
    for i in from..to {
        let e = m.entry(i % keys).or_default();
        e.0 += 1;
        e.1 += i;
    }
    m
}

/// Exactly once: per key, running counts 1..=n once each and the right final sum.
fn assert_exact(rows: &[(u64, u64, u64)], exp: &HashMap<u64, (u64, u64)>, what: &str) {
    let mut by_key: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
    for &(k, c, s) in rows {
        by_key.entry(k).or_default().push((c, s));
    }
    assert_eq!(by_key.len(), exp.len(), "{what}: keys with output");
    for (k, &(n, sum)) in exp {
        let mut got = by_key.remove(k).unwrap_or_default();
        got.sort();
        let counts: Vec<u64> = got.iter().map(|r| r.0).collect();
        assert_eq!(counts, (1..=n).collect::<Vec<_>>(), "{what}: key {k}: counts");
        assert_eq!(got.last().unwrap().1, sum, "{what}: key {k}: final sum");
    }
}

/// Fails a map `failures` times: after 1,500 records, then 3,000 records
/// after each failure, at most once per attempt (while a failed attempt
/// stops, the other worker may still pass thousands of records through).
#[derive(Clone)]
struct Failures {
    seen: Arc<AtomicU64>,
    next_at: Arc<AtomicU64>,
    left: Arc<AtomicU32>,
    /// Attempts started (the source factory of subtask 0 counts them).
    attempt: Arc<AtomicU64>,
    failed_attempt: Arc<AtomicU64>,
}

impl Failures {
    fn new(n: u32) -> Self {
        Failures {
            seen: Arc::default(),
            next_at: Arc::new(AtomicU64::new(1_500)),
            left: Arc::new(AtomicU32::new(n)),
            attempt: Arc::default(),
            failed_attempt: Arc::default(),
        }
    }
    fn tick(&self) {
        let n = self.seen.fetch_add(1, Ordering::Relaxed) + 1;
        if n < self.next_at.load(Ordering::Relaxed) || self.left.load(Ordering::Relaxed) == 0 {
            return;
        }
        let a = self.attempt.load(Ordering::Relaxed);
        if self.failed_attempt.swap(a, Ordering::Relaxed) != a {
            self.left.fetch_sub(1, Ordering::Relaxed);
            self.next_at.store(n + 3_000, Ordering::Relaxed);
            panic!("injected failure after {n} records");
        }
    }
}

#[derive(Debug)]
struct Run {
    rows: Vec<(u64, u64, u64)>,
    restarts: usize,
    completed: u64,
}

/// The keyed count job over `config` with `par` source subtasks: a
/// running (count, sum) per key into the transactional test sink.
fn run_count(
    config: &KafkaSourceConfig,
    par: usize,
    mode: Option<CheckpointMode>,
    failures: u32,
) -> weir_core::Result<Run> {
    let dir = tempfile::tempdir().unwrap();
    let target = Arc::new(Mutex::new(Target::default()));
    let t = target.clone();
    let fail = Failures::new(failures);
    let attempts = fail.attempt.clone();
    let p = Pipeline::new("kafka-count");
    let c = config.clone();
    p.source("kafka", par, move |i, n| {
        if i == 0 {
            attempts.fetch_add(1, Ordering::Relaxed);
        }
        source(&c, i, n)
    })
    .map(move |r: Rec| {
        fail.tick();
        r
    })
    .name("failures")
    .key_by(|r: &Rec| r.0)
    .parallelism(2)
    .process(|k: &u64, st: &mut [u64; 2], r: Rec, out| {
        st[0] += 1;
        st[1] += r.1;
        out.emit((*k, st[0], st[1]));
    })
    .name("count")
    .sink("tx", move |i| TxSink::new(i, t.clone(), mode.is_some()));
    let cfg = RuntimeConfig {
        workers: 2,
        checkpointing: mode.map(|m| CheckpointConfig {
            interval: Duration::from_millis(10),
            timeout: Duration::from_secs(30),
            ..CheckpointConfig::new(m, dir.path())
        }),
        restart: RestartStrategy::FixedDelay {
            attempts: 10,
            delay: Duration::from_millis(1),
        },
        ..RuntimeConfig::default()
    };
    let result = p.run(cfg)?.join()?;
    assert_eq!(result.outcome, Outcome::Finished);
    let rows = std::mem::take(&mut target.lock().unwrap().rows);
    Ok(Run {
        rows,
        restarts: result.metrics.checkpoints.restarts.len(),
        completed: result.metrics.checkpoints.completed,
    })
}

/// The harness itself: the broker serves a produce and a fetch.
#[test]
fn the_test_broker_serves() {
    let b = broker();
    let topic = unique_topic("smoke");
    b.create_topic(&topic, 1);
    b.produce(&topic, [(0, "k", "1,1".to_string(), None)]);
    let consumer: BaseConsumer = b
        .client()
        .set("group.id", "smoke")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&topic, 0, Offset::Beginning).unwrap();
    consumer.assign(&tpl).unwrap();
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    loop {
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m.unwrap();
            assert_eq!(weir_io::rdkafka::Message::payload(&m), Some(&b"1,1"[..]));
            break;
        }
        assert!(Instant::now() < deadline, "nothing fetched from {}", b.addr);
    }
    eprintln!("the broker started in {:.1} s", b.started_in.as_secs_f64());
}

#[test]
fn bounded_counts_are_exact_with_more_or_fewer_partitions_than_subtasks() {
    let (n, keys) = (12_000, 40);
    // (partitions, source subtasks)
    for (partitions, par) in [(4, 2), (5, 2), (2, 3), (1, 1)] {
        let topic = new_topic("count", partitions, n, keys);
        let config = KafkaSourceConfig::new(&broker().addr, &topic).bounded();
        let run = run_count(&config, par, None, 0).unwrap();
        assert_exact(
            &run.rows,
            &expected(0, n, keys),
            &format!("{partitions} partitions, {par} subtasks"),
        );
    }
}

#[test]
fn failures_restore_partition_offsets_exactly() {
    let (n, keys) = (20_000, 50);
    let topic = new_topic("restore", 3, n, keys);
    for mode in [CheckpointMode::Aligned, CheckpointMode::Unaligned] {
        let config = KafkaSourceConfig::new(&broker().addr, &topic).bounded();
        let run = run_count(&config, 2, Some(mode), 3).unwrap();
        assert_eq!(run.restarts, 3, "{mode:?}: three injected failures");
        assert!(run.completed >= 1, "{mode:?}: checkpoints completed");
        assert_exact(&run.rows, &expected(0, n, keys), &format!("{mode:?}"));
    }
}

#[test]
fn at_least_once_through_failures_loses_nothing() {
    let (n, keys) = (10_000, 20);
    let topic = new_topic("alo", 2, n, keys);
    let config = KafkaSourceConfig::new(&broker().addr, &topic).bounded();
    let run = run_count(&config, 2, Some(CheckpointMode::AtLeastOnce), 2).unwrap();
    assert_eq!(run.restarts, 2);
    let exp = expected(0, n, keys);
    for (k, (cnt, _)) in exp {
        let got: std::collections::HashSet<u64> = run.rows.iter().filter(|r| r.0 == k).map(|r| r.1).collect();
        assert!((1..=cnt).all(|c| got.contains(&c)), "key {k}: a count is missing");
    }
}

/// Polls `src` through a harness until it is done, or set up and
/// without new records for `settle`; returns what it emitted.
fn drain_now(h: &mut Harness, src: &mut Src, settle: Duration) -> (Vec<Rec>, SourcePoll) {
    let mut all = Vec::new();
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    let mut last_record = Instant::now();
    loop {
        let mut out = Vec::new();
        let status = h.poll_source(src, &mut out, 500).unwrap();
        if !out.is_empty() || !src.is_set_up() {
            last_record = Instant::now();
        }
        all.extend(out);
        if status == SourcePoll::Done || last_record.elapsed() >= settle {
            return (all, status);
        }
        assert!(
            Instant::now() < deadline,
            "the source did not settle within {CLIENT_TIMEOUT:?}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn values(recs: &[Rec]) -> Vec<u64> {
    let mut v: Vec<u64> = recs.iter().map(|r| r.1).collect();
    v.sort();
    v
}

#[test]
fn start_positions_earliest_latest_and_timestamp() {
    let topic = new_topic("start", 2, 100, 5);
    let b = broker();
    // Earliest, bounded: everything.
    let earliest = KafkaSourceConfig::new(&b.addr, &topic).bounded();
    let (got, status) = drain_now(
        &mut Harness::new(0, 1),
        &mut source(&earliest, 0, 1),
        Duration::from_secs(30),
    );
    assert_eq!(status, SourcePoll::Done);
    assert_eq!(values(&got), (0..100).collect::<Vec<_>>());
    // Timestamp: records are at 1_000_000 + i, so from i = 60 on.
    let by_time = earliest.clone().start_from(StartFrom::Timestamp(1_000_060));
    let (got, _) = drain_now(
        &mut Harness::new(0, 1),
        &mut source(&by_time, 0, 1),
        Duration::from_secs(30),
    );
    assert_eq!(values(&got), (60..100).collect::<Vec<_>>());
    // After the last record's time: nothing, and done at once.
    let late = earliest.clone().start_from(StartFrom::Timestamp(2_000_000));
    let (got, status) = drain_now(
        &mut Harness::new(0, 1),
        &mut source(&late, 0, 1),
        Duration::from_secs(30),
    );
    assert!(got.is_empty() && status == SourcePoll::Done);
    // Latest, unbounded: only what is produced after the source started.
    let latest = KafkaSourceConfig::new(&b.addr, &topic).start_from(StartFrom::Latest);
    let mut h = Harness::new(0, 1);
    let mut src = source(&latest, 0, 1);
    let (got, _) = drain_now(&mut h, &mut src, Duration::from_millis(500));
    assert!(got.is_empty(), "latest read old records: {got:?}");
    assert_eq!(src.partitions(), vec![0, 1]);
    fill(&topic, 2, 100, 130, 5);
    let mut got = Vec::new();
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    while got.len() < 30 && Instant::now() < deadline {
        let mut out = Vec::new();
        h.poll_source(&mut src, &mut out, 100).unwrap();
        got.extend(out);
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(values(&got), (100..130).collect::<Vec<_>>());
}

/// The group's committed offsets of `topic`'s partitions, as a map.
fn committed(topic: &str, group: &str, partitions: i32) -> HashMap<i32, i64> {
    let consumer: BaseConsumer = broker().client().set("group.id", group).create().unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let got = consumer.committed_offsets(tpl, CLIENT_TIMEOUT).unwrap();
    got.elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some((e.partition(), o)),
            _ => None,
        })
        .collect()
}

#[test]
fn committed_offsets_start_where_the_last_run_committed() {
    let (n, keys) = (6_000, 10);
    let topic = new_topic("group", 3, n, keys);
    let group = unique_topic("weir-group");
    let config = KafkaSourceConfig::new(&broker().addr, &topic)
        .bounded()
        .group(&group)
        .start_from(StartFrom::CommittedOrEarliest)
        .commit_offsets_on_checkpoint();
    // No committed offsets yet: from the earliest.
    let run = run_count(&config, 2, Some(CheckpointMode::Aligned), 0).unwrap();
    assert_exact(&run.rows, &expected(0, n, keys), "first run");
    // The final checkpoint's commit is asynchronous (and completes while
    // the consumer closes): wait for it.
    let want: HashMap<i32, i64> = (0..3).map(|p| (p, n as i64 / 3)).collect();
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    while committed(&topic, &group, 3) != want {
        assert!(
            Instant::now() < deadline,
            "committed offsets {:?}",
            committed(&topic, &group, 3)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(config.stats().commits() >= 1);
    assert_eq!(config.stats().commit_failures(), 0);
    // A second run reads only what came since.
    fill(&topic, 3, n, n + 900, keys);
    let run = run_count(&config, 2, Some(CheckpointMode::Aligned), 0).unwrap();
    assert_exact(&run.rows, &expected(n, n + 900, keys), "second run");
}

#[test]
fn a_malformed_record_fails_with_topic_partition_and_offset() {
    let topic = unique_topic("bad");
    let b = broker();
    b.create_topic(&topic, 2);
    // Partition 1: offsets 0..3 good, 3 bad, then good again.
    let mut recs: Vec<(i32, &str, String, Option<i64>)> = (0..3).map(|i| (1, "k", format!("1,{i}"), None)).collect();
    recs.push((1, "k", "1,three".into(), None));
    recs.extend((4..8).map(|i| (1, "k", format!("1,{i}"), None)));
    recs.extend((0..5).map(|i| (0, "k", format!("2,{i}"), None)));
    b.produce(&topic, recs);
    let config = KafkaSourceConfig::new(&b.addr, &topic).bounded();
    let err = run_count(&config, 2, None, 0)
        .expect_err("the bad record fails the job")
        .to_string();
    assert!(
        err.contains(&format!("topic '{topic}', partition 1, offset 3")),
        "names topic, partition and offset: {err}"
    );
    assert!(err.contains("value \"three\"") && err.contains("1,three"), "{err}");
    // Skipping: counted, and the rest is exact.
    let skip = config.clone().skip_bad_records();
    let run = run_count(&skip, 2, None, 0).unwrap();
    assert_eq!(skip.stats().skipped(), 1);
    let mut exp = HashMap::new();
    exp.insert(1, (7, (0..8).sum::<u64>() - 3));
    exp.insert(2, (5, (0..5).sum()));
    assert_exact(&run.rows, &exp, "skip");
}

#[test]
fn aborted_and_open_transactions_are_not_read() {
    let topic = unique_topic("txn");
    let b = broker();
    b.create_topic(&topic, 2);
    let rec = |i: u64| ((i % 2) as i32, "k", format!("{},{i}", i % 3), None);
    // Committed: 0..100; aborted: 1000..1100; committed: 100..200.
    let p = b.transactional_producer(&unique_topic("tx"));
    for (range, commit) in [(0..100, true), (1000..1100, false), (100..200, true)] {
        p.begin_transaction().unwrap();
        send_all(&p, &topic, range.map(rec));
        p.flush(CLIENT_TIMEOUT).unwrap();
        if commit {
            p.commit_transaction(CLIENT_TIMEOUT).unwrap();
        } else {
            p.abort_transaction(CLIENT_TIMEOUT).unwrap();
        }
    }
    // Left open while the job runs: past the last stable offset, so a
    // bounded source neither reads it nor waits for it.
    let open = b.transactional_producer(&unique_topic("tx-open"));
    open.begin_transaction().unwrap();
    send_all(&open, &topic, (5000..5050).map(rec));
    open.flush(CLIENT_TIMEOUT).unwrap();
    let config = KafkaSourceConfig::new(&b.addr, &topic).bounded();
    let run = run_count(&config, 2, Some(CheckpointMode::Aligned), 0).unwrap();
    assert_exact(&run.rows, &expected(0, 200, 3), "committed records only");
    open.abort_transaction(CLIENT_TIMEOUT).unwrap();
}

#[test]
fn watermarks_are_per_partition_and_idle_partitions_stop_holding_them() {
    let topic = unique_topic("wm");
    let b = broker();
    b.create_topic(&topic, 2);
    b.produce(
        &topic,
        [
            (0, "k", "1,1".to_string(), Some(5_000)),
            (0, "k", "1,2".to_string(), Some(7_000)),
            (1, "k", "1,3".to_string(), Some(3_000)),
        ],
    );
    // Idle after 1 s: far beyond a poll's delay on a loaded machine.
    let config = KafkaSourceConfig::new(&b.addr, &topic).watermarks(100, Some(1_000));
    let mut h = Harness::new(0, 1);
    let mut src = source(&config, 0, 1);
    let (got, _) = drain_now(&mut h, &mut src, Duration::from_millis(100));
    assert_eq!(got.len(), 3);
    let wms = h.take_watermarks();
    // The minimum over partitions: partition 1's 3000 - 100 - 1.
    assert_eq!(wms.last(), Some(&Some(2_899)), "{wms:?}");
    assert!(
        wms.iter().flatten().all(|&w| w <= 2_899),
        "never past the slow partition: {wms:?}"
    );
    // Both partitions idle after 1 s without records: the subtask is idle.
    let (_, _) = drain_now(&mut h, &mut src, Duration::from_millis(1_500));
    assert_eq!(h.take_watermarks().last(), Some(&None), "marked idle");
    // Partition 0 again: active, at its own watermark (partition 1 still idle).
    b.produce(&topic, [(0, "k", "1,4".to_string(), Some(9_000))]);
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    loop {
        let mut out = Vec::new();
        h.poll_source(&mut src, &mut out, 10).unwrap();
        if !out.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(h.take_watermarks().last(), Some(&Some(8_899)));
}

/// Counts per window.
#[derive(Clone)]
struct Count;

impl AggregateFunction<Rec> for Count {
    type Acc = u64;
    type Output = u64;
    fn add(&self, acc: &mut u64, _: &Rec) {
        *acc += 1;
    }
    fn result(&self, acc: &u64) -> u64 {
        *acc
    }
    fn merge(&self, acc: &mut u64, o: u64) {
        *acc += o;
    }
}

/// Three source subtasks over two partitions, unbounded: the subtask with
/// no partition marks itself idle, so event time advances and windows fire
/// while the job runs.
#[test]
fn a_subtask_without_partitions_does_not_hold_event_time_back() {
    let topic = unique_topic("idle");
    let b = broker();
    b.create_topic(&topic, 2);
    // Windows of 1 s over 5 s, two keys; a last record 10 s later closes
    // them. (Timestamps from 1,000 s on: the producer takes 0 as "now".)
    const T0: i64 = 1_000_000;
    let mut recs: Vec<(i32, &str, String, Option<i64>)> = (0..50u64)
        .map(|i| ((i % 2) as i32, "k", format!("{},{i}", i % 2), Some(T0 + i as i64 * 100)))
        .collect();
    recs.push((0, "k", "0,50".into(), Some(T0 + 10_000)));
    recs.push((1, "k", "1,51".into(), Some(T0 + 10_000)));
    b.produce(&topic, recs);
    let config = KafkaSourceConfig::new(&b.addr, &topic).watermarks(0, None);
    let out = Arc::new(Mutex::new(Vec::new()));
    let o = out.clone();
    let p = Pipeline::new("kafka-windows");
    p.source("kafka", 3, move |i, n| source(&config, i, n))
        .key_by(|r: &Rec| r.0)
        .parallelism(2)
        .window(Windows::tumbling(1_000), |r: &Rec| r.2)
        .aggregate(Count, |k: &u64, w, c| (*k, w.start, c))
        .sink("collect", move |_| CollectSink::new(o.clone()));
    let job = p.run(RuntimeConfig::default()).unwrap();
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    while out.lock().unwrap().len() < 10 {
        assert!(
            Instant::now() < deadline,
            "windows did not fire: event time is held back ({:?})",
            out.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    job.cancel();
    job.join().unwrap();
    let mut got: Vec<(u64, i64, u64)> = out
        .lock()
        .unwrap()
        .iter()
        .map(|w: &Windowed<(u64, i64, u64), Rec>| match w {
            Windowed::Result(r) => *r,
            Windowed::Late(r) => panic!("late record {r:?}"),
        })
        .collect();
    got.sort();
    let want: Vec<(u64, i64, u64)> = (0..2)
        .flat_map(|k| (0..5).map(move |s| (k, T0 + s * 1_000, 5)))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn a_missing_topic_fails_with_its_name() {
    let topic = unique_topic("missing");
    let config = KafkaSourceConfig::new(&broker().addr, &topic).bounded();
    let err = run_count(&config, 1, None, 0).expect_err("no such topic").to_string();
    assert!(err.contains(&topic) && err.contains("does not exist"), "{err}");
}

/// The source's side of group commits, driven by hand: the offsets of
/// checkpoint 1 are committed when checkpoint 1 completes, not before, and
/// not those read after it.
#[test]
fn a_completed_checkpoint_commits_its_offsets_to_the_group() {
    use weir_core::Source;
    let topic = new_topic("commit", 2, 100, 5);
    let group = unique_topic("weir-group");
    let config = KafkaSourceConfig::new(&broker().addr, &topic)
        .group(&group)
        .commit_offsets_on_checkpoint();
    let mut h = Harness::new(0, 1);
    let mut src = source(&config, 0, 1);
    let mut got = Vec::new();
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    while got.len() < 60 {
        let mut out = Vec::new();
        h.poll_source(&mut src, &mut out, 60 - got.len()).unwrap();
        got.extend(out);
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut at_1: HashMap<i32, i64> = HashMap::new();
    for r in &got {
        let p = (r.1 % 2) as i32;
        let e = at_1.entry(p).or_default();
        *e = (*e).max(r.1 as i64 / 2 + 1);
    }
    Source::<Rec>::checkpoint_offset(&mut src, 1);
    let (rest, _) = drain_now(&mut h, &mut src, Duration::from_millis(300));
    assert_eq!(got.len() + rest.len(), 100);
    assert!(
        committed(&topic, &group, 2).is_empty(),
        "nothing committed before completion"
    );
    Source::<Rec>::checkpoint_complete(&mut src, 1).unwrap();
    assert_eq!(config.stats().commits(), 1);
    while committed(&topic, &group, 2) != at_1 {
        assert!(
            Instant::now() < deadline,
            "committed {:?}, want {at_1:?}",
            committed(&topic, &group, 2),
        );
        h.poll_source(&mut src, &mut Vec::new(), 10).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `weir run` with a Kafka topic and a file side by side: every record of
/// both counted exactly once in the committed output.
#[test]
fn weir_run_reads_a_kafka_topic_and_a_file_together() {
    let keys = 7;
    let topic = new_topic("run", 3, 3_000, keys);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("more.csv");
    let text: String = (3_000..4_000u64).map(|i| format!("{},{i}\n", i % keys)).collect();
    std::fs::write(&file, text).unwrap();
    let out = dir.path().join("out");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
        .args([
            "run",
            "--job",
            "keyed-count",
            "--parallelism",
            "2",
            "--checkpoint-interval-ms",
            "20",
        ])
        .arg("--input")
        .arg(format!("kafka:{}/{topic}", broker().addr))
        .arg("--input")
        .arg(&file)
        .arg("--output")
        .arg(&out)
        .arg("--checkpoint-dir")
        .arg(dir.path().join("ck"))
        .status()
        .unwrap();
    assert!(status.success(), "weir run: {status}");
    let mut rows = Vec::new();
    for entry in std::fs::read_dir(&out).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name().to_string_lossy().starts_with('.') || !entry.file_type().unwrap().is_file() {
            continue;
        }
        for line in std::fs::read_to_string(entry.path()).unwrap().lines() {
            let f: Vec<u64> = line.split(',').map(|x| x.parse().unwrap()).collect();
            rows.push((f[0], f[1], f[2]));
        }
    }
    assert_exact(&rows, &expected(0, 4_000, keys), "weir run");
}

/// `weir compare --kafka` on the test broker: the generator rows as
/// always, then the keyed count through Kafka at least once and exactly
/// once, in a table of its own, with its sentence and its JSON lines; the
/// exactly-once row's output checked (the benchmark fails on a loss or a
/// duplicate).
#[test]
fn weir_compare_puts_kafka_rows_beside_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("results");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
        .args([
            "compare",
            "--events",
            "100000",
            "--open-seconds",
            "0.3",
            "--intervals",
            "20",
            "--rounds",
            "1",
            "--failure-stages",
            "1",
            "--kafka",
            "--kafka-rate",
            "10000",
            "--kafka-events",
            "30000",
            "--brokers",
            &broker().addr,
            "--results",
        ])
        .arg(&results)
        .env("WEIR_LOG", "warn")
        .env("TMPDIR", dir.path())
        .output()
        .unwrap();
    let text = stdout_of_success("weir compare", &out);
    assert!(
        text.contains("Through Kafka: the keyed count from topic to topic"),
        "{text}"
    );
    assert!(text.contains("at-least-once·kafka"), "{text}");
    assert!(text.contains("aligned·kafka"), "{text}");
    assert!(
        text.contains("- through Kafka, exactly-once at 20 ms showed visible p99"),
        "{text}"
    );
    // The broker's own floor, measured in the same run with Kafka's tool.
    assert!(
        text.contains("the broker's own round trip, one record at a time (Kafka's EndToEndLatency"),
        "{text}"
    );
    assert!(text.contains("- through Kafka, at-least-once's visible p99"), "{text}");
    let json = std::fs::read_to_string(results.join("compare.json")).unwrap();
    let floor: serde_json::Value = json
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["run"] == "kafka-broker-floor")
        .expect("the broker floor's line");
    assert!(
        floor["p99_ms"]
            .as_f64()
            .is_some_and(|v| v >= floor["p50_ms"].as_f64().unwrap()),
        "{floor}"
    );
    let rows: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["run"] == "kafka-open-loop")
        .collect();
    assert_eq!(rows.len(), 2, "{json}");
    for row in &rows {
        assert_eq!(row["output_records"], 30000, "{row}");
        assert_eq!(row["interval_ms"], 20, "{row}");
        assert!(
            row["visible_latency_us"]["p99"].as_f64().is_some_and(|v| v > 0.0),
            "{row}"
        );
        assert!(row["parts"]["sink_to_append_us"]["p50"].as_f64().is_some(), "{row}");
    }
    let eo = rows
        .iter()
        .find(|r| r["row"] == "aligned·kafka")
        .expect("the exactly-once row");
    assert_eq!(eo["duplicates"], 0, "{eo}");
    assert!(eo["parts"]["transactions"].as_u64().is_some_and(|n| n > 0), "{eo}");
}

/// `weir bench --external-job IN:OUT`: another engine's job between the
/// load and the reader (here a keyed count written in the test with plain
/// Kafka clients, the role Flink's job plays in
/// bench/peers/kafka/open_loop.sh): the load trickles until the job's first
/// output, then runs its schedule; the reader checks every key's final
/// count and measures visibility from each record's scheduled send.
#[test]
fn weir_bench_measures_an_external_job_between_two_topics() {
    use weir_io::rdkafka::producer::{BaseProducer, BaseRecord};
    use weir_io::rdkafka::Message;
    let (input, output) = (unique_topic("external-in"), unique_topic("external-out"));
    for t in [&input, &output] {
        broker().create_topic(t, 2);
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let job = {
        let (input, output, stop) = (input.clone(), output.clone(), stop.clone());
        std::thread::spawn(move || {
            let consumer: BaseConsumer = broker()
                .client()
                .set("group.id", "external-job")
                .set("auto.offset.reset", "earliest")
                .set("isolation.level", "read_committed")
                .create()
                .unwrap();
            consumer.subscribe(&[input.as_str()]).unwrap();
            let producer: BaseProducer = broker().client().set("linger.ms", "1").create().unwrap();
            let mut counts: HashMap<u64, u64> = HashMap::new();
            let mut written = 0u64;
            while !stop.load(Ordering::Acquire) {
                producer.poll(Duration::ZERO);
                let Some(m) = consumer.poll(Duration::from_millis(20)) else {
                    continue;
                };
                let m = m.unwrap();
                let v = std::str::from_utf8(m.payload().unwrap()).unwrap();
                let f: Vec<&str> = v.split(',').collect();
                let key: u64 = f[0].parse().unwrap();
                let n = counts.entry(key).or_default();
                *n += 1;
                let value = format!("{key},{n},{}", f[2]);
                let mut record = BaseRecord::to(&output).key(f[0]).payload(&value);
                while let Err((_, r)) = producer.send(record) {
                    producer.poll(Duration::from_millis(1));
                    record = r;
                }
                written += 1;
            }
            producer.flush(CLIENT_TIMEOUT).unwrap();
            written
        })
    };
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("external.json");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["bench", "--source", "kafka", "--sink", "kafka", "--partitions", "2"])
        .args(["--brokers", &broker().addr, "--keys", "50"])
        .args(["--external-job", &format!("{input}:{output}")])
        // 7.5 s of records: the 5 s warm-up, then 2.5 s measured.
        .args(["--rate", "2000", "--events", "15000", "--mode", "at-least-once"])
        .args(["--checkpoint-interval-ms", "100", "--json"])
        .arg(&json)
        .env("WEIR_LOG", "warn")
        .output()
        .unwrap();
    stop.store(true, Ordering::Release);
    let written = job.join().unwrap();
    let text = stdout_of_success("weir bench", &out);
    assert_eq!(written, 15000, "the test's job counted every input once");
    assert!(text.contains("external job  at-least-once"), "{text}");
    let row: serde_json::Value = serde_json::from_str(std::fs::read_to_string(&json).unwrap().trim()).unwrap();
    assert_eq!(row["engine"], "external", "{row}");
    assert_eq!(row["output_records"], 15000, "{row}");
    assert_eq!(row["duplicates"], 0, "{row}");
    assert!(row["trickle"].as_u64().is_some_and(|t| t >= 1), "{row}");
    let v = &row["visible_latency_us"];
    assert!(v["p50"].as_f64().is_some_and(|p| p > 0.0), "{row}");
    assert!(v["p99"].as_f64() >= v["p50"].as_f64(), "{row}");
    // Usage errors, before any broker is touched.
    for (args, why) in [
        (vec!["--external-job", "in", "--rate", "10"], "as IN:OUT"),
        (
            vec!["--external-job", "a:a", "--rate", "10"],
            "two different topic names",
        ),
        (vec!["--external-job", "a:b"], "give --rate"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
            .args(["bench", "--source", "kafka", "--sink", "kafka", "--mode", "aligned"])
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: a usage error");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(why), "{args:?}: {err}");
    }
}

/// `weir bench --source kafka --sink kafka` end to end on the test broker:
/// closed loop exactly once (the benchmark checks its own output and fails
/// on any loss or duplicate), then open loop at least once with the
/// platform probe's figures beside the visibility latency.
#[test]
fn the_kafka_benchmark_runs_and_checks_its_output() {
    let dir = tempfile::tempdir().unwrap();
    let bench = |extra: &[&str], json: &std::path::Path| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
            .args(["bench", "--source", "kafka", "--sink", "kafka", "--partitions", "2"])
            .args([
                "--brokers",
                &broker().addr,
                "--keys",
                "100",
                "--checkpoint-interval-ms",
                "20",
            ])
            .args(extra)
            .arg("--json")
            .arg(json)
            .output()
            .unwrap();
        let text = stdout_of_success("weir bench", &out);
        let row: serde_json::Value =
            serde_json::from_str(std::fs::read_to_string(json).unwrap().lines().last().unwrap()).unwrap();
        (text, row)
    };
    let (text, row) = bench(
        &["--mode", "aligned", "--events", "20000"],
        &dir.path().join("closed.json"),
    );
    assert!(text.contains("output 20000 (+0 dup)"), "{text}");
    assert_eq!(row["output_records"], 20000, "{row}");
    let closed_workers = row["workers"].as_u64().expect("workers in the JSON");
    assert!(row["platform_us"].is_null(), "closed loop: no probe by default: {row}");
    assert!(
        row["parts"].is_null(),
        "closed loop: no scheduled sends to measure parts from: {row}"
    );
    let (text, row) = bench(
        &["--mode", "at-least-once", "--rate", "4000", "--events", "12000"],
        &dir.path().join("open.json"),
    );
    assert!(text.contains("source to sink: p50"), "{text}");
    // Where the visible latency went, part by part; at-least-once has no
    // transactions.
    assert!(text.contains("parts p50 / p99 ms: generator→broker"), "{text}");
    for part in [
        "generator_to_broker_us",
        "broker_to_source_us",
        "source_to_sink_us",
        "sink_to_append_us",
        "append_to_visible_us",
    ] {
        assert!(
            row["parts"][part]["p50"].as_f64().is_some_and(|v| v >= 1.0),
            "{part}: {row}"
        );
    }
    assert!(row["parts"]["transaction_us"].is_null(), "{row}");
    // Open loop leaves a core to the broker beside the job.
    assert_eq!(
        row["workers"].as_u64(),
        Some(closed_workers.saturating_sub(1).max(1)),
        "{row}"
    );
    assert!(
        text.contains(&format!("workers={}", closed_workers.saturating_sub(1).max(1))),
        "{text}"
    );
    assert!(text.contains("platform p99"), "{text}");
    assert!(row["platform_us"]["p99"].as_f64().is_some(), "{row}");
    // The probe's description, with the hypervisor's share of the cores (Linux).
    assert!(row["platform_probe"]["policy"].is_string(), "{row}");
    if cfg!(target_os = "linux") {
        let steal = row["platform_probe"]["steal_pct"].as_f64();
        assert!(steal.is_some_and(|s| (0.0..=100.0).contains(&s)), "{row}");
        assert!(text.contains("(steal "), "{text}");
    }
    assert!(row["visible_latency_us"]["p50"].as_f64().unwrap() > 0.0, "{row}");
}

/// Polls `src` `max` records at a time until `until(backlog)` holds;
/// returns the records read meanwhile.
fn poll_until(h: &mut Harness, src: &mut Src, max: usize, what: &str, until: impl Fn(Option<u64>) -> bool) -> Vec<Rec> {
    use weir_core::Source;
    let mut all = Vec::new();
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    while !until(src.backlog()) {
        assert!(
            Instant::now() < deadline,
            "{what}: the lag is {:?} after {CLIENT_TIMEOUT:?}",
            src.backlog()
        );
        let mut out = Vec::new();
        h.poll_source(src, &mut out, max).unwrap();
        all.extend(out);
        std::thread::sleep(Duration::from_millis(2));
    }
    all
}

/// The source's lag (`Source::backlog`, the `weir_source_backlog` metric):
/// records behind the partitions' end, above 0 while records wait and 0
/// once all are read; bounded to the end offsets, unbounded to the high
/// watermarks the client saw in its fetches.
#[test]
fn the_lag_counts_the_records_behind_the_end_and_reaches_zero() {
    use weir_core::Source;
    const N: u64 = 2000;
    let topic = new_topic("lag", 2, N, 7);
    let b = broker();
    // Bounded: the lag is exact from the start (the end offsets).
    let bounded = KafkaSourceConfig::new(&b.addr, &topic).bounded();
    let mut h = Harness::new(0, 1);
    let mut src = source(&bounded, 0, 1);
    assert_eq!(src.backlog(), None, "not known before the setup");
    let first = poll_until(&mut h, &mut src, 1, "bounded, set up", |l| l.is_some());
    let lag = src.backlog().unwrap();
    assert_eq!(
        lag,
        N - first.len() as u64,
        "bounded: everything not read yet is behind"
    );
    let (rest, status) = drain_now(&mut h, &mut src, Duration::from_secs(30));
    assert_eq!(status, SourcePoll::Done);
    assert_eq!(first.len() + rest.len(), N as usize);
    assert_eq!(src.backlog(), Some(0), "a bounded source read to its end has no lag");
    // Unbounded: behind the high watermarks once the client has seen them,
    // while a few records a poll are read.
    let unbounded = KafkaSourceConfig::new(&b.addr, &topic);
    let mut h = Harness::new(0, 1);
    let mut src = source(&unbounded, 0, 1);
    let mut read = poll_until(&mut h, &mut src, 1, "unbounded, backlogged", |l| {
        l.is_some_and(|l| l > 0)
    });
    let lag = src.backlog().unwrap();
    assert!(lag <= N - read.len() as u64 + 1, "lag {lag} with {} read", read.len());
    read.extend(poll_until(&mut h, &mut src, 500, "unbounded, read to the end", |l| {
        l == Some(0)
    }));
    // Nothing is left: every record was read (and none twice).
    while read.len() < N as usize {
        let (more, _) = drain_now(&mut h, &mut src, Duration::from_millis(500));
        assert!(!more.is_empty(), "the lag is 0 with {} of {N} records read", read.len());
        read.extend(more);
    }
    assert_eq!(values(&read), (0..N).collect::<Vec<_>>());
    assert_eq!(src.backlog(), Some(0));
}

/// `examples/kafka_pipeline.rs`, the embedding example of the Kafka guide,
/// runs against this binary's broker: every input record counted once in
/// the output a `read_committed` reader sees.
#[test]
fn the_kafka_pipeline_example_counts_each_record_once() {
    // Examples are built beside the test binaries: target/<profile>/examples/.
    let exe = std::env::current_exe().expect("the test binary's path");
    let example = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps")
        .join("examples")
        .join(format!("kafka_pipeline{}", std::env::consts::EXE_SUFFIX));
    assert!(
        example.exists(),
        "cargo test builds the examples: {} is missing",
        example.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(&example)
        .arg(&broker().addr)
        .current_dir(dir.path())
        .output()
        .expect("run the kafka_pipeline example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the example failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // The example writes 10,000 records `sensor-{i % 10},{i % 7}`.
    assert!(
        stdout.contains("weir-example-out: 10000 committed records"),
        "one output record per input record:\n{stdout}"
    );
    for k in 0..10u64 {
        let sum: u64 = (0..10_000u64).filter(|i| i % 10 == k).map(|i| i % 7).sum();
        assert!(
            stdout.contains(&format!("sensor-{k}: 1000,{sum}")),
            "sensor-{k}'s final count and sum:\n{stdout}"
        );
    }
}
