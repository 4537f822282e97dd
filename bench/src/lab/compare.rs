//! `weir compare`: what does exactly-once cost? The same pipeline in every
//! checkpoint mode, each with the sink a user would choose for it (none and
//! at-least-once with a direct or upsert sink, aligned and unaligned with
//! the write-ahead-log and the two-phase file sink), one run after the
//! other in one process: open loop at a fixed rate for processing and
//! visibility latency (the exactly-once rows at every interval of a
//! sweep), closed loop for throughput with the row's sink and with the
//! counting sink. Beside every latency, the platform probe's figure from
//! the same run; beside the exactly-once figures, the fsyncs per
//! checkpoint and this disk's own sync latency. Two tables, sentences
//! computed from them, JSON lines and an SVG figure.
//!
//! One run must not measure another's leftovers. A closed-loop run writes
//! hundreds of megabytes, and deleting them on a file system mounted with
//! `discard` (this machine's ext4) raised the WAL rows' visibility p99 in
//! the run after it from 13-14 ms to 40-55 ms, through one stall of its
//! syncs (docs/notebook/benchmarks-2026-12.md, "One run's cleanup in the
//! next run's tail").
//! So the open-loop (latency) runs go first, keeping their few megabytes of output each until the
//! last of them ends ([`Outputs`]), and the closed-loop (throughput) runs
//! follow, each deleting its output when it ends.
//!
//! The closed-loop runs are made in interleaved rounds (three by default):
//! this machine's speed drifts within minutes, and a cost computed from
//! two single runs a minute apart moved by 20 points from one `weir
//! compare` to the next. Each round's cost compares runs made seconds
//! apart; the sentences give their median and range.

use std::cell::Cell;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use crate::cli::{CliError, Mode};
use crate::lab::bench::{
    append_json, run_one_full, runtime_config, temp_checkpoint_dir, temp_sink_dir, Platform, RunOutput,
};
use crate::lab::co_runners::{CoRunners, WAIT_FLOOR_NS, WINDOW_NS};
use crate::lab::disk_load::{DiskLoad, DiskLoadStats};
use crate::lab::disk_probe::DiskProbe;
use crate::lab::failure::{ms_text, rate_text, FailureProbe};
use crate::lab::kafka_compare::{self, CompareKafka};
use crate::lab::pipelines::{Kind, SinkKind, Spec, StateBackend};
use crate::lab::platform::{PlatformResult, Policy};
use crate::lab::plot::{write_failure_svg, write_svg, Curve, FailureTimeline, Figure, Sweep};
use crate::lab::report::{si, BenchResult, Machine, Percentiles, ProbeInfo, Syncs};

/// The workload variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// The pipeline as is.
    Normal,
    /// A slow operator after the keyed one (5 µs per record): queues fill,
    /// aligned barriers wait for them to drain, unaligned ones overtake.
    /// Checkpoint figures then come from the closed-loop runs, where the
    /// queues are full.
    Backpressure,
    /// Another program writes and syncs to the same filesystem during
    /// every open-loop run, at `--disk-busy-mb-s` (`disk_load`): what a
    /// busy disk does to exactly-once visibility.
    DiskBusy,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Normal => "normal",
            Scenario::Backpressure => "backpressure",
            Scenario::DiskBusy => "disk-busy",
        }
    }
}

/// The sink of the rows without exactly-once (none, at-least-once).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PlainSink {
    /// Lines appended to files, visible at write.
    Direct,
    /// Idempotent upsert by key into SQLite, visible at write.
    Upsert,
}

/// Arguments of `weir compare`.
#[derive(Debug, clap::Args)]
pub struct CompareArgs {
    /// Which job to run.
    #[arg(long, value_enum, default_value = "keyed")]
    pub pipeline: Kind,
    /// Records per closed-loop run with the row's sink, in each round; the
    /// runs with the counting sink, 5 to 10 times faster, take 5 times as
    /// many [default: 4000000; 400000 with --scenario backpressure].
    #[arg(long)]
    pub events: Option<u64>,
    /// Closed-loop rounds: every closed-loop run is made this many times,
    /// interleaved (round 1 of every run, then round 2, ...); the table
    /// shows each run's median round, and each throughput cost is the
    /// median of the rounds' own costs, with their range, so that the
    /// machine's drift moves the answer less [default: 3; 1 with
    /// --scenario backpressure].
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Records per second of the open-loop runs.
    #[arg(long, default_value_t = 200_000.0)]
    pub rate: f64,
    /// Length of each open-loop run, seconds, at least: a run at a
    /// checkpoint interval lasts at least 3 intervals (a 1000 ms interval:
    /// 3 s), so that it holds several checkpoints and its start (buffers
    /// growing to their size) weighs less in the tail. 2 s keeps the whole
    /// default run within a minute on 2 cores; raise it for steadier tails.
    #[arg(long, default_value_t = 2.0)]
    pub open_seconds: f64,
    /// Checkpoint intervals in ms, comma-separated. The exactly-once rows
    /// run open loop at each; the first is the base interval, at which the
    /// closed-loop runs and the at-least-once row run
    /// [default: 10,100,1000; 100 with --scenario backpressure].
    #[arg(long, value_delimiter = ',', visible_alias = "checkpoint-interval-ms")]
    pub intervals: Vec<u64>,
    /// Workload variant.
    #[arg(long, value_enum, default_value = "normal")]
    pub scenario: Scenario,
    /// `--scenario disk-busy`: the co-runner's write rate, MB/s (256 KiB
    /// writes, an fdatasync every 4 MiB, into the folder the checkpoints
    /// and sinks use).
    #[arg(long, default_value_t = 200.0)]
    pub disk_busy_mb_s: f64,
    /// Distinct keys.
    #[arg(long, default_value_t = 10_000)]
    pub keys: u64,
    /// Keyed pipeline: where the per-key state lives.
    #[arg(long, value_enum, default_value = "mapped")]
    pub state: StateBackend,
    /// The sink of the none and at-least-once rows (the exactly-once rows
    /// use the WAL and the two-phase file sink). SQLite upserts are far
    /// slower than file appends: lower --events with `upsert`.
    #[arg(long, value_enum, default_value = "direct")]
    pub sink: PlainSink,
    /// Parallelism of every operator [default: one per core].
    #[arg(long)]
    pub parallelism: Option<usize>,
    /// Worker threads of the open-loop (latency) runs [default: one per
    /// core but one, at least 1]. The cores left over run weir's other
    /// threads (checkpoint coordinator, snapshot pool, sinks' I/O threads:
    /// `HelperPlacement::SpareCores`), so checkpoints and sink I/O never
    /// take a worker's core: what a latency-minded embedding would do.
    /// The closed-loop (throughput) runs use one worker per core.
    #[arg(long)]
    pub open_workers: Option<usize>,
    /// How each open-loop (latency) run measures the machine's own delay:
    /// `spin`, a thread spinning alone on each worker core for 1 s right
    /// before the run (preempts nothing of weir's); `fifo`, the
    /// SCHED_FIFO probe during the run (preempts the workers: their
    /// figures include its cost); `off`.
    #[arg(long, value_enum, default_value = "spin")]
    pub platform_probe: Platform,
    /// Write every run as a JSON line here [default: <results>/compare.json].
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the SVG figure here [default: <results>/compare.svg].
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Folder for the default outputs.
    #[arg(long, default_value = "results")]
    pub results: PathBuf,
    /// Keyed job: the failure runs' topologies, in keyed stages one after
    /// another (`weir bench --stages`), each 1 to 8; the failure is in the
    /// first stage (the farthest from the sink).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 3])]
    pub failure_stages: Vec<usize>,
    /// Also run the keyed count from Kafka topic to topic (`weir bench
    /// --source kafka --sink kafka`), open loop, after the other runs:
    /// at-least-once at the first interval, exactly-once (aligned) at
    /// each, on one broker, in a table of their own. Needs a broker:
    /// `--brokers`, or one started through bench/peers/kafka/kafka.sh
    /// (a JDK 17+ and Maven). Only with `--scenario normal`.
    #[arg(long)]
    pub kafka: bool,
    /// `--kafka`: a running broker, `HOST:PORT` [default: one started for
    /// the run and stopped after it].
    #[arg(long, requires = "kafka")]
    pub brokers: Option<String>,
    /// `--kafka`: records per second of the Kafka runs.
    #[arg(long, default_value_t = 20_000.0, requires = "kafka")]
    pub kafka_rate: f64,
    /// `--kafka`: records per Kafka run [default: 10 s at --kafka-rate].
    #[arg(long, requires = "kafka")]
    pub kafka_events: Option<u64>,
}

