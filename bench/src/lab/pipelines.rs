//! The benchmark jobs of `weir bench`, built with the public API exactly as
//! a user would build them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use weir_core::{BoxError, Pipeline, PreCommit, Sink, SinkContext};
use weir_io::{GenContext, Generator, GeneratorConfig};

use crate::lab::event::Event;

/// Which benchmark job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// generator -> map -> filter -> counting sink (all chained).
    Stateless,
    /// generator -> key_by -> running sum per key -> counting sink.
    Keyed,
    /// Nexmark q0 (passthrough) over the in-process generator.
    NexmarkQ0,
    /// Nexmark q1 (currency conversion).
    NexmarkQ1,
    /// Nexmark q2 (selection).
    NexmarkQ2,
    /// Nexmark q3 (local item suggestion: join).
    NexmarkQ3,
    /// Nexmark q4 (average price per category).
    NexmarkQ4,
    /// Nexmark q5 (hot items: sliding windows).
    NexmarkQ5,
    /// Nexmark q6 (average selling price by seller).
    NexmarkQ6,
    /// Nexmark q7 (highest bid: tumbling windows).
    NexmarkQ7,
    /// Nexmark q8 (monitor new users: person and auction in one window).
    NexmarkQ8,
}

impl Kind {
    /// The name used in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Stateless => "stateless",
            Kind::Keyed => "keyed",
            Kind::NexmarkQ0 => "nexmark-q0",
            Kind::NexmarkQ1 => "nexmark-q1",
            Kind::NexmarkQ2 => "nexmark-q2",
            Kind::NexmarkQ3 => "nexmark-q3",
            Kind::NexmarkQ4 => "nexmark-q4",
            Kind::NexmarkQ5 => "nexmark-q5",
            Kind::NexmarkQ6 => "nexmark-q6",
            Kind::NexmarkQ7 => "nexmark-q7",
            Kind::NexmarkQ8 => "nexmark-q8",
        }
    }

    /// The Nexmark query of a Nexmark job.
    pub fn nexmark(self) -> Option<crate::cmd::nexmark::Query> {
        use crate::cmd::nexmark::Query;
        Some(match self {
            Kind::Stateless | Kind::Keyed => return None,
            Kind::NexmarkQ0 => Query::Q0,
            Kind::NexmarkQ1 => Query::Q1,
            Kind::NexmarkQ2 => Query::Q2,
            Kind::NexmarkQ3 => Query::Q3,
            Kind::NexmarkQ4 => Query::Q4,
            Kind::NexmarkQ5 => Query::Q5,
            Kind::NexmarkQ6 => Query::Q6,
            Kind::NexmarkQ7 => Query::Q7,
            Kind::NexmarkQ8 => Query::Q8,
        })
    }

    /// How many records reach the sink for `events` generated, when known
    /// in advance.
    pub fn expected_output(self, events: u64) -> Option<u64> {
        let bids = |n: u64| n / 50 * 46 + (n % 50).saturating_sub(4);
        match self {
            // The filter drops sequence numbers 15, 31, 47, ...
            Kind::Stateless => Some(events - events / 16),
            Kind::Keyed => Some(events),
            // Events 4..50 of every block of 50 are bids.
            Kind::NexmarkQ0 | Kind::NexmarkQ1 => Some(bids(events)),
            _ => None,
        }
    }
}

/// Parameters of one benchmark run.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The job.
    pub kind: Kind,
    /// Records generated in total.
    pub events: u64,
    /// Records per second in total, or full speed.
    pub rate: Option<f64>,
    /// Distinct keys.
    pub keys: u64,
    /// Parallelism of every operator.
    pub parallelism: usize,
    /// Generator seed.
    pub seed: u64,
    /// Keyed only: a slow operator after the keyed one, spinning this many
    /// nanoseconds per record (the backpressure scenario); 0 for none.
    pub slow_ns: u64,
    /// Keyed only: where the running sums live.
    pub state: StateBackend,
    /// Keyed only: keyed operators one after another (at least 1), each
    /// behind an exchange by a key of its own ([`stage_key`]).
    pub stages: usize,
    /// The sink records go through after being counted.
    pub sink: SinkKind,
    /// Folder for the sink's output (files, WAL, database).
    pub sink_dir: std::path::PathBuf,
    /// Open loop: the records scheduled in the first this-many milliseconds
    /// are the warm-up, processed but left out of the latency figures
    /// ([`Spec::warmup_records`]).
    pub warmup_ms: u64,
    /// Keyed only: the keyed function panics once on this record
    /// (`weir bench --fail-at-record`), measured by the probe.
    pub failure: Option<Arc<crate::lab::failure::FailureProbe>>,
}

