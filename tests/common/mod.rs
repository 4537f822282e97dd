//! Shared by the checkpoint tests: a keyed job with injected failures, a
//! transactional test sink, and exact checks of its committed output.
//!
//! The sink here is transactional (output of epoch `n` becomes visible when
//! checkpoint `n` completes; pre-committed epochs are stored in the
//! checkpoint and committed again on restore, idempotently), so the
//! committed output shows whether state was exactly-once: for every key
//! with `n` input records, exactly the running counts `1..=n`, once each.

#![allow(dead_code)] // each test binary uses a part of this module

pub mod kafka;
pub mod runs;

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::de::DeserializeOwned;
use serde::Serialize;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use weir_core::{
    BoxError, CheckpointConfig, CheckpointMode, Pipeline, PreCommit, RestartStrategy, RuntimeConfig, Sink, SinkContext,
    SyncJob,
};
use weir_io::{GenContext, Generator, GeneratorConfig};

/// key, running count, running sum
pub type Row = (u64, u64, u64);

/// What a [`TxSink`] committed: the (subtask, epoch) transactions and
/// their records.
pub struct Target<T = Row> {
    pub committed: HashSet<(usize, u64)>,
    pub rows: Vec<T>,
}

impl<T> Default for Target<T> {
    fn default() -> Self {
        Target {
            committed: HashSet::new(),
            rows: Vec::new(),
        }
    }
}

/// A transactional test sink: output of epoch `n` becomes visible when
/// checkpoint `n` completes; recovery commits the pre-committed epochs
/// again, idempotently. Without checkpointing it commits at the end.
///
/// At every even checkpoint its pre-commit leaves a detached sync
/// ([`weir_core::PreCommit::sync`]) that marks the epoch durable; the sync
/// fails if it runs on a worker thread, and a commit fails if an epoch it
/// commits was pre-committed with a sync that has not run: so every job
/// that uses this sink checks that the runtime runs detached syncs off the
/// workers and acknowledges a checkpoint only after its syncs.
pub struct TxSink<T> {
    subtask: usize,
    open: Vec<T>,
    pending: BTreeMap<u64, Vec<T>>,
    target: Arc<Mutex<Target<T>>>,
    checkpointing: bool,
    /// Epochs pre-committed with a detached sync.
    detached: HashSet<u64>,
    /// Epochs whose detached sync ran.
    synced: Arc<Mutex<HashSet<u64>>>,
}

impl<T: Clone> TxSink<T> {
    pub fn new(subtask: usize, target: Arc<Mutex<Target<T>>>, checkpointing: bool) -> Self {
        TxSink {
            subtask,
            open: Vec::new(),
            pending: BTreeMap::new(),
            target,
            checkpointing,
            detached: HashSet::new(),
            synced: Arc::default(),
        }
    }

    fn commit_epoch(&self, epoch: u64, rows: &[T]) {
        let mut t = self.target.lock().unwrap();
        if t.committed.insert((self.subtask, epoch)) {
            t.rows.extend_from_slice(rows);
        }
    }
}