/// Records of a closed-loop run with the counting sink per record of one
/// with the row's sink: 5. The counting sink runs 5 to 10 times faster
/// (50 M against 4-9 M events/s here), and with the same count its runs
/// lasted 0.2 s, of which the job's start and first checkpoints are a
/// large, variable part: the at-least-once cost against none moved from
/// 8% to 30% between three runs of `weir compare`
/// (docs/notebook/benchmarks-2026-12.md, "`weir compare` on a quiet hour,
/// steal beside the probe, closed-loop rounds").
pub const COUNT_EVENTS_FACTOR: u64 = 5;

const MODES: [Mode; 5] = [
    Mode::None,
    Mode::AtLeastOnce,
    Mode::Aligned,
    Mode::Unaligned,
    Mode::Dedup,
];

/// One row of the comparison: a mode with its sink.
#[derive(Debug, Clone, Copy)]
struct Row {
    mode: Mode,
    sink: SinkKind,
}

impl Row {
    fn label(self) -> String {
        format!("{}·{}", self.mode.name(), self.sink.name())
    }

    fn exactly_once(self) -> bool {
        self.mode.exactly_once()
    }
}

/// A mode's failure run as a row: the WAL sink in the exactly-once modes,
/// the direct sink in the others (both write `key,value,seq` lines, read
/// back after the run).
fn failure_row(mode: Mode) -> Row {
    Row {
        mode,
        sink: if mode.exactly_once() {
            SinkKind::Wal
        } else {
            SinkKind::Direct
        },
    }
}

/// The rows, in table order.
fn rows(plain: SinkKind) -> Vec<Row> {
    let mut rows = vec![
        Row {
            mode: Mode::None,
            sink: plain,
        },
        Row {
            mode: Mode::AtLeastOnce,
            sink: plain,
        },
    ];
    for mode in [Mode::Aligned, Mode::Unaligned, Mode::Dedup] {
        for sink in [SinkKind::Wal, SinkKind::TwoPcFile] {
            rows.push(Row { mode, sink });
        }
    }
    rows
}

/// An open-loop run of a row at an interval.
struct OpenRun {
    row: usize,
    interval_ms: u64,
    out: RunOutput,
    syncs: Option<Syncs>,
    /// `--scenario disk-busy`: what the co-runner did during the run.
    disk_load: Option<DiskLoadStats>,
}

/// What a failure run fails with: the probe, in a job of `stages` keyed
/// stages (the first fails).
struct Failing {
    probe: Arc<FailureProbe>,
    stages: usize,
}

/// One failure run: the mode, its keyed stages, what it measured.
struct Failure {
    mode: Mode,
    stages: usize,
    out: RunOutput,
}

/// The modes of the failure runs at `stages` keyed stages: every one.
fn failure_modes(_stages: usize) -> impl Iterator<Item = Mode> {
    MODES.into_iter()
}

/// A failure run's label: its row's, with `×N` at N stages.
fn failure_label(mode: Mode, stages: usize) -> String {
    match stages {
        1 => failure_row(mode).label(),
        n => format!("{} ×{n}", failure_row(mode).label()),
    }
}

/// Everything measured.
struct Measured {
    rows: Vec<Row>,
    intervals: Vec<u64>,
    /// Closed loop with the counting sink, per mode (index into MODES):
    /// the median round's run.
    count: Vec<RunOutput>,
    /// Closed loop with the row's sink, per row: the median round's run.
    closed: Vec<RunOutput>,
    /// Every round's events/s, in round order: per mode with the counting
    /// sink, and per row.
    count_rounds: Vec<Vec<f64>>,
    closed_rounds: Vec<Vec<f64>>,
    /// Open loop, per row and interval.
    open: Vec<OpenRun>,
    disk: DiskProbe,
    /// The probe merged over every open-loop run.
    platform: Option<PlatformResult>,
    /// One failure per mode and keyed stages (keyed job, open loop, the
    /// mode's natural sink), in MODES order per stage count; dedup at one
    /// stage only; empty for other pipelines.
    failures: Vec<Failure>,
}

impl Measured {
    fn base(&self) -> u64 {
        self.intervals[0]
    }

    /// What the failure run of `mode` at `stages` keyed stages measured,
    /// if it ran and the failure happened.
    fn failure(&self, mode: Mode, stages: usize) -> Option<&crate::lab::failure::FailureReport> {
        self.failures
            .iter()
            .find(|f| f.mode == mode && f.stages == stages)
            .and_then(|f| f.out.result.failure.as_ref())
    }

    /// The intervals row `r` ran open loop at.
    fn intervals_of(&self, r: usize) -> Vec<u64> {
        if self.rows[r].exactly_once() {
            self.intervals.clone()
        } else {
            vec![self.base()]
        }
    }

    fn open_at(&self, r: usize, interval_ms: u64) -> &OpenRun {
        self.open
            .iter()
            .find(|o| o.row == r && o.interval_ms == interval_ms)
            .expect("every row ran at each of its intervals")
    }

    fn count_of(&self, r: usize) -> &RunOutput {
        let m = MODES
            .iter()
            .position(|&m| m == self.rows[r].mode)
            .expect("a known mode");
        &self.count[m]
    }
}

/// One JSON line: a run with its kind.
#[derive(Serialize)]
struct JsonRow<'a> {
    run: &'static str,
    scenario: &'static str,
    row: String,
    interval_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    syncs: Option<Syncs>,
    /// Closed loop: every round's events/s in round order (this line is
    /// the median round's run).
    #[serde(skip_serializing_if = "Option::is_none")]
    rounds_events_per_sec: Option<&'a [f64]>,
    /// `--scenario disk-busy`, open loop: the co-runner's rate and syncs.
    #[serde(skip_serializing_if = "Option::is_none")]
    disk_load: Option<DiskLoadStats>,
    #[serde(flatten)]
    result: &'a BenchResult,
}

/// The disk probe's JSON line.
#[derive(Serialize)]
struct JsonDisk<'a> {
    run: &'static str,
    scenario: &'static str,
    #[serde(flatten)]
    probe: &'a DiskProbe,
    machine: &'a Machine,
}

/// Validated settings.
struct Plan {
    /// Closed-loop rounds.
    rounds: usize,
    pipeline: Kind,
    scenario: Scenario,
    parallelism: usize,
    cores: usize,
    /// Workers of the open-loop runs.
    open_workers: usize,
    slow_ns: u64,
    closed_events: u64,
    open_events: u64,
    rate: f64,
    keys: u64,
    state: StateBackend,
    probe: Platform,
    /// `--scenario disk-busy`: the co-runner's MB/s.
    disk_busy: Option<f64>,
    /// The failure runs' keyed stages (`--failure-stages`).
    failure_stages: Vec<usize>,
}

/// The folder the open-loop runs of one `weir compare` write their sink
/// output to, a subfolder per run, removed as a whole after the last of
/// them (also on an error): no latency run starts right after a delete.
struct Outputs {
    dir: PathBuf,
    runs: Cell<u32>,
}

impl Outputs {
    fn new() -> Self {
        Outputs {
            dir: temp_sink_dir(),
            runs: Cell::new(0),
        }
    }

    /// A fresh folder for the next run's output.
    fn next(&self) -> PathBuf {
        let n = self.runs.get() + 1;
        self.runs.set(n);
        self.dir.join(format!("run-{n:02}"))
    }

    /// Bytes of output kept so far.
    fn bytes(&self) -> u64 {
        fn walk(p: &Path) -> u64 {
            let Ok(entries) = std::fs::read_dir(p) else { return 0 };
            entries
                .flatten()
                .map(|e| match e.file_type() {
                    Ok(t) if t.is_dir() => walk(&e.path()),
                    _ => e.metadata().map_or(0, |m| m.len()),
                })
                .sum()
        }
        walk(&self.dir)
    }
}

impl Drop for Outputs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Plan {
    /// Records of a closed-loop run with the counting sink.
    fn count_events(&self) -> u64 {
        self.closed_events.saturating_mul(COUNT_EVENTS_FACTOR)
    }

    /// Records of an open-loop run at `interval_ms`: `open_events`, or 3
    /// intervals' worth if that is more.
    fn open_events_at(&self, interval_ms: u64) -> u64 {
        self.open_events
            .max((self.rate * 3.0 * interval_ms as f64 / 1e3) as u64)
    }