/// The open-loop warm-up of `weir bench` and `weir compare`, in ms: the job
/// starts its threads, opens its sinks and maps its state while the
/// generator's schedule has begun, and the first records wait for that, a
/// start-up cost that would otherwise be read as the steady state's p99.9.
/// On a loaded 2-core guest the worker first ran 126 ms after the
/// schedule's start, and records were late until 147 ms
/// (docs/notebook/benchmarks-2026-12.md, "How the figures are produced").
pub const DEFAULT_WARMUP_MS: u64 = 200;

impl Spec {
    /// Open loop: the records scheduled in the first [`Spec::warmup_ms`],
    /// at most a quarter of the run, stamped "unknown" (0) so that no sink
    /// records their latency; closed loop: none.
    pub fn warmup_records(&self) -> u64 {
        match self.rate {
            Some(rate) if self.kind.nexmark().is_none() => {
                ((rate * self.warmup_ms as f64 / 1e3) as u64).min(self.events / 4)
            }
            _ => 0,
        }
    }
}

/// Which real sink the benchmark writes through, after counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SinkKind {
    /// Count only: nothing leaves the process.
    Count,
    /// Lines appended to files at once (at-least-once; visible at once).
    Direct,
    /// Write-ahead log, committed to files at checkpoints (exactly-once).
    Wal,
    /// Two-phase commit into files (exactly-once).
    #[value(name = "2pc-file")]
    #[serde(rename = "2pc-file")]
    TwoPcFile,
    /// Two-phase commit into SQLite (exactly-once).
    Sqlite,
    /// Idempotent upsert by key into SQLite (visible at write; effectively
    /// once for the latest value per key, which is what the keyed job's
    /// running sums are).
    Upsert,
    /// A Kafka topic (only with `--source kafka`; at-least-once or
    /// exactly-once by the checkpoint mode).
    Kafka,
}

impl SinkKind {
    /// The name in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            SinkKind::Count => "count",
            SinkKind::Direct => "direct",
            SinkKind::Wal => "wal",
            SinkKind::TwoPcFile => "2pc-file",
            SinkKind::Sqlite => "sqlite",
            SinkKind::Upsert => "upsert",
            SinkKind::Kafka => "kafka",
        }
    }
}

/// Where a keyed benchmark keeps its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StateBackend {
    /// Memory-mapped pages (`process`): asynchronous incremental snapshots.
    Mapped,
    /// In-memory hash map (`process_heap`): full snapshots at the barrier.
    Heap,
}

/// Busy-waits `ns` nanoseconds (a slow operator's work).
fn spin_for(ns: u64) {
    let start = weir_core::clock::now_ns();
    while weir_core::clock::now_ns() - start < ns {
        std::hint::spin_loop();
    }
}

/// Counts records and records their processing latency (one histogram
/// update per run of records with the same emission stamp), then hands
/// them to an inner sink, if any, which records visibility latency.
pub struct CountSink {
    count: u64,
    checksum: u64,
    total: Arc<AtomicU64>,
    total_checksum: Arc<AtomicU64>,
    inner: Option<Box<dyn Sink<Event>>>,
    /// A failure run's probe, with this sink's subtask.
    failure: Option<(Arc<crate::lab::failure::FailureProbe>, usize)>,
    /// The count at the last pre-commit, with its checkpoint.
    pre_committed: (u64, u64),
    /// The count at the last completed checkpoint.
    committed: u64,
    finished: bool,
    /// The failure probe is told of visible output (set once per instance:
    /// a restarted attempt's task starts without the tap).
    tapped: bool,
}