impl<T: Clone + Serialize + DeserializeOwned + Send + 'static> Sink<T> for TxSink<T> {
    fn write(&mut self, batch: &mut Vec<T>, _: &mut SinkContext<'_>) -> Result<(), BoxError> {
        self.open.append(batch);
        Ok(())
    }
    fn finish(&mut self, _: &mut SinkContext<'_>) -> Result<(), BoxError> {
        if !self.checkpointing {
            let rows = std::mem::take(&mut self.open);
            self.commit_epoch(u64::MAX, &rows);
        }
        Ok(())
    }
    fn pre_commit(&mut self, checkpoint: u64) -> Result<Vec<u8>, BoxError> {
        let rows = std::mem::take(&mut self.open);
        self.pending.insert(checkpoint, rows);
        // Everything not yet committed goes into the checkpoint.
        Ok(postcard::to_stdvec(&self.pending)?)
    }
    fn pre_commit_detached(&mut self, checkpoint: u64) -> Result<PreCommit, BoxError> {
        let state = self.pre_commit(checkpoint)?;
        if checkpoint.is_multiple_of(2) {
            self.detached.insert(checkpoint);
        }
        // Like a real sink, a job covers every pending epoch whose sync has
        // not run: the runtime drops the jobs of a checkpoint given up while
        // its task still held them (an unaligned one subsumed).
        let synced = Arc::clone(&self.synced);
        let epochs: Vec<u64> = {
            let done = synced.lock().unwrap();
            self.pending
                .keys()
                .copied()
                .filter(|e| self.detached.contains(e) && !done.contains(e))
                .collect()
        };
        if epochs.is_empty() {
            return Ok(PreCommit::done(state));
        }
        let sync: SyncJob = Box::new(move || {
            let thread = std::thread::current();
            let name = thread.name().unwrap_or("");
            if name.starts_with("weir-worker") {
                return Err(format!("the detached sync of checkpoint {checkpoint} ran on {name}").into());
            }
            synced.lock().unwrap().extend(epochs);
            Ok(())
        });
        Ok(PreCommit::with_sync(state, sync))
    }
    fn commit(&mut self, checkpoint: u64) -> Result<(), BoxError> {
        let done: Vec<u64> = self.pending.range(..=checkpoint).map(|(&e, _)| e).collect();
        let synced = self.synced.lock().unwrap();
        if let Some(e) = done.iter().find(|e| self.detached.contains(e) && !synced.contains(e)) {
            return Err(format!("checkpoint {checkpoint} commits epoch {e} before its detached sync ran").into());
        }
        drop(synced);
        for e in done {
            let rows = self.pending.remove(&e).unwrap();
            self.commit_epoch(e, &rows);
        }
        Ok(())
    }
    fn restore(&mut self, _checkpoint: u64, state: &[u8]) -> Result<(), BoxError> {
        let pending: BTreeMap<u64, Vec<T>> = postcard::from_bytes(state)?;
        for (e, rows) in pending {
            self.commit_epoch(e, &rows);
        }
        Ok(())
    }
}

/// Makes a map operator panic after a pseudo-random number of records,
/// `failures` times in all.
#[derive(Clone)]
struct Chaos {
    seen: Arc<AtomicU64>,
    next_failure: Arc<AtomicU64>,
    failures_left: Arc<AtomicU32>,
    seed: u64,
}

impl Chaos {
    fn new(failures: u32, seed: u64) -> Self {
        let c = Chaos {
            seen: Arc::new(AtomicU64::new(0)),
            next_failure: Arc::new(AtomicU64::new(0)),
            failures_left: Arc::new(AtomicU32::new(failures)),
            seed,
        };
        c.next_failure.store(c.gap(failures), Ordering::Relaxed);
        c
    }
    fn gap(&self, k: u32) -> u64 {
        // 2_000..12_000 records between failures.
        2_000 + weir_io::generator::splitmix64(self.seed ^ u64::from(k)) % 10_000
    }
    fn tick(&self) {
        let n = self.seen.fetch_add(1, Ordering::Relaxed) + 1;
        if n == self.next_failure.load(Ordering::Relaxed) {
            let left = self.failures_left.load(Ordering::Relaxed);
            if left > 0 {
                self.failures_left.store(left - 1, Ordering::Relaxed);
                self.next_failure.store(n + self.gap(left), Ordering::Relaxed);
                panic!("injected failure after {n} records");
            }
        }
    }
}

pub struct Outcome {
    pub rows: Vec<Row>,
    pub restarts: usize,
    /// Why each restart happened.
    pub restart_errors: Vec<String>,
    pub completed: u64,
    pub failed: u64,
    pub channel_state_bytes: u64,
}

#[derive(Clone, Copy)]
pub struct Job {
    pub mode: CheckpointMode,
    pub events: u64,
    pub keys: u64,
    pub failures: u32,
    /// A second, slower source joined by union (uneven input speeds).
    pub union_slow: bool,
    /// A slow operator after the exchange (backpressure), µs per record.
    pub slow_us: u64,
    pub ring: usize,
    /// Records per second of the main source.
    pub rate: f64,
    /// Parallelism of the main source (1: every keyed task has one input).
    pub sources: usize,
    /// An extra operator before the exchange: another job graph.
    pub extra_map: bool,
    /// Parallelism of the keyed operator.
    pub keyed: usize,
    /// A `rebalance(2)` between the keyed operator and the sink, so that
    /// the keyed parallelism can change without the sink's.
    pub rebalance_sink: bool,
    /// A keyed stage before the count, keyed by the record's value (so
    /// that every count subtask reads from every one of its subtasks),
    /// passing records on unchanged: the count then reads an exchange
    /// written by a chain that reads rings itself.
    pub second_stage: bool,
}