    /// Runs `row`'s mode with `sink`, closed loop (`rate` None) or open
    /// loop; its output goes to `outputs`, or without, to a temporary
    /// folder deleted when the run ends. With `failure`, the job has its
    /// keyed stages and the first one's function fails as its probe says
    /// (and the platform probe stays off).
    fn run(
        &self,
        outputs: Option<&Outputs>,
        mode: Mode,
        sink: SinkKind,
        rate: Option<f64>,
        interval_ms: u64,
        failure: Option<Failing>,
    ) -> Result<RunOutput, CliError> {
        let stages = failure.as_ref().map_or(1, |f| f.stages);
        let failure = failure.map(|f| f.probe);
        let probe = if failure.is_some() {
            Platform::Off
        } else {
            self.probe.for_run(rate.is_some())
        };
        let spec = Spec {
            kind: self.pipeline,
            events: if rate.is_some() {
                self.open_events_at(interval_ms)
            } else if sink == SinkKind::Count {
                self.count_events()
            } else {
                self.closed_events
            },
            rate,
            keys: self.keys,
            parallelism: self.parallelism,
            seed: 1,
            slow_ns: self.slow_ns,
            state: self.state,
            stages,
            sink,
            sink_dir: match outputs {
                Some(o) if sink != SinkKind::Count => o.next(),
                _ => PathBuf::new(),
            },
            warmup_ms: crate::lab::pipelines::DEFAULT_WARMUP_MS,
            failure,
        };
        let dir = temp_checkpoint_dir();
        let defaults = weir_core::RuntimeConfig::default();
        let workers = if rate.is_some() { self.open_workers } else { self.cores };
        let config = runtime_config(
            workers,
            defaults.ring_capacity,
            defaults.batch_size,
            mode,
            interval_ms,
            &dir,
        );
        let r = run_one_full(&spec, config, mode, probe);
        let _ = std::fs::remove_dir_all(&dir);
        r
    }

    /// The record the failure runs fail on: the middle of the open-loop
    /// schedule.
    fn failure_record(&self, interval_ms: u64) -> u64 {
        self.open_events_at(interval_ms) / 2
    }

    /// One failure in `mode` (keyed job, open loop, the mode's natural
    /// sink: [`failure_row`]; the counting sink before it keeps its count
    /// in checkpoints): the keyed function panics once, on the middle
    /// record, and the job recovers: the whole job from its latest
    /// checkpoint in the snapshot modes, the failed subtask alone in dedup
    /// mode (one restart allowed, no delay). The sinks' files are then
    /// read back: every record present, and once in the exactly-once modes
    /// (`run_one_full`).
    fn run_failure(&self, mode: Mode, interval_ms: u64, stages: usize) -> Result<RunOutput, CliError> {
        // The timeline covers the schedule twice over, and ten seconds.
        let ms = (self.open_events_at(interval_ms) as f64 / self.rate * 1e3) as usize * 2 + 10_000;
        let probe = FailureProbe::new(self.failure_record(interval_ms), self.parallelism, ms);
        let outputs = Outputs::new();
        self.run(
            Some(&outputs),
            mode,
            failure_row(mode).sink,
            Some(self.rate),
            interval_ms,
            Some(Failing { probe, stages }),
        )
    }
}

fn validate(args: &CompareArgs) -> Result<(Plan, Vec<u64>), CliError> {
    let positive = |x: f64| x.is_finite() && x > 0.0;
    if !positive(args.rate) || !positive(args.open_seconds) {
        return Err(CliError::Usage(format!(
            "--rate and --open-seconds must be positive numbers, got {} and {}",
            args.rate, args.open_seconds
        )));
    }
    if !matches!(args.pipeline, Kind::Keyed | Kind::Stateless) {
        return Err(CliError::Usage(format!(
            "weir compare runs --pipeline keyed or stateless (their output goes through the compared sinks); \
             for {} use weir bench --pipeline {} --mode M",
            args.pipeline.name(),
            args.pipeline.name()
        )));
    }
    if args.kafka {
        if args.scenario != Scenario::Normal {
            return Err(CliError::Usage(
                "--kafka runs with --scenario normal only (its rows measure the broker's path, not a scenario)".into(),
            ));
        }
        if !positive(args.kafka_rate) {
            return Err(CliError::Usage(format!(
                "--kafka-rate must be a positive number, got {}",
                args.kafka_rate
            )));
        }
        let least = kafka_compare::least_events(args.kafka_rate);
        if args.kafka_events.is_some_and(|n| n < least) {
            return Err(CliError::Usage(format!(
                "--kafka-events must cover the Kafka runs' 1 s warm-up and 2 s measured at --kafka-rate {}: at \
                 least {least}",
                args.kafka_rate
            )));
        }
    }
    if args.scenario == Scenario::Backpressure && args.pipeline != Kind::Keyed {
        return Err(CliError::Usage("--scenario backpressure needs --pipeline keyed".into()));
    }
    if args.keys == 0 {
        return Err(CliError::Usage("--keys must be at least 1".into()));
    }
    let max = crate::lab::pipelines::MAX_STAGES;
    if let Some(bad) = args.failure_stages.iter().find(|s| !(1..=max).contains(*s)) {
        return Err(CliError::Usage(format!(
            "--failure-stages: each must be between 1 and {max}, got {bad}"
        )));
    }
    if args.scenario == Scenario::DiskBusy && !(args.disk_busy_mb_s.is_finite() && args.disk_busy_mb_s > 0.0) {
        return Err(CliError::Usage(format!(
            "--disk-busy-mb-s must be a positive number of MB/s, got {}",
            args.disk_busy_mb_s
        )));
    }
    if args.events == Some(0) {
        return Err(CliError::Usage("--events must be at least 1".into()));
    }
    if args.rounds == Some(0) {
        return Err(CliError::Usage("--rounds must be at least 1".into()));
    }
    if args.open_workers == Some(0) {
        return Err(CliError::Usage("--open-workers must be at least 1".into()));
    }
    if args.parallelism == Some(0) {
        return Err(CliError::Usage("--parallelism must be at least 1".into()));
    }
    let intervals = if args.intervals.is_empty() {
        match args.scenario {
            Scenario::Normal | Scenario::DiskBusy => vec![10, 100, 1000],
            Scenario::Backpressure => vec![100],
        }
    } else {
        args.intervals.clone()
    };
    if let Some(i) = intervals.iter().position(|&i| i == 0) {
        return Err(CliError::Usage(format!(
            "--intervals: interval {} is 0 ms; give checkpoint intervals of at least 1 ms, e.g. --intervals 10,100,1000",
            i + 1
        )));
    }
    for (i, v) in intervals.iter().enumerate() {
        if intervals[..i].contains(v) {
            return Err(CliError::Usage(format!(
                "--intervals lists {v} ms twice; list each interval once"
            )));
        }
    }
    if args.scenario == Scenario::Backpressure && intervals.len() > 1 {
        return Err(CliError::Usage(
            "--scenario backpressure takes one interval (its checkpoints are measured closed loop, at the base \
             interval); give --intervals N"
                .into(),
        ));
    }
    let cores = weir_core::available_cores();
    let slow_ns = if args.scenario == Scenario::Backpressure {
        5_000
    } else {
        0
    };
    let plan = Plan {
        pipeline: args.pipeline,
        scenario: args.scenario,
        parallelism: args.parallelism.unwrap_or(cores),
        cores,
        open_workers: args.open_workers.unwrap_or(cores.saturating_sub(1).max(1)),
        slow_ns,
        closed_events: args.events.unwrap_or(if slow_ns > 0 { 400_000 } else { 4_000_000 }),
        rounds: args.rounds.unwrap_or(if slow_ns > 0 { 1 } else { 3 }),
        open_events: ((args.rate * args.open_seconds) as u64).max(1000),
        rate: args.rate,
        keys: args.keys,
        state: args.state,
        probe: args.platform_probe,
        disk_busy: (args.scenario == Scenario::DiskBusy).then_some(args.disk_busy_mb_s),
        failure_stages: args.failure_stages.clone(),
    };
    Ok((plan, intervals))
}