impl CountSink {
    /// A sink adding its final count and checksum into the shared totals.
    pub fn new(total: Arc<AtomicU64>, total_checksum: Arc<AtomicU64>) -> Self {
        CountSink {
            count: 0,
            checksum: 0,
            total,
            total_checksum,
            inner: None,
            failure: None,
            pre_committed: (0, 0),
            committed: 0,
            finished: false,
            tapped: false,
        }
    }

    /// In a failure run, has the probe told of what the inner sink makes
    /// visible.
    fn tap(&mut self, ctx: &mut SinkContext<'_>) {
        if self.tapped {
            return;
        }
        self.tapped = true;
        if let (Some((probe, _)), Some(_)) = (&self.failure, &self.inner) {
            let probe = probe.clone();
            ctx.tap_visible(Some(Arc::new(move |subtask, now, emitted, n| {
                probe.on_visible(subtask, now, emitted, n)
            })));
        }
    }

    /// A failure run keeps the count in the checkpoint, before the inner
    /// sink's state (if any), so that the restarted job counts on from it.
    fn keeps_count(&self) -> bool {
        self.failure.is_some()
    }

    /// Reports batch arrivals and abandoned work to a failure run's probe,
    /// as sink subtask `subtask`.
    pub fn with_failure(mut self, probe: Arc<crate::lab::failure::FailureProbe>, subtask: usize) -> Self {
        self.failure = Some((probe, subtask));
        self
    }

    /// The count sink's own checkpoint state: count and checksum.
    fn state(&self) -> Vec<u8> {
        let mut s = Vec::with_capacity(16);
        s.extend_from_slice(&self.count.to_le_bytes());
        s.extend_from_slice(&self.checksum.to_le_bytes());
        s
    }

    /// Also writes every record through `inner`.
    pub fn with_inner(mut self, inner: Box<dyn Sink<Event>>) -> Self {
        self.inner = Some(inner);
        self
    }
}

/// Keyed operators one after another at most (`weir bench --stages`).
pub const MAX_STAGES: usize = 8;

/// One stage of the keyed job: a running sum of the values per key, each
/// record emitted with its key's sum; with `probe`, the failure run's probe
/// sees every record first.
fn sum_stage<KF>(
    keyed: weir_core::KeyedStream<Event, u64, KF>,
    state: StateBackend,
    probe: Option<crate::lab::failure::FailingFn>,
) -> weir_core::Stream<Event>
where
    KF: Fn(&Event) -> u64 + Clone + Send + 'static,
{
    let running_sum = |_key: &u64, sum: &mut u64, e: Event, out: &mut weir_core::Output<Event>| {
        *sum = sum.wrapping_add(e.value);
        out.emit(Event { value: *sum, ..e });
    };
    match (state, probe) {
        (StateBackend::Mapped, None) => keyed.process(running_sum),
        (StateBackend::Heap, None) => keyed.process_heap(running_sum),
        (state, Some(probe)) => {
            let failing = move |key: &u64, sum: &mut u64, e: Event, out: &mut weir_core::Output<Event>| {
                probe.on_record(e.seq);
                running_sum(key, sum, e, out)
            };
            match state {
                StateBackend::Mapped => keyed.process(failing),
                StateBackend::Heap => keyed.process_heap(failing),
            }
        }
    }
}