pub const BASE: Job = Job {
    mode: CheckpointMode::Aligned,
    events: 40_000,
    keys: 50,
    failures: 3,
    union_slow: false,
    slow_us: 0,
    ring: 256,
    rate: 400_000.0,
    sources: 2,
    extra_map: false,
    keyed: 2,
    rebalance_sink: false,
    second_stage: false,
};

fn key_of(c: &GenContext, keys: u64) -> u64 {
    c.random % keys
}

pub fn run(job: Job, dir: &std::path::Path) -> Outcome {
    let target = Arc::new(Mutex::new(Target::default()));
    let result = run_with(job, dir, &target, |_| {}).unwrap();
    let stats = &result.metrics.checkpoints;
    let rows = std::mem::take(&mut target.lock().unwrap().rows);
    Outcome {
        rows,
        restarts: stats.restarts.len(),
        restart_errors: stats.restarts.iter().map(|r| r.error.clone()).collect(),
        completed: stats.completed,
        failed: stats.failed,
        channel_state_bytes: stats.history.iter().map(|r| r.channel_state_bytes).sum(),
    }
}

/// Runs `job` into `target`, with `tweak` applied to the configuration.
pub fn run_with(
    job: Job,
    dir: &std::path::Path,
    target: &Arc<Mutex<Target>>,
    tweak: impl FnOnce(&mut RuntimeConfig),
) -> weir_core::Result<weir_core::JobResult> {
    let chaos = Chaos::new(job.failures, job.events);
    let p = Pipeline::new("ckpt-test");
    let keys = job.keys;
    let gen = |rate: f64, events: u64, seed: u64| GeneratorConfig {
        seed,
        events: Some(events),
        rate: Some(rate),
        start_ns: None,
    };
    let fast = gen(job.rate, job.events, 1);
    let mut stream = p.source("fast", job.sources, move |i, n| {
        Generator::new(fast, i, n, move |c: GenContext| (key_of(&c, keys), c.seq)).unwrap()
    });
    if job.union_slow {
        let slow = gen(40_000.0, job.events / 10, 2);
        let other = p.source("slow", 1, move |i, n| {
            Generator::new(slow, i, n, move |c: GenContext| {
                (key_of(&c, keys), 1_000_000_000 + c.seq)
            })
            .unwrap()
        });
        stream = stream.union(vec![other]);
    }
    let ch = chaos.clone();
    let slow_us = job.slow_us;
    let t = target.clone();
    if job.extra_map {
        stream = stream.map(|r: (u64, u64)| r).name("extra");
    }
    let mut stream = stream
        .map(move |r: (u64, u64)| {
            ch.tick();
            r
        })
        .name("chaos");
    if job.second_stage {
        stream = stream
            .key_by(|r: &(u64, u64)| r.1 % 7)
            .parallelism(job.keyed)
            .process(|_: &u64, seen: &mut u64, r: (u64, u64), out| {
                *seen += 1;
                out.emit(r);
            })
            .name("first-stage");
    }
    let counted = stream
        .key_by(|r: &(u64, u64)| r.0)
        .parallelism(job.keyed)
        .process(move |k: &u64, st: &mut [u64; 2], (_, v): (u64, u64), out| {
            if slow_us > 0 {
                let t0 = std::time::Instant::now();
                while t0.elapsed() < Duration::from_micros(slow_us) {
                    std::hint::spin_loop();
                }
            }
            st[0] += 1;
            st[1] = st[1].wrapping_add(v);
            out.emit((*k, st[0], st[1]));
        })
        .name("count");
    let counted = if job.rebalance_sink {
        counted.rebalance(2)
    } else {
        counted
    };
    counted.sink("tx", move |i| TxSink::new(i, t.clone(), true));
    let config = RuntimeConfig {
        workers: 2,
        ring_capacity: job.ring,
        checkpointing: Some(CheckpointConfig {
            interval: Duration::from_millis(5),
            timeout: Duration::from_secs(20),
            ..CheckpointConfig::new(job.mode, dir)
        }),
        restart: RestartStrategy::FixedDelay {
            attempts: 20,
            delay: Duration::from_millis(1),
        },
        ..RuntimeConfig::default()
    };
    let mut config = config;
    tweak(&mut config);
    p.run(config)?.join()
}