/// Runs `weir compare`.
pub fn run(args: &CompareArgs) -> Result<(), CliError> {
    let started = Instant::now();
    let (plan, intervals) = validate(args)?;
    let plain = match args.sink {
        PlainSink::Direct => SinkKind::Direct,
        PlainSink::Upsert => SinkKind::Upsert,
    };
    let rows = rows(plain);
    let machine = Machine::here();
    let scenario = plan.scenario.name();
    println!(
        "weir compare: {} pipeline, {scenario} scenario, parallelism {}, open loop at {} events/s for {} s \
         (at least 3 checkpoint intervals), closed loop {} events ({} with the counting sink) in {} round{}",
        plan.pipeline.name(),
        plan.parallelism,
        si(plan.rate),
        args.open_seconds,
        plan.closed_events,
        plan.count_events(),
        plan.rounds,
        if plan.rounds == 1 { "" } else { "s" }
    );
    println!(
        "checkpoint intervals: {} ms (exactly-once rows, open loop); the closed-loop runs and the at-least-once \
         row at the first, {} ms",
        join(&intervals, ", "),
        intervals[0]
    );
    println!(
        "workers: {} in the open-loop runs ({}), {} in the closed-loop runs",
        plan.open_workers,
        if plan.open_workers < plan.cores {
            let spare = plan.cores - plan.open_workers;
            format!(
                "one core each; weir's other threads on the {spare} other core{}",
                if spare > 1 { "s" } else { "" }
            )
        } else {
            "no spare core: weir's other threads share the workers' cores".to_string()
        },
        plan.cores
    );
    println!(
        "measured now on this machine: {} ({} cores), unix time {}",
        machine.cpu, machine.cores, machine.unix_time
    );

    // The disk first, on a quiet machine: the exactly-once figures are read
    // against it.
    let disk_dir = std::env::temp_dir();
    let disk = DiskProbe::run(&disk_dir).map_err(|source| CliError::Io {
        path: format!("{} (disk probe: 4 KiB appends and fdatasync)", disk_dir.display()),
        source,
    })?;

    // Every open-loop run once, then each round's closed-loop runs: one
    // with the counting sink per mode and one per row.
    let failure_runs = if plan.pipeline == Kind::Keyed {
        plan.failure_stages.iter().map(|&s| failure_modes(s).count()).sum()
    } else {
        0
    };
    let total_runs = rows
        .iter()
        .map(|r| if r.exactly_once() { intervals.len() } else { 1 })
        .sum::<usize>()
        + failure_runs
        + plan.rounds * (MODES.len() + rows.len());
    let mut done = 0;
    let mut progress = |what: String| {
        done += 1;
        eprintln!("  [{done:>2}/{total_runs}] {what} ...");
    };
    let outputs = Outputs::new();
    // The latency runs first: each follows only other latency runs, whose
    // output of a few megabytes each is kept until the last of them ends,
    // never a closed-loop run's delete of hundreds.
    let mut open = Vec::new();
    for (r, row) in rows.iter().enumerate() {
        let row_intervals = if row.exactly_once() {
            intervals.clone()
        } else {
            vec![intervals[0]]
        };
        for interval_ms in row_intervals {
            progress(format!("{:<22} open loop, {interval_ms} ms", row.label()));
            let load_err = |source| CliError::Io {
                path: format!("{} (the disk-busy co-runner's file)", std::env::temp_dir().display()),
                source,
            };
            let load = plan
                .disk_busy
                .map(|mb_s| DiskLoad::start(&std::env::temp_dir(), mb_s))
                .transpose()
                .map_err(load_err)?;
            let before = weir_core::disk::sync_stats();
            let out = plan.run(Some(&outputs), row.mode, row.sink, Some(plan.rate), interval_ms, None);
            // Stopped whatever the run did, so that its writes never outlive it.
            let disk_load = load.map(DiskLoad::stop).transpose().map_err(load_err)?;
            let out = out?;
            let syncs = row.exactly_once().then(|| {
                let completed = out.result.checkpoints.as_ref().map_or(0, |c| c.completed);
                Syncs::of(&weir_core::disk::sync_stats().since(&before), completed)
            });
            open.push(OpenRun {
                row: r,
                interval_ms,
                out,
                syncs,
                disk_load,
            });
        }
    }
    eprintln!(
        "  removing the open-loop runs' output ({:.0} MB)",
        outputs.bytes() as f64 / 1e6
    );
    drop(outputs);
    let mut failures = Vec::new();
    if failure_runs > 0 {
        for &stages in &plan.failure_stages {
            for mode in failure_modes(stages) {
                progress(format!(
                    "{:<22} one failure, open loop, {} ms",
                    failure_label(mode, stages),
                    intervals[0]
                ));
                let out = plan.run_failure(mode, intervals[0], stages)?;
                failures.push(Failure { mode, stages, out });
            }
        }
    }
    let mut count: Vec<Vec<RunOutput>> = MODES.iter().map(|_| Vec::new()).collect();
    let mut closed: Vec<Vec<RunOutput>> = rows.iter().map(|_| Vec::new()).collect();
    for round in 1..=plan.rounds {
        let tag = if plan.rounds > 1 {
            format!(", round {round} of {}", plan.rounds)
        } else {
            String::new()
        };
        for (i, mode) in MODES.into_iter().enumerate() {
            progress(format!("{:<22} closed loop{tag}", format!("{}·count", mode.name())));
            count[i].push(plan.run(None, mode, SinkKind::Count, None, intervals[0], None)?);
            for (r, row) in rows.iter().enumerate().filter(|(_, row)| row.mode == mode) {
                progress(format!("{:<22} closed loop{tag}", row.label()));
                closed[r].push(plan.run(None, mode, row.sink, None, intervals[0], None)?);
            }
        }
    }
    let (count, count_rounds): (Vec<_>, Vec<_>) = count.into_iter().map(median_round).unzip();
    let (closed, closed_rounds): (Vec<_>, Vec<_>) = closed.into_iter().map(median_round).unzip();
    let platform =
        open.iter()
            .filter_map(|o| o.out.platform.as_ref())
            .fold(None::<PlatformResult>, |acc, p| match acc {
                None => Some(p.clone()),
                Some(mut a) => {
                    a.merge(p);
                    Some(a)
                }
            });
    let m = Measured {
        rows,
        intervals,
        count,
        closed,
        count_rounds,
        closed_rounds,
        open,
        disk,
        platform,
        failures,
    };

    // Through Kafka last: the broker's JVM starts after every other run.
    let kafka = args.kafka.then(|| CompareKafka {
        brokers: args.brokers.clone(),
        rate: args.kafka_rate,
        events: args
            .kafka_events
            .unwrap_or(((args.kafka_rate * 10.0) as u64).max(kafka_compare::least_events(args.kafka_rate))),
        intervals: m.intervals.clone(),
        keys: args.keys,
    });
    let (kafka_rows, kafka_floor) = match &kafka {
        Some(c) => kafka_compare::compare_rows(c)?,
        None => (Vec::new(), Err("no --kafka".to_string())),
    };

    print_latency_table(&m, &plan, args.open_seconds);
    print_throughput_table(&m, &plan);
    print_failure_table(&m, &plan);
    print_sentences(&m, &plan);
    if let Some(c) = &kafka {
        kafka_compare::print_table(&kafka_rows, &kafka_floor, c);
    }

    std::fs::create_dir_all(&args.results).map_err(|source| CliError::Io {
        path: args.results.display().to_string(),
        source,
    })?;
    let json = args.json.clone().unwrap_or_else(|| args.results.join("compare.json"));
    let plot = args.plot.clone().unwrap_or_else(|| args.results.join("compare.svg"));
    write_json(&json, scenario, &m, &machine)?;
    if kafka.is_some() {
        for line in kafka_compare::json_lines(&kafka_rows, &kafka_floor) {
            append_json(&json, &line)?;
        }
    }
    write_svg(&plot, &figure(&m, &plan)).map_err(|e| CliError::Io {
        path: plot.display().to_string(),
        source: std::io::Error::other(e.to_string()),
    })?;
    let timelines: Vec<FailureTimeline> = m
        .failures
        .iter()
        .filter(|f| f.stages == 1 && matches!(f.mode, Mode::Aligned | Mode::Dedup))
        .filter_map(|Failure { mode, out, .. }| {
            out.result.failure.as_ref().map(|f| FailureTimeline {
                name: match mode {
                    Mode::Dedup => "dedup, the failed subtask recovers alone".to_string(),
                    _ => format!("{}, the whole job restarts", mode.name()),
                },
                points: f.timeline.clone(),
                visible: f.visible.as_ref().map_or(Vec::new(), |v| v.timeline.clone()),
            })
        })
        .collect();
    if !timelines.is_empty() {
        let path = args.results.join("failure.svg");
        let title = format!("one failure, {} ms interval", m.base());
        write_failure_svg(&path, &title, &timelines).map_err(|e| CliError::Io {
            path: path.display().to_string(),
            source: std::io::Error::other(e.to_string()),
        })?;
        println!("wrote {}", path.display());
    }
    println!("\nwrote {} and {}", json.display(), plot.display());
    println!("weir compare ran in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn join(v: &[u64], sep: &str) -> String {
    v.iter().map(u64::to_string).collect::<Vec<_>>().join(sep)
}

/// A duration in microseconds with its unit: `0.8 µs`, `1.23 ms`, `1.20 s`.
fn dur(us: f64) -> String {
    let a = us.abs();
    if a < 1e3 {
        format!("{us:.1} µs")
    } else if a < 1e6 {
        format!("{:.2} ms", us / 1e3)
    } else {
        format!("{:.2} s", us / 1e6)
    }
}

/// As [`dur`], with a sign.
fn signed(us: f64) -> String {
    if us >= 0.0 {
        format!("+{}", dur(us))
    } else {
        format!("−{}", dur(-us))
    }
}

fn opt<T>(v: Option<T>, f: impl Fn(T) -> String) -> String {
    v.map_or_else(|| "-".to_string(), f)
}

fn interval_cell(row: Row, interval_ms: u64) -> String {
    if row.mode == Mode::None {
        "-".into()
    } else {
        format!("{interval_ms} ms")
    }
}

fn print_latency_table(m: &Measured, plan: &Plan, open_seconds: f64) {
    println!(
        "\nlatency, open loop at {} events/s, {open_seconds} s per run or 3 intervals (processing: emission to sink; visible: \
         emission until a reader of the target can see the record; platform: the machine's own delay, by the \
         platform method)",
        si(plan.rate)
    );
    println!(
        "{:<22} {:>8} | {:>10} {:>10} {:>10} | {:>10} {:>10} {:>10} | {:>10} | {:>11} {:>11}",
        "row",
        "interval",
        "proc p50",
        "proc p99",
        "proc p99.9",
        "vis p50",
        "vis p99",
        "vis p99.9",
        "plat p99",
        "excess p99",
        "excess p99.9"
    );
    for (r, &row) in m.rows.iter().enumerate() {
        for interval_ms in m.intervals_of(r) {
            let o = &m.open_at(r, interval_ms).out.result;
            let (l, v) = (o.latency_us, o.visible_latency_us);
            println!(
                "{:<22} {:>8} | {:>10} {:>10} {:>10} | {:>10} {:>10} {:>10} | {:>10} | {:>11} {:>11}",
                row.label(),
                interval_cell(row, interval_ms),
                dur(l.p50),
                dur(l.p99),
                dur(l.p999),
                opt(v, |v| dur(v.p50)),
                opt(v, |v| dur(v.p99)),
                opt(v, |v| dur(v.p999)),
                opt(o.platform_us, |p| dur(p.p99)),
                opt(o.excess_us, |e| signed(e.p99)),
                opt(o.excess_us, |e| signed(e.p999)),
            );
        }
    }
    match &m.platform {
        Some(p) => {
            let f = Percentiles::from_ns(&p.latency_ns);
            println!(
                "{:<22} {:>8} | {:>10} {:>10} {:>10} | {:>10} {:>10} {:>10} | {:>10} | {:>11} {:>11}",
                "platform",
                "all",
                dur(f.p50),
                dur(f.p99),
                dur(f.p999),
                "-",
                "-",
                "-",
                dur(f.p99),
                "-",
                "-"
            );
            println!(
                "(platform: merged over the {} open-loop runs; {}; excess: the row's processing latency minus its \
                 own run's platform figure)",
                m.open.len(),
                ProbeInfo::of(p).describe()
            );
        }
        None => println!("(platform off: no platform figures)"),
    }
}

/// Rows whose workers lost more than this to other threads on their cores
/// are named in the summary: 1 ms in a run of seconds is where it starts
/// to show in a p99.9.
const CO_RUNNER_NOTE_MS: f64 = 1.0;

/// `- the workers lost 4.2 ms in all to other threads on their cores,
/// ...: unaligned·wal at 100 ms 3.1 ms (at most 2.20 ms in a 10 ms
/// window)`, from the merged figure and each open-loop run's (its row and
/// interval as in the table); `None` where it was not measured.
fn co_runner_line(all: Option<CoRunners>, runs: &[(String, Option<CoRunners>)]) -> Option<String> {
    let all = all?;
    let named: Vec<String> = runs
        .iter()
        .filter_map(|(run, c)| {
            let c = c.filter(|c| c.total_ms > CO_RUNNER_NOTE_MS)?;
            Some(format!(
                "{run} {:.1} ms (at most {} in a {} ms window)",
                c.total_ms,
                dur(c.worst_us),
                c.window_ms
            ))
        })
        .collect();
    let rows = if named.is_empty() {
        format!("no row over {CO_RUNNER_NOTE_MS} ms")
    } else {
        named.join("; ")
    };
    Some(format!(
        "- the workers lost {:.1} ms in all to other threads on their cores, which the probe does not see \
         ({} ms windows over {} µs): {rows}",
        all.total_ms,
        WINDOW_NS / 1_000_000,
        WAIT_FLOOR_NS / 1000
    ))
}

/// `- during the open-loop runs the workers' idle turns of 1 µs or more
/// took 0.8% of their time (the most: aligned·wal at 10 ms, 1.4%, the
/// longest 0.86 ms)`: time the machine, or weir's own threads on other
/// cores, took from the workers while they waited for input; `None`
/// without open-loop runs.
fn idle_turns_line(m: &Measured) -> Option<String> {
    let mut runs = Vec::new();
    for (r, &row) in m.rows.iter().enumerate() {
        for interval_ms in m.intervals_of(r) {
            let g = m.open_at(r, interval_ms).out.result.worker_gaps?;
            let at = match interval_cell(row, interval_ms).as_str() {
                "-" => String::new(),
                cell => format!(" at {cell}"),
            };
            runs.push((format!("{}{at}", row.label()), g));
        }
    }
    let share = |lost_ms: f64, s: f64| 100.0 * lost_ms / 1e3 / s.max(1e-9);
    let (lost, observed) = runs
        .iter()
        .fold((0.0, 0.0), |(l, o), (_, g)| (l + g.lost_ms, o + g.observed_s));
    let (name, worst) = runs
        .iter()
        .max_by(|a, b| share(a.1.lost_ms, a.1.observed_s).total_cmp(&share(b.1.lost_ms, b.1.observed_s)))?;
    Some(format!(
        "- during the open-loop runs the workers' idle turns of {} µs or more took {:.2}% of their time (the \
         most: {name}, {:.2}%, the longest {}): the machine's, or weir's own threads' on other cores",
        worst.floor_us,
        share(lost, observed),
        share(worst.lost_ms, worst.observed_s),
        dur(worst.longest_us)
    ))
}

/// `- the disk-busy co-runner wrote 180-200 MB/s (asked 200) beside
/// every open-loop run, with an fdatasync every 4 MiB (p99 12-40 ms)`;
/// `None` outside `--scenario disk-busy`.
fn disk_load_line(m: &Measured) -> Option<String> {
    let loads: Vec<DiskLoadStats> = m.open.iter().filter_map(|o| o.disk_load).collect();
    let first = loads.first()?;
    let range = |f: fn(&DiskLoadStats) -> f64| {
        let (lo, hi) = loads
            .iter()
            .map(f)
            .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
        (lo, hi)
    };
    let (a_lo, a_hi) = range(|s| s.achieved_mb_s);
    let (p_lo, p_hi) = range(|s| s.sync_p99_ms);
    Some(format!(
        "- the disk-busy co-runner wrote {a_lo:.0}-{a_hi:.0} MB/s (asked {:.0}) into {} beside every open-loop run, \
         with an fdatasync every {} MiB (p99 {p_lo:.1}-{p_hi:.1} ms)",
        first.target_mb_s,
        std::env::temp_dir().display(),
        crate::lab::disk_load::SYNC_EVERY >> 20
    ))
}

/// Each open-loop run's co-runner figure, named as in the table.
fn co_runners_by_run(m: &Measured) -> Vec<(String, Option<CoRunners>)> {
    let mut runs = Vec::new();
    for (r, &row) in m.rows.iter().enumerate() {
        for interval_ms in m.intervals_of(r) {
            let o = &m.open_at(r, interval_ms).out.result;
            let at = match interval_cell(row, interval_ms).as_str() {
                "-" => String::new(),
                cell => format!(" at {cell}"),
            };
            let c = o.platform_probe.as_ref().and_then(|p| p.co_runners);
            runs.push((format!("{}{at}", row.label()), c));
        }
    }
    runs
}

fn print_throughput_table(m: &Measured, plan: &Plan) {
    let source = match plan.scenario {
        Scenario::Normal | Scenario::DiskBusy => "open loop",
        Scenario::Backpressure => "closed loop, the row's sink, under backpressure",
    };
    println!(
        "\nthroughput (closed loop, {} events with the row's sink and {} with the counting sink, at the {} ms base \
         interval; {}) and checkpoints ({source})",
        plan.closed_events,
        plan.count_events(),
        m.base(),
        if plan.rounds > 1 {
            format!("the median of {} interleaved rounds", plan.rounds)
        } else {
            "one round".to_string()
        }
    );
    println!(
        "{:<22} {:>8} | {:>10} {:>10} | {:>5} {:>7} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10}",
        "row",
        "interval",
        "ev/s sink",
        "ev/s count",
        "ckpts",
        "ckpt/s",
        "dur p50",
        "dur p99",
        "align p50",
        "align p99",
        "state B",
        "channel B"
    );
    for (r, &row) in m.rows.iter().enumerate() {
        for interval_ms in m.intervals_of(r) {
            let base = interval_ms == m.base();
            let ck_run = match plan.scenario {
                Scenario::Normal | Scenario::DiskBusy => &m.open_at(r, interval_ms).out.result,
                Scenario::Backpressure => &m.closed[r].result,
            };
            let ck = ck_run.checkpoints.as_ref();
            let ms = |v: f64| format!("{v:.2} ms");
            println!(
                "{:<22} {:>8} | {:>10} {:>10} | {:>5} {:>7} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10}",
                row.label(),
                interval_cell(row, interval_ms),
                if base {
                    si(m.closed[r].result.events_per_sec)
                } else {
                    "·".into()
                },
                if base {
                    si(m.count_of(r).result.events_per_sec)
                } else {
                    "·".into()
                },
                opt(ck, |k| k.completed.to_string()),
                opt(ck, |k| format!("{:.1}", k.completed as f64 / ck_run.seconds)),
                opt(ck, |k| ms(k.duration_ms.p50)),
                opt(ck, |k| ms(k.duration_ms.p99)),
                opt(ck, |k| ms(k.alignment_ms.p50)),
                opt(ck, |k| ms(k.alignment_ms.p99)),
                opt(ck, |k| k.state_bytes.to_string()),
                opt(ck, |k| k.channel_state_bytes.to_string()),
            );
        }
    }
    println!(
        "(ev/s count: the same mode with the counting sink, nothing leaves the process; · : closed loop runs at the \
         base interval only)"
    );
}

/// Throughput per round `xs` against `bases` (same rounds): the median of
/// the rounds' costs (the lower middle of an even count), `cost 4.2% of
/// throughput` or `ran 3.1% faster`, and with several rounds their range:
/// `(3 rounds: 1.0% to 9.5%)`. Each round's cost compares two runs of the
/// same round, seconds apart, not two medians drawn from different rounds.
fn round_cost(xs: &[f64], bases: &[f64]) -> String {
    let mut costs: Vec<f64> = xs
        .iter()
        .zip(bases)
        .filter(|(_, &b)| b > 0.0)
        .map(|(x, b)| (1.0 - x / b) * 100.0)
        .collect();
    if costs.is_empty() {
        return "cost -".into();
    }
    costs.sort_by(f64::total_cmp);
    let text = cost_text(costs[(costs.len() - 1) / 2]);
    if costs.len() == 1 {
        return text;
    }
    format!(
        "{text} ({} rounds: {:.1}% to {:.1}%)",
        costs.len(),
        costs[0],
        costs[costs.len() - 1]
    )
}

/// The run of the median round by events/s (the lower middle of an even
/// count), and every round's events/s in round order.
fn median_round(mut runs: Vec<RunOutput>) -> (RunOutput, Vec<f64>) {
    let eps: Vec<f64> = runs.iter().map(|r| r.result.events_per_sec).collect();
    let mut order: Vec<usize> = (0..runs.len()).collect();
    order.sort_by(|&a, &b| eps[a].total_cmp(&eps[b]));
    let run = runs.swap_remove(order[(order.len() - 1) / 2]);
    (run, eps)
}

/// A throughput cost of `c` percent: `cost 4.2% of throughput`, or for a
/// negative one `ran 3.1% faster`.
fn cost_text(c: f64) -> String {
    if c >= 0.0 {
        format!("cost {c:.1}% of throughput")
    } else {
        format!("ran {:.1}% faster", -c)
    }
}

/// What each row wrote per record in its closed-loop run (the median
/// round's), and the dedup state's size: the documents' storage cost of each
/// way. `None` where the process's I/O counters cannot be read.
fn disk_writes_line(m: &Measured) -> Option<String> {
    let rows: Vec<String> = m
        .rows
        .iter()
        .enumerate()
        .filter_map(|(r, row)| {
            let d = m.closed[r].result.disk_writes?;
            Some(format!(
                "{} {:.0} / {:.0}",
                row.label(),
                d.written_per_record,
                d.to_storage_per_record
            ))
        })
        .collect();
    if rows.is_empty() {
        return None;
    }
    let dedup: Vec<u64> = m
        .rows
        .iter()
        .enumerate()
        .filter(|(_, row)| row.mode == Mode::Dedup)
        .filter_map(|(r, _)| m.closed[r].result.dedup.as_ref())
        .flat_map(|tasks| tasks.iter().map(|t| t.state_bytes))
        .collect();
    let dedup_text = match (dedup.iter().min(), dedup.iter().max()) {
        (Some(lo), Some(hi)) => format!(
            "; dedup state per keyed task {} bytes (a position per input channel, whatever the records; its \
             upstream backup is kept in memory, not written)",
            if lo == hi { lo.to_string() } else { format!("{lo}-{hi}") }
        ),
        _ => String::new(),
    };
    Some(format!(
        "- bytes written per record, closed loop (write calls / pages made dirty for storage, the mapped state's \
         included): {}{dedup_text}",
        rows.join(", ")
    ))
}

fn print_sentences(m: &Measured, plan: &Plan) {
    println!("\nwhat this run measured:");
    let base = m.base();
    let vis = |r: usize, interval_ms: u64| m.open_at(r, interval_ms).out.result.visible_latency_us;
    // Visibility at the base interval, exactly-once rows against the at-least-once one.
    let exactly_once: Vec<String> = m
        .rows
        .iter()
        .enumerate()
        .filter(|(_, r)| r.exactly_once())
        .filter_map(|(r, row)| {
            vis(r, base).map(|v| format!("p50 {} / p99 {} ({})", dur(v.p50), dur(v.p99), row.label()))
        })
        .collect();
    let alo = m.rows.iter().position(|r| r.mode == Mode::AtLeastOnce);
    let alo_text = alo
        .and_then(|a| {
            vis(a, base).map(|v| {
                format!(
                    "; at-least-once ({}) after p50 {} / p99 {}",
                    m.rows[a].label(),
                    dur(v.p50),
                    dur(v.p99)
                )
            })
        })
        .unwrap_or_default();
    println!(
        "- at a {base} ms interval, exactly-once made output visible after {}{alo_text}",
        exactly_once.join(", ")
    );
    if let Some(line) = processing_cost_line(m) {
        println!("{line}");
    }
    // Throughput: the engine's cost (counting sink) and the cost with the sinks.
    let none_count = &m.count_rounds[0];
    let none_row = m.rows.iter().position(|r| r.mode == Mode::None).expect("a none row");
    let none_sink = &m.closed_rounds[none_row];
    for (i, mode) in MODES.iter().enumerate().skip(1) {
        let with_sinks: Vec<String> = m
            .rows
            .iter()
            .enumerate()
            .filter(|(_, r)| r.mode == *mode)
            .map(|(r, row)| {
                format!(
                    "{} {} against {}",
                    row.label(),
                    round_cost(&m.closed_rounds[r], none_sink),
                    m.rows[none_row].label()
                )
            })
            .collect();
        println!(
            "- {} {} against none with the counting sink (closed loop, {} ms); with its sinks: {}",
            mode.name(),
            round_cost(&m.count_rounds[i], none_count),
            base,
            with_sinks.join(", ")
        );
    }
    // The documents' two ways to exactly-once, at equal cadence.
    for sink in [SinkKind::Wal, SinkKind::TwoPcFile] {
        let find = |mode: Mode| m.rows.iter().position(|r| r.mode == mode && r.sink == sink);
        let (Some(d), Some(a)) = (find(Mode::Dedup), find(Mode::Aligned)) else {
            continue;
        };
        let eps = |r: usize| m.closed[r].result.events_per_sec;
        let p99 = |r: usize| vis(r, base).map_or("-".to_string(), |v| dur(v.p99));
        println!(
            "- the two ways to exactly-once with the {} sink: dedup ran {:.0}% of aligned's events/s (closed \
             loop, median rounds) and made output visible after p99 {} against aligned's {} at {base} ms",
            sink.name(),
            100.0 * eps(d) / eps(a).max(1e-9),
            p99(d),
            p99(a)
        );
    }
    if let Some(line) = disk_writes_line(m) {
        println!("{line}");
    }
    // Checkpoints and their syncs, per exactly-once row and interval.
    for (r, row) in m.rows.iter().enumerate().filter(|(_, r)| r.exactly_once()) {
        let parts: Vec<String> = m
            .intervals
            .iter()
            .map(|&i| {
                let o = m.open_at(r, i);
                let ck = o.out.result.checkpoints.as_ref();
                let per_s = ck.map_or(0.0, |k| k.completed as f64 / o.out.result.seconds);
                let v = o.out.result.visible_latency_us;
                let mut s = format!("at {i} ms: {per_s:.1} checkpoints/s");
                if let Some(sy) = o.syncs {
                    s += &format!(
                        ", {:.1} fsyncs per checkpoint (p50 {} / p99 {} each)",
                        sy.per_checkpoint,
                        dur(sy.p50_us),
                        dur(sy.p99_us)
                    );
                }
                if let Some(v) = v {
                    s += &format!(", visible p99 {}", dur(v.p99));
                }
                s
            })
            .collect();
        println!("- {}, open loop: {}", row.label(), parts.join("; "));
    }
    println!(
        "- this disk's {} B append + fdatasync: p50 {} / p99 {} / max {} ({} in {}, at the start of this run)",
        m.disk.bytes,
        dur(m.disk.p50_us),
        dur(m.disk.p99_us),
        dur(m.disk.max_us),
        m.disk.writes,
        m.disk.dir.display()
    );
    if let Some(p) = &m.platform {
        let f = Percentiles::from_ns(&p.latency_ns);
        let excess: Vec<f64> = m
            .open
            .iter()
            .filter_map(|o| o.out.result.excess_us.map(|e| e.p99))
            .collect();
        let (lo, hi) = excess
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), &e| (lo.min(e), hi.max(e)));
        println!(
            "- {} p50 {} / p99 {} / p99.9 {} over the open-loop runs; weir's processing p99 minus its run's \
             platform p99: {} to {}",
            if p.policy == Policy::Spin {
                "a record arriving at a random instant waited for a thread spinning alone on a worker core"
            } else {
                "this machine woke an on-time thread late by"
            },
            dur(f.p50),
            dur(f.p99),
            dur(f.p999),
            signed(lo),
            signed(hi)
        );
        if let Some(line) = co_runner_line(p.co_runners, &co_runners_by_run(m)) {
            println!("{line}");
        }
    }
    if let Some(line) = idle_turns_line(m) {
        println!("{line}");
    }
    if let Some(line) = disk_load_line(m) {
        println!("{line}");
    }
    if plan.scenario == Scenario::Backpressure {
        let parts: Vec<String> = m
            .rows
            .iter()
            .enumerate()
            .filter_map(|(r, row)| {
                m.closed[r].result.checkpoints.as_ref().map(|k| {
                    format!(
                        "{} p50 {:.2} / p99 {:.2} ms",
                        row.label(),
                        k.duration_ms.p50,
                        k.duration_ms.p99
                    )
                })
            })
            .collect();
        println!(
            "- under backpressure (closed loop), checkpoints took {}",
            parts.join(", ")
        );
    }
}