/// The key of stage `stage` (2 and up) of the keyed job: the record's key
/// mixed with the stage (a multiply-xorshift), so that a record's subtask
/// in one stage says nothing of its subtask in the next.
pub fn stage_key(key: u64, stage: usize) -> u64 {
    let x = (key ^ (stage as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^ (x >> 31)
}

/// One output line per event: `key,value,seq` (about 32 bytes).
fn encode_line(e: &Event, out: &mut Vec<u8>) {
    weir_io::text::Line::new(out).u64(e.key).u64(e.value).u64(e.seq).end();
}

fn emitted(e: &Event) -> u64 {
    e.emitted_ns
}

/// The real sink of `kind` for subtask `i`, writing under `dir`.
pub fn real_sink(kind: SinkKind, dir: &std::path::Path, i: usize) -> Option<Box<dyn Sink<Event>>> {
    Some(match kind {
        SinkKind::Count => return None,
        // lab::bench::run sends every run with a Kafka sink to kafka_bench,
        // which builds its own job; the generator jobs never get here with it.
        SinkKind::Kafka => unreachable!("a Kafka sink runs in the Kafka benchmark (kafka_bench)"),
        SinkKind::Direct => Box::new(weir_io::DirectFileSink::new(dir.join("out"), i, encode_line, emitted)),
        SinkKind::Wal => {
            let config = weir_io::WalSinkConfig::new(dir.join("wal"), dir.join("out"));
            Box::new(weir_io::WalSink::new(config, i, encode_line, emitted))
        }
        SinkKind::TwoPcFile => Box::new(weir_io::two_phase_file_sink(dir.join("out"), i, encode_line, emitted)),
        SinkKind::Sqlite => {
            let table = weir_io::SqliteTable::new(dir.join("out.db"), "events", &["key", "value", "seq"])
                .create("CREATE TABLE IF NOT EXISTS events (key INTEGER, value INTEGER, seq INTEGER)");
            Box::new(weir_io::two_phase_sqlite_sink(
                table,
                i,
                |e: &Event, row: &mut weir_io::SqlRow<'_, '_>| {
                    row.push(e.key as i64).push(e.value as i64).push(e.seq as i64);
                },
                emitted,
            ))
        }
        SinkKind::Upsert => {
            // The latest running sum per key: one row per key.
            let table = weir_io::SqliteTable::new(dir.join("out.db"), "events", &["key", "value", "seq"])
                .key(&["key"])
                .create("CREATE TABLE IF NOT EXISTS events (key INTEGER PRIMARY KEY, value INTEGER, seq INTEGER)");
            Box::new(weir_io::SqliteUpsertSink::new(
                table,
                i,
                |e: &Event, row: &mut weir_io::SqlRow<'_, '_>| {
                    row.push(e.key as i64).push(e.value as i64).push(e.seq as i64);
                },
                emitted,
            ))
        }
    })
}

/// Records `run` latencies stamped `stamp`, unless the stamp is 0 (unknown:
/// the warm-up).
#[inline]
fn record_known(ctx: &mut SinkContext<'_>, stamp: u64, run: u64) {
    if stamp != 0 {
        ctx.record_latency_n(stamp, run);
    }
}

impl Sink<Event> for CountSink {
    #[inline]
    fn write(&mut self, batch: &mut Vec<Event>, ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
        let Some(first) = batch.first() else {
            return Ok(());
        };
        if self.failure.is_some() {
            self.tap(ctx);
        }
        let mut stamp = first.emitted_ns;
        let first_stamp = stamp;
        let mut run = 0u64;
        let mut checksum = self.checksum;
        for e in batch.iter() {
            checksum = checksum.wrapping_add(e.value);
            if e.emitted_ns == stamp {
                run += 1;
            } else {
                record_known(ctx, stamp, run);
                stamp = e.emitted_ns;
                run = 1;
            }
        }
        record_known(ctx, stamp, run);
        if let Some((probe, subtask)) = &self.failure {
            probe.on_batch(*subtask, weir_core::clock::now_ns(), first_stamp, batch.len() as u64);
        }
        self.checksum = checksum;
        self.count += batch.len() as u64;
        match &mut self.inner {
            Some(inner) => inner.write(batch, ctx)?,
            None => batch.clear(),
        }
        Ok(())
    }

    fn open(&mut self, ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
        if self.failure.is_some() {
            self.tap(ctx);
        }
        self.inner.as_mut().map_or(Ok(()), |s| s.open(ctx))
    }

    fn ready(&mut self, ctx: &mut SinkContext<'_>) -> Result<bool, BoxError> {
        self.inner.as_mut().map_or(Ok(true), |s| s.ready(ctx))
    }

    fn finish(&mut self, ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
        if let Some(inner) = &mut self.inner {
            inner.finish(ctx)?;
        }
        self.total.fetch_add(self.count, Ordering::Relaxed);
        self.total_checksum.fetch_add(self.checksum, Ordering::Relaxed);
        self.finished = true;
        Ok(())
    }

    fn pre_commit(&mut self, checkpoint: u64) -> Result<Vec<u8>, BoxError> {
        self.pre_commit_detached(checkpoint)?.wait()
    }

    fn pre_commit_detached(&mut self, checkpoint: u64) -> Result<PreCommit, BoxError> {
        self.pre_committed = (checkpoint, self.count);
        let keeps = self.keeps_count();
        let mut state = if keeps { self.state() } else { Vec::new() };
        match &mut self.inner {
            None => Ok(PreCommit::done(state)),
            Some(s) => {
                let inner = s.pre_commit_detached(checkpoint)?;
                if !keeps {
                    return Ok(inner);
                }
                // The count, then the inner sink's state, once its work is
                // done (off the worker, where it has any).
                if inner.is_detached() {
                    Ok(PreCommit::deferred(Box::new(move || {
                        state.extend_from_slice(&inner.wait()?);
                        Ok(state)
                    })))
                } else {
                    state.extend_from_slice(&inner.wait()?);
                    Ok(PreCommit::done(state))
                }
            }
        }
    }

    fn commit(&mut self, checkpoint: u64) -> Result<(), BoxError> {
        if self.pre_committed.0 == checkpoint {
            self.committed = self.pre_committed.1;
        }
        self.inner.as_mut().map_or(Ok(()), |s| s.commit(checkpoint))
    }

    fn abort(&mut self, checkpoint: u64) -> Result<(), BoxError> {
        self.inner.as_mut().map_or(Ok(()), |s| s.abort(checkpoint))
    }

    fn restore(&mut self, checkpoint: u64, state: &[u8]) -> Result<(), BoxError> {
        if !self.keeps_count() {
            return self.inner.as_mut().map_or(Ok(()), |s| s.restore(checkpoint, state));
        }
        let (count, checksum, rest) = match state.len() {
            0 => (0, 0, state),
            n if n >= 16 && (n == 16 || self.inner.is_some()) => (
                u64::from_le_bytes(state[..8].try_into().expect("8 bytes")),
                u64::from_le_bytes(state[8..16].try_into().expect("8 bytes")),
                &state[16..],
            ),
            n => {
                return Err(format!(
                    "checkpoint {checkpoint}: the count sink's state is {n} bytes, expected 16 (and the inner \
                     sink's after them)"
                )
                .into())
            }
        };
        self.count = count;
        self.checksum = checksum;
        self.committed = count;
        self.inner.as_mut().map_or(Ok(()), |s| s.restore(checkpoint, rest))
    }
}

/// A failure run's sink subtask that ends without finishing (its attempt
/// failed) reports what it had received since its last completed
/// checkpoint: the restarted job delivers that again.
impl Drop for CountSink {
    fn drop(&mut self) {
        if let (false, Some((probe, subtask))) = (self.finished, &self.failure) {
            probe.on_abandoned(*subtask, self.count.saturating_sub(self.committed));
        }
    }
}

/// Shared totals the sinks report into when they finish.
#[derive(Debug, Default, Clone)]
pub struct Totals {
    /// Records that reached the sinks.
    pub count: Arc<AtomicU64>,
    /// Wrapping sum of the values that reached the sinks.
    pub checksum: Arc<AtomicU64>,
}

/// Builds the job for `spec`; the generator's schedule starts at `start_ns`.
pub fn build(spec: &Spec, start_ns: u64, totals: &Totals) -> Pipeline {
    if let Some(q) = spec.kind.nexmark() {
        return crate::lab::nexmark_jobs::bench_pipeline(
            q,
            spec.events,
            spec.seed,
            spec.parallelism,
            totals.count.clone(),
        );
    }
    let gen = GeneratorConfig {
        seed: spec.seed,
        events: Some(spec.events),
        rate: spec.rate,
        start_ns: Some(start_ns),
    };
    let keys = spec.keys;
    let p = spec.parallelism;
    let warmup = spec.warmup_records();
    let pipeline = Pipeline::new(&format!("bench-{}", spec.kind.name()));
    let events = pipeline.source("generator", p, move |i, p| {
        Generator::new(gen, i, p, move |c: GenContext| Event {
            // Multiply-shift maps the random word uniformly onto 0..keys
            // without a division.
            key: ((u128::from(c.random) * u128::from(keys)) >> 64) as u64,
            value: c.seq,
            // 0: unknown, not measured (the warm-up).
            emitted_ns: if c.seq < warmup { 0 } else { c.emitted_ns },
            seq: c.seq,
        })
        .expect("generator settings are validated before the job is built")
    });
    let (count, checksum) = (totals.count.clone(), totals.checksum.clone());
    let (sink_kind, sink_dir) = (spec.sink, spec.sink_dir.clone());
    let failure = spec.failure.clone();
    let sink = move |i| {
        let mut s = CountSink::new(count.clone(), checksum.clone());
        if let Some(probe) = &failure {
            probe.on_sink_built();
            s = s.with_failure(probe.clone(), i);
        }
        match real_sink(sink_kind, &sink_dir, i) {
            Some(inner) => s.with_inner(inner),
            None => s,
        }
    };
    match spec.kind {
        Kind::Stateless => events
            .map(|e: Event| Event {
                value: e.value.wrapping_mul(3).wrapping_add(1),
                ..e
            })
            .filter(|e: &Event| e.seq % 16 != 15)
            .sink("count", sink),
        Kind::Keyed => {
            let slow_ns = spec.slow_ns;
            // One exchange and running sum per stage, keyed differently
            // from the second on so that every stage's records cross
            // subtasks. A failure run's probe sees every record of its
            // stage (`weir bench --fail-stage`, the first by default: the
            // farthest from the sink, whose output every later stage
            // reads). Dedup recovers the failed subtask alone in any stage;
            // the snapshot modes restart the whole job wherever it is.
            let failing = |stage: usize| {
                spec.failure
                    .clone()
                    .filter(|f| stage == f.stage.min(spec.stages))
                    .map(crate::lab::failure::FailingFn::new)
            };
            let mut summed =
                sum_stage(events.key_by(|e: &Event| e.key).parallelism(p), spec.state, failing(1)).name("running-sum");
            for stage in 2..=spec.stages {
                let keyed = summed.key_by(move |e: &Event| stage_key(e.key, stage)).parallelism(p);
                summed = sum_stage(keyed, spec.state, failing(stage)).name(&format!("running-sum-{stage}"));
            }
            if slow_ns > 0 {
                summed
                    .map(move |e: Event| {
                        spin_for(slow_ns);
                        e
                    })
                    .name("slow")
                    .sink("count", sink)
            } else {
                summed.sink("count", sink)
            }
        }
        _ => unreachable!("Nexmark jobs are built above"),
    }
    pipeline
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(rate: Option<f64>, events: u64, warmup_ms: u64) -> Spec {
        Spec {
            kind: Kind::Keyed,
            events,
            rate,
            keys: 10,
            parallelism: 1,
            seed: 1,
            slow_ns: 0,
            state: StateBackend::Heap,
            stages: 1,
            sink: SinkKind::Count,
            sink_dir: std::path::PathBuf::new(),
            warmup_ms,
            failure: None,
        }
    }

    /// The warm-up is the schedule's first `warmup_ms` in open loop, at most
    /// a quarter of the run, and nothing in closed loop.
    #[test]
    fn the_warm_up_covers_the_schedule_s_first_milliseconds() {
        assert_eq!(spec(Some(200_000.0), 1_000_000, 100).warmup_records(), 20_000);
        assert_eq!(
            spec(Some(200_000.0), 1_000_000, DEFAULT_WARMUP_MS).warmup_records(),
            40_000
        );
        assert_eq!(spec(Some(200_000.0), 40_000, 100).warmup_records(), 10_000);
        assert_eq!(spec(Some(200_000.0), 1_000_000, 0).warmup_records(), 0);
        assert_eq!(spec(None, 1_000_000, 100).warmup_records(), 0);
    }

    /// The counting sink counts every record but records no latency for a
    /// stamp of 0 (unknown: the warm-up's records).
    #[test]
    fn the_counting_sink_leaves_unknown_stamps_out_of_the_latency() {
        let (count, checksum) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let mut sink = CountSink::new(count.clone(), checksum);
        let mut h = weir_core::harness::Harness::new(0, 1);
        let now = weir_core::clock::now_ns();
        let event = |seq: u64, emitted_ns: u64| Event {
            key: seq,
            value: seq,
            emitted_ns,
            seq,
        };
        let mut batch = vec![event(0, 0), event(1, 0), event(2, now), event(3, now), event(4, 0)];
        h.write_sink(&mut sink, &mut batch).unwrap();
        h.finish_sink(&mut sink).unwrap();
        assert_eq!(h.latency_ns().len(), 2, "only the two known stamps");
        drop(sink);
        assert_eq!(count.load(Ordering::Relaxed), 5, "every record counted");
    }

    /// Shows a wrapping sink's checkpoint state and visibility.
    struct Inner {
        state: Vec<u8>,
        detached: bool,
        restored: Arc<std::sync::Mutex<Vec<u8>>>,
    }

    impl Sink<Event> for Inner {
        fn write(&mut self, batch: &mut Vec<Event>, ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
            for e in batch.drain(..) {
                ctx.record_visible_latency(e.emitted_ns);
            }
            Ok(())
        }
        fn pre_commit_detached(&mut self, _: u64) -> Result<PreCommit, BoxError> {
            let state = self.state.clone();
            Ok(if self.detached {
                PreCommit::deferred(Box::new(move || Ok(state)))
            } else {
                PreCommit::done(state)
            })
        }
        fn restore(&mut self, _: u64, state: &[u8]) -> Result<(), BoxError> {
            *self.restored.lock().unwrap() = state.to_vec();
            Ok(())
        }
    }

    /// In a failure run the count sink keeps its count and checksum in the
    /// checkpoint before the inner sink's state, inline or detached, and
    /// gives the inner sink back its own part on restore; it taps what the
    /// inner sink makes visible into the failure probe.
    #[test]
    fn a_failure_run_s_count_sink_keeps_its_count_beside_the_inner_sink_s_state() {
        for detached in [false, true] {
            // A timeline long enough that a stalled test thread still
            // taps within it (a 10 ms one failed once in CI).
            let probe = crate::lab::failure::FailureProbe::new(u64::MAX, 1, 60_000);
            let restored = Arc::new(std::sync::Mutex::new(Vec::new()));
            let inner = Inner {
                state: b"inner".to_vec(),
                detached,
                restored: restored.clone(),
            };
            let totals = || Arc::new(AtomicU64::new(0));
            let mut sink = CountSink::new(totals(), totals())
                .with_inner(Box::new(inner))
                .with_failure(probe.clone(), 0);
            let mut h = weir_core::harness::Harness::new(0, 1);
            let now = weir_core::clock::now_ns();
            let mut batch: Vec<Event> = (0..3)
                .map(|seq| Event {
                    key: seq,
                    value: seq,
                    emitted_ns: now,
                    seq,
                })
                .collect();
            h.write_sink(&mut sink, &mut batch).unwrap();
            let (count, checksum) = (sink.count, sink.checksum);
            assert_eq!(count, 3);
            let state = sink.pre_commit_detached(7).unwrap().wait().unwrap();
            assert_eq!(state.len(), 16 + 5, "count, checksum, then the inner state");
            assert_eq!(&state[16..], b"inner");

            let mut again = CountSink::new(totals(), totals())
                .with_inner(Box::new(Inner {
                    state: Vec::new(),
                    detached,
                    restored: restored.clone(),
                }))
                .with_failure(probe.clone(), 0);
            again.restore(7, &state).unwrap();
            assert_eq!((again.count, again.checksum, again.committed), (count, checksum, count));
            assert_eq!(&*restored.lock().unwrap(), b"inner");
            let e = again.restore(8, &state[..10]).unwrap_err().to_string();
            assert!(e.contains("checkpoint 8") && e.contains("10 bytes"), "{e}");
            // The tap reached the probe: every record the inner sink made
            // visible is counted, and a failure now finds visible output.
            assert_eq!(probe.visible_total_for_test(), 3);
            probe.fail_now_for_test();
            assert!(probe.report(1).unwrap().visible.is_some(), "visible output was tapped");
        }
    }
}