/// The keyed running count of `job`'s main source (no injected failures,
/// no second source), with state in the memory-mapped backend: for tests
/// that add their own sink; [`expected`] and the checks below apply.
pub fn keyed_counts(p: &Pipeline, job: Job) -> weir_core::Stream<Row> {
    let keys = job.keys;
    let cfg = generator(job);
    let keyed = p
        .source("fast", job.sources, move |i, n| {
            Generator::new(cfg, i, n, move |c: GenContext| (key_of(&c, keys), c.seq)).unwrap()
        })
        .key_by(|r: &(u64, u64)| r.0);
    running_count(keyed.parallelism(job.keyed))
}

/// The generator of `job`'s main source: seed 1, its events at its rate.
pub fn generator(job: Job) -> GeneratorConfig {
    GeneratorConfig {
        seed: 1,
        events: Some(job.events),
        rate: Some(job.rate),
        start_ns: None,
    }
}

/// Per key, the running count and sum of the values (state in the
/// memory-mapped backend), named `count`: the rows the checks below expect.
pub fn running_count<KF>(keyed: weir_core::KeyedStream<(u64, u64), u64, KF>) -> weir_core::Stream<Row>
where
    KF: Fn(&(u64, u64)) -> u64 + Clone + Send + 'static,
{
    keyed
        .process(move |k: &u64, st: &mut [u64; 2], (_, v): (u64, u64), out| {
            st[0] += 1;
            st[1] = st[1].wrapping_add(v);
            out.emit((*k, st[0], st[1]));
        })
        .name("count")
}

/// A sink's line for a [`Row`]: `key,count,sum`.
pub fn row_line(r: &Row, out: &mut Vec<u8>) {
    use std::io::Write;
    writeln!(out, "{},{},{}", r.0, r.1, r.2).unwrap();
}

/// The rows of `key,count,sum` lines, and how many lines were not such.
pub fn parse_rows(text: &str) -> (Vec<Row>, usize) {
    let mut rows = Vec::new();
    let mut garbage = 0;
    for l in text.lines() {
        let v: Vec<Option<u64>> = l.split(',').map(|x| x.parse().ok()).collect();
        match v.as_slice() {
            [Some(k), Some(c), Some(s)] => rows.push((*k, *c, *s)),
            _ => garbage += 1,
        }
    }
    (rows, garbage)
}

/// Expected per-key record counts and sums of values, computed directly.
pub fn expected(job: Job) -> HashMap<u64, (u64, u64)> {
    let mut m: HashMap<u64, (u64, u64)> = HashMap::new();
    let mut add = |events: u64, seed: u64, offset: u64| {
        for seq in 0..events {
            let c = GenContext {
                seq,
                random: weir_io::generator::splitmix64(seq ^ weir_io::generator::splitmix64(seed)),
                emitted_ns: 0,
            };
            let e = m.entry(key_of(&c, job.keys)).or_default();
            e.0 += 1;
            e.1 = e.1.wrapping_add(offset + seq);
        }
    };
    add(job.events, 1, 0);
    if job.union_slow {
        add(job.events / 10, 2, 1_000_000_000);
    }
    m
}

/// Exactly once: per key, counts 1..=n each exactly once, and the last sum right.
pub fn assert_exactly_once(job: Job, rows: &[Row]) {
    let exp = expected(job);
    let mut by_key: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
    for &(k, c, s) in rows {
        by_key.entry(k).or_default().push((c, s));
    }
    assert_eq!(by_key.len(), exp.len(), "keys with output");
    for (k, (n, sum)) in exp {
        let mut got = by_key.remove(&k).unwrap_or_default();
        got.sort();
        let counts: Vec<u64> = got.iter().map(|r| r.0).collect();
        assert_eq!(counts, (1..=n).collect::<Vec<_>>(), "key {k}: counts");
        assert_eq!(got.last().unwrap().1, sum, "key {k}: final sum");
    }
}

/// At least once: every count 1..=n of the failure-free run appears.
pub fn assert_no_loss(job: Job, rows: &[Row]) -> u64 {
    let exp = expected(job);
    let mut by_key: HashMap<u64, HashSet<u64>> = HashMap::new();
    for &(k, c, _) in rows {
        by_key.entry(k).or_default().insert(c);
    }
    let mut duplicates = 0;
    for (k, (n, _)) in exp {
        let got = by_key.remove(&k).unwrap_or_default();
        for c in 1..=n {
            assert!(got.contains(&c), "key {k}: count {c} missing");
        }
        duplicates += got.len() as u64 - n;
    }
    duplicates
}