/// What each checkpoint mode costs in processing latency at the base
/// interval: p99 and p99.9 of each row against none's and against
/// at-least-once's (the same open-loop schedule, the platform measured
/// apart so that nothing preempted the workers).
fn processing_cost_line(m: &Measured) -> Option<String> {
    let base = m.base();
    let at = |r: usize| m.open_at(r, base).out.result.latency_us;
    let none = m.rows.iter().position(|r| r.mode == Mode::None)?;
    let alo = m.rows.iter().position(|r| r.mode == Mode::AtLeastOnce)?;
    let (n, a) = (at(none), at(alo));
    let against = |l: Percentiles, b: Percentiles| format!("{} / {}", signed(l.p99 - b.p99), signed(l.p999 - b.p999));
    let rows: Vec<String> = m
        .rows
        .iter()
        .enumerate()
        .filter(|(_, row)| matches!(row.mode, Mode::Aligned | Mode::Unaligned))
        .map(|(r, row)| {
            let l = at(r);
            format!(
                "{} p99 {} / p99.9 {} ({} against none, {} against at-least-once)",
                row.label(),
                dur(l.p99),
                dur(l.p999),
                against(l, n),
                against(l, a)
            )
        })
        .collect();
    Some(format!(
        "- processing latency at {base} ms, p99 / p99.9: none {} / {}, at-least-once {} / {}; {}",
        dur(n.p99),
        dur(n.p999),
        dur(a.p99),
        dur(a.p999),
        rows.join("; ")
    ))
}

/// What one failure cost in each mode.
fn print_failure_table(m: &Measured, plan: &Plan) {
    if m.failures.is_empty() {
        return;
    }
    println!(
        "\nwhat one failure costs: the keyed function panics once, on record {}, open loop at {} events/s, \
         {} ms interval, the WAL sink in the exactly-once modes and the direct sink in the others, their \
         files read back after the run (snapshot modes: the whole job restarts from its latest checkpoint; \
         dedup: the failed subtask recovers alone)",
        plan.failure_record(m.base()),
        si(plan.rate),
        m.base()
    );
    if std::env::var_os("RUST_BACKTRACE").is_some_and(|v| v != "0") {
        println!(
            "  note: RUST_BACKTRACE is set, so the panic prints a backtrace before it unwinds (tens to hundreds \
             of ms, counted below); unset it to measure weir's recovery alone"
        );
    }
    println!(
        "{:<24} {:>10} {:>10} {:>10} {:>18} {:>16} {:>18} {:>20} {:>14} {:>22}",
        "row",
        "restarted",
        "again",
        "caught up",
        "longest gap (ms)",
        "reprocessed",
        "rate after/before",
        "visible gap (ms)",
        "visible back",
        "output"
    );
    for run in &m.failures {
        let Some(f) = &run.out.result.failure else {
            println!(
                "{:<24} the failure did not happen (the record was not processed)",
                failure_label(run.mode, run.stages)
            );
            continue;
        };
        let [gaps, redo, rates] = f.per_subtask(" / ");
        let (visible_gaps, back) = f.visible.as_ref().map_or(("-".to_string(), "-".to_string()), |v| {
            (v.gaps(" / "), ms_text(v.back_ms))
        });
        let output = f.output.map_or("-".to_string(), |o| {
            format!("{} lost, {} twice", o.missing, o.duplicated)
        });
        println!(
            "{:<24} {:>10} {:>10} {:>10} {:>18} {:>16} {:>18} {:>20} {:>14} {:>22}",
            failure_label(run.mode, run.stages),
            ms_text(f.restarted_ms),
            ms_text(f.processing_again_ms),
            ms_text(f.caught_up_ms),
            gaps,
            redo,
            rates,
            visible_gaps,
            back,
            output
        );
    }
    println!(
        "  visible gap: per sink subtask, from its last newly visible record before the failure to its first \
         after; visible back: from the failure until visible latency stayed within its largest of the {} ms \
         before (give or take 10%, at least 1 ms) for {} ms (- : not within {} ms); output: the sink's files read back",
        crate::lab::failure::VISIBLE_LEVEL_MS,
        crate::lab::failure::VISIBLE_STEADY_MS,
        crate::lab::failure::VISIBLE_HORIZON_MS
    );
    if let (Some(d), Some(a)) = (m.failure(Mode::Dedup, 1), m.failure(Mode::Aligned, 1)) {
        // The subtasks that did not fail: those that reprocessed nothing.
        let others: Vec<String> = d
            .reprocessed
            .iter()
            .zip(&d.rate_after_before)
            .filter(|(redo, _)| **redo == 0)
            .filter(|(_, r)| r.is_some())
            .map(|(_, r)| rate_text(*r))
            .collect();
        println!(
            "- dedup's failed subtask processed again after {}, the other subtasks kept {} of their rate and \
             reprocessed nothing; aligned's whole-job recovery processed again after {} and reprocessed [{}] \
             records per sink subtask",
            ms_text(d.processing_again_ms),
            if others.is_empty() {
                "-".to_string()
            } else {
                others.join(", ")
            },
            ms_text(a.processing_again_ms),
            a.per_subtask(", ")[1]
        );
    }
    if let Some(line) = topology_line(m) {
        println!("{line}");
    }
}

/// What the failure runs say of the topology: per mode, processing again
/// and the longest visible gap at each stage count (a snapshot mode
/// restarts the whole job, so more stages mean more tasks to stop, restore
/// and start; dedup recovers the failed subtask of the first stage alone),
/// and whether each grew. `None` with one stage count.
fn topology_line(m: &Measured) -> Option<String> {
    let mut stages: Vec<usize> = m.failures.iter().map(|f| f.stages).collect();
    stages.sort_unstable();
    stages.dedup();
    if stages.len() < 2 {
        return None;
    }
    let widest_gap = |f: &crate::lab::failure::FailureReport| {
        f.visible
            .as_ref()
            .and_then(|v| v.gap_ms.iter().flatten().copied().reduce(f64::max))
    };
    let parts: Vec<String> = [Mode::Aligned, Mode::Unaligned, Mode::Dedup]
        .into_iter()
        .map(|mode| {
            let at: Vec<String> = stages
                .iter()
                .map(|&n| {
                    m.failure(mode, n).map_or(format!("{n}: -"), |f| {
                        format!(
                            "{n}: {} (no new output for {})",
                            ms_text(f.processing_again_ms),
                            ms_text(widest_gap(f))
                        )
                    })
                })
                .collect();
            format!("{} at {}", mode.name(), at.join(", "))
        })
        .collect();
    let (lo, hi) = (stages[0], stages[stages.len() - 1]);
    let grew = |mode: Mode| match (m.failure(mode, lo), m.failure(mode, hi)) {
        (Some(a), Some(b)) => b.processing_again_ms.unwrap_or(0.0) > a.processing_again_ms.unwrap_or(f64::MAX),
        _ => false,
    };
    let verdict = if grew(Mode::Aligned) && grew(Mode::Unaligned) {
        format!("a snapshot failure's recovery took longer at {hi} stages than at {lo}")
    } else {
        format!("a snapshot failure's recovery did not take longer at {hi} stages than at {lo} in every mode")
    };
    let dedup = match (m.failure(Mode::Dedup, lo), m.failure(Mode::Dedup, hi)) {
        (Some(_), Some(_)) if grew(Mode::Dedup) => "dedup's, of the failed subtask alone, took longer too".to_string(),
        (Some(_), Some(_)) => "dedup's, of the failed subtask alone, did not".to_string(),
        _ => "dedup's was not measured at both".to_string(),
    };
    Some(format!(
        "- as the topology grows, keyed stages one after another, the failure in the first, processing again \
         after it: {}; {verdict}, {dedup}",
        parts.join("; ")
    ))
}

fn write_json(path: &std::path::Path, scenario: &'static str, m: &Measured, machine: &Machine) -> Result<(), CliError> {
    let io = |source| CliError::Io {
        path: path.display().to_string(),
        source,
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    let mut lines = Vec::new();
    let interval = |mode: Mode, i: u64| (mode != Mode::None).then_some(i);
    for (i, mode) in MODES.iter().enumerate() {
        lines.push(JsonRow {
            run: "closed-loop-count",
            scenario,
            row: format!("{}·count", mode.name()),
            interval_ms: interval(*mode, m.base()),
            syncs: None,
            rounds_events_per_sec: Some(&m.count_rounds[i]),
            disk_load: None,
            result: &m.count[i].result,
        });
    }
    for (r, row) in m.rows.iter().enumerate() {
        lines.push(JsonRow {
            run: "closed-loop",
            scenario,
            row: row.label(),
            interval_ms: interval(row.mode, m.base()),
            syncs: None,
            rounds_events_per_sec: Some(&m.closed_rounds[r]),
            disk_load: None,
            result: &m.closed[r].result,
        });
    }
    for o in &m.open {
        let row = m.rows[o.row];
        lines.push(JsonRow {
            run: "open-loop",
            scenario,
            row: row.label(),
            interval_ms: interval(row.mode, o.interval_ms),
            syncs: o.syncs,
            rounds_events_per_sec: None,
            disk_load: o.disk_load,
            result: &o.out.result,
        });
    }
    for f in &m.failures {
        let (mode, out) = (&f.mode, &f.out);
        lines.push(JsonRow {
            run: "failure",
            scenario,
            row: failure_label(*mode, f.stages),
            interval_ms: interval(*mode, m.base()),
            syncs: None,
            rounds_events_per_sec: None,
            disk_load: None,
            result: &out.result,
        });
    }
    let mut text = String::new();
    for l in &lines {
        text += &serde_json::to_string(l).expect("rows serialise");
        text.push('\n');
    }
    text += &serde_json::to_string(&JsonDisk {
        run: "disk-probe",
        scenario,
        probe: &m.disk,
        machine,
    })
    .expect("the disk probe serialises");
    text.push('\n');
    let mut f = std::fs::File::create(path).map_err(io)?;
    f.write_all(text.as_bytes()).map_err(io)
}

fn figure(m: &Measured, plan: &Plan) -> Figure {
    let base = m.base();
    let at_base = |r: usize| &m.open_at(r, base).out;
    let mut processing: Vec<Curve> = m
        .rows
        .iter()
        .enumerate()
        .map(|(r, row)| Curve {
            name: row.label(),
            color: Some(r),
            latency_ns: at_base(r).latency_ns.clone(),
        })
        .collect();
    if let Some(p) = &m.platform {
        processing.push(Curve {
            name: "platform (all open-loop runs)".into(),
            color: None,
            latency_ns: p.latency_ns.clone(),
        });
    }
    Figure {
        title: format!("{} ({})", plan.pipeline.name(), plan.scenario.name()),
        base_interval_ms: base,
        visible: m
            .rows
            .iter()
            .enumerate()
            .map(|(r, row)| Curve {
                name: row.label(),
                color: Some(r),
                latency_ns: at_base(r).visible_latency_ns.clone(),
            })
            .collect(),
        processing,
        sweep: m
            .rows
            .iter()
            .enumerate()
            .filter(|(_, row)| row.exactly_once())
            .map(|(r, row)| Sweep {
                name: row.label(),
                color: r,
                points: m
                    .intervals
                    .iter()
                    .filter_map(|&i| {
                        m.open_at(r, i)
                            .out
                            .result
                            .visible_latency_us
                            .map(|v| (i as f64, v.p50, v.p99))
                    })
                    .collect(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_that_lost_over_a_millisecond_to_other_threads_are_named() {
        let lost = |total_ms: f64, worst_us: f64| CoRunners {
            windows: 3,
            worst_us,
            total_ms,
            workers: 1,
            window_ms: 10,
        };
        let runs = vec![
            ("none·direct".to_string(), Some(lost(0.4, 200.0))),
            ("unaligned·wal at 100 ms".to_string(), Some(lost(3.1, 2200.0))),
            ("aligned·wal at 10 ms".to_string(), None),
        ];
        let line = co_runner_line(Some(lost(3.5, 2200.0)), &runs).expect("measured");
        assert!(line.starts_with("- the workers lost 3.5 ms in all"), "{line}");
        assert!(
            line.ends_with(": unaligned·wal at 100 ms 3.1 ms (at most 2.20 ms in a 10 ms window)"),
            "{line}"
        );
        let quiet = co_runner_line(Some(lost(0.4, 200.0)), &runs[..1]).expect("measured");
        assert!(quiet.ends_with(": no row over 1 ms"), "{quiet}");
        assert_eq!(co_runner_line(None, &runs), None);
    }

    #[test]
    fn a_cost_is_the_median_of_the_rounds_with_their_range() {
        // Round costs: 10%, 50%, -20%.
        let text = round_cost(&[90.0, 50.0, 120.0], &[100.0, 100.0, 100.0]);
        assert_eq!(text, "cost 10.0% of throughput (3 rounds: -20.0% to 50.0%)");
        assert_eq!(round_cost(&[110.0], &[100.0]), "ran 10.0% faster");
        // Rounds without a base are left out; none at all says so.
        assert_eq!(round_cost(&[90.0, 1.0], &[100.0, 0.0]), "cost 10.0% of throughput");
        assert_eq!(round_cost(&[90.0], &[0.0]), "cost -");
        // An even count takes the lower middle.
        assert_eq!(
            round_cost(&[90.0, 70.0], &[100.0, 100.0]),
            "cost 10.0% of throughput (2 rounds: 10.0% to 30.0%)"
        );
    }
}
