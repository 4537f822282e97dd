//! `weir bench`: run a benchmark job and report throughput and latency.

use std::io::{IsTerminal, Write};
use std::sync::atomic::Ordering;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use weir_core::{clock, CheckpointConfig, JobHandle, Outcome, RuntimeConfig};

use crate::cli::{CliError, Mode};

use crate::lab::pipelines::{build, Kind, SinkKind, Spec, StateBackend, Totals};
use crate::lab::platform::{PlatformProbe, PlatformResult};
use crate::lab::report::{
    copy_line, endpoint_line, excess_line, header, parts_line, platform_row, row, warmup_line, BenchResult,
    CheckpointSummary, Excess, Machine, Percentiles, ProbeInfo, Syncs,
};
use crate::lab::worker_gaps::{self, spin_run, Gaps};

/// Arguments of `weir bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Which job to run.
    #[arg(long, value_enum, default_value = "keyed")]
    pub pipeline: Kind,
    /// Records to generate [default: 100000000 closed loop, 5 s worth with --rate].
    #[arg(long)]
    pub events: Option<u64>,
    /// Open loop at this many records per second (total); omit for full speed.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Distinct keys.
    #[arg(long, default_value_t = 10_000)]
    pub keys: u64,
    /// Parallelism of every operator; a comma-separated list runs a sweep
    /// [default: one per core].
    #[arg(long, value_delimiter = ',')]
    pub parallelism: Vec<usize>,
    /// Worker threads [default: one per core used, min(parallelism, cores)].
    #[arg(long)]
    pub workers: Option<usize>,
    /// Slots per ring.
    #[arg(long, default_value_t = RuntimeConfig::default().ring_capacity)]
    pub ring_capacity: usize,
    /// Records per scheduling turn.
    #[arg(long, default_value_t = RuntimeConfig::default().batch_size)]
    pub batch_size: usize,
    /// Generator seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Checkpoint mode.
    #[arg(long, value_enum, default_value = "none")]
    pub mode: Mode,
    /// Keyed pipeline: where the per-key state lives.
    #[arg(long, value_enum, default_value = "mapped")]
    pub state: StateBackend,
    /// Also write every record through this sink and measure when output
    /// becomes visible (exactly-once sinks: at checkpoint completion).
    #[arg(long, value_enum, default_value = "count")]
    pub sink: SinkKind,
    /// Time between checkpoints, in milliseconds.
    #[arg(long, default_value_t = 100)]
    pub checkpoint_interval_ms: u64,
    /// Open loop: the records scheduled in the first this-many ms (at most
    /// a quarter of the run) are the warm-up: processed, checkpointed and
    /// written like the rest, but left out of the latency figures (the
    /// job's start-up is not its steady state). 0 measures every record.
    #[arg(long, default_value_t = crate::lab::pipelines::DEFAULT_WARMUP_MS)]
    pub warmup_ms: u64,
    /// Keyed job: keyed operators one after another (1 to 8), each behind
    /// an exchange by a key of its own, so that a record crosses subtasks
    /// at every stage: a larger topology, for what a failure costs as it
    /// grows (the failure is injected in the first stage by default, see
    /// `--fail-stage`). Behind the second exchange on, dedup aligns
    /// barriers (docs/design/dedup.md).
    #[arg(long, default_value_t = 1)]
    pub stages: usize,
    /// Keyed job: the keyed function panics once, on the record with this
    /// sequence number, and the job restarts from its latest checkpoint
    /// (one restart allowed); prints what the failure cost: when the
    /// failed path processed again, when the job caught up with its
    /// schedule, each sink subtask's longest output gap and the records it
    /// received again; with a sink that makes output visible, how long a
    /// reader saw no new output and when its latency was back, then the
    /// sink's files read back (a record lost, or written twice in an
    /// exactly-once mode, fails the run).
    #[arg(long)]
    pub fail_at_record: Option<u64>,
    /// With `--fail-at-record`: the keyed stage whose function fails (1:
    /// the first, farthest from the sink; at most `--stages`).
    #[arg(long, default_value_t = 1)]
    pub fail_stage: usize,
    /// Checkpoints in flight at once.
    #[arg(long, default_value_t = 1)]
    pub max_concurrent_checkpoints: usize,
    /// Where checkpoints go [default: a temporary folder, removed afterwards].
    #[arg(long)]
    pub checkpoint_dir: Option<std::path::PathBuf>,
    /// Where keyed state's memory-mapped working files live
    /// (`RuntimeConfig::state_dir`) [default: the runtime's default].
    #[arg(long)]
    pub state_dir: Option<std::path::PathBuf>,
    /// Append one JSON object per run to this file.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// How open-loop runs measure the machine's own delay, printed beside
    /// weir's latency: `spin`, a thread spinning alone on each worker core
    /// for 1 s right before the run (the wait of a record arriving at a
    /// random instant until it runs again: what an engine that costs
    /// nothing would show); `fifo`, a SCHED_FIFO thread per worker core
    /// waking every 200 µs during the run, which preempts the workers
    /// (weir's own p99 at 200,000 records/s then rises by about 12 µs
    /// here), kept to compare the two; `off`.
    #[arg(long, value_enum, default_value = "spin")]
    pub platform_probe: Platform,
    /// Where records come from: the in-process generator, or a Kafka topic
    /// (`--source kafka --sink kafka`: the keyed count from topic to topic,
    /// see docs/guide/kafka.md).
    #[arg(long, value_enum, default_value = "generator")]
    pub source: SourceKind,
    /// Kafka: bootstrap servers `HOST:PORT[,...]` [default: start a broker
    /// with bench/peers/kafka/kafka.sh for this run].
    #[arg(long)]
    pub brokers: Option<String>,
    /// Kafka: partitions of the input and output topics.
    #[arg(long, default_value_t = 2)]
    pub partitions: i32,
    /// Kafka: a librdkafka setting `KEY=VALUE` for the job's clients (the
    /// source's consumers and the sink's producers), after weir's own;
    /// repeatable. For comparing client settings within one build.
    #[arg(long = "kafka-set", value_name = "KEY=VALUE", value_parser = parse_kafka_setting)]
    pub kafka_set: Vec<(String, String)>,
    /// Kafka, closed loop: the input topic, filled with --events records if
    /// empty and reused as long as it holds exactly that many [default: a
    /// fresh topic per run].
    #[arg(long)]
    pub topic: Option<String>,
    /// Kafka, open loop: run no weir job. Feed topic IN at --rate with the
    /// same load and read topic OUT read_committed as for weir's own job,
    /// with another engine's keyed count running between them (output
    /// values `key,count,stamp`, the input's stamp passed through). The
    /// schedule starts once OUT shows the first output of a slow trickle,
    /// and its first 5 s (a JVM's warm-up) are not recorded (--events:
    /// 13 s of the rate by default);
    /// --mode says what to check (at-least-once: every count seen; aligned:
    /// exactly once) and --checkpoint-interval-ms labels the row.
    /// bench/peers/kafka/compare.sh runs Apache Flink's job this way.
    #[arg(long, value_name = "IN:OUT")]
    pub external_job: Option<String>,
    /// Serve the job's metrics while it runs: PORT (on 127.0.0.1) or
    /// IP:PORT (0.0.0.0:PORT exposes the unauthenticated endpoint to the
    /// network). Paths: / (live page), /metrics, /api/job.
    #[arg(long, value_parser = crate::cli::metrics_arg::parse)]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Measure what the metrics endpoint costs within one run: one
    /// unbounded closed-loop job, its endpoint served (on --metrics-addr,
    /// default any free loopback port), alternating short segments with the
    /// endpoint on (sampler running, scraped over TCP) and off (nothing of
    /// it running), in ABBA pairs; prints the on/off throughput ratio with a
    /// 95% confidence interval (docs/benchmarks.md).
    #[arg(long)]
    pub metrics_ab: bool,
    /// --metrics-ab: measured time, seconds (after the warm-up).
    #[arg(long, default_value_t = 300.0)]
    pub ab_seconds: f64,
    /// --metrics-ab: mean segment length, milliseconds (each pair's is
    /// jittered ±25%).
    #[arg(long, default_value_t = 400)]
    pub ab_segment_ms: u64,
    /// --metrics-ab: warm-up before the first segment, milliseconds.
    #[arg(long, default_value_t = 3000)]
    pub ab_warmup_ms: u64,
    /// --metrics-ab: scrapes per second in on segments, each fetching
    /// /metrics and /api/job (1: a dashboard or a Prometheus scraping every
    /// second; 0: the sampler alone).
    #[arg(long, default_value_t = 1.0)]
    pub scrape_per_s: f64,
}

/// Where `weir bench` reads its records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SourceKind {
    /// The in-process generator.
    Generator,
    /// A Kafka topic, filled by the benchmark's producer.
    Kafka,
}

/// How a run measures the machine's own delay beside weir's latency (open
/// loop only: a closed-loop run's latency is queueing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Platform {
    /// A thread spinning alone on each worker core for 1 s right before
    /// the run (`worker_gaps`): preempts nothing of weir's.
    Spin,
    /// A `SCHED_FIFO` thread per worker core waking every 200 µs during
    /// the run (`platform`): preempts the workers, so weir's figures
    /// include its cost.
    Fifo,
    /// Not measured.
    Off,
}

/// A run's platform measurement, started right before its job: a spin run
/// is over by then (it takes its own time), the probe runs until
/// [`PlatformRun::finish`].
pub enum PlatformRun {
    /// What the spin run measured.
    Spun(PlatformResult),
    /// The `SCHED_FIFO` probe, running.
    Probing(PlatformProbe),
    /// Not measured.
    Off,
}

impl PlatformRun {
    /// Stops the probe if it runs; what was measured.
    pub fn finish(self) -> Option<PlatformResult> {
        match self {
            PlatformRun::Spun(r) => Some(r),
            PlatformRun::Probing(p) => Some(p.stop()),
            PlatformRun::Off => None,
        }
    }
}

impl Platform {
    /// Measures the first `cores` cores (worker `w` runs on core `w`) by
    /// this method: spins there now, or starts the probe.
    pub fn start(self, cores: usize) -> PlatformRun {
        match self {
            Platform::Spin => PlatformRun::Spun(spin_run(cores, worker_gaps::DEFAULT_SPIN)),
            Platform::Fifo => PlatformRun::Probing(PlatformProbe::start(cores)),
            Platform::Off => PlatformRun::Off,
        }
    }

    /// The method for a run that is open loop or not.
    pub fn for_run(self, open_loop: bool) -> Platform {
        if open_loop {
            self
        } else {
            Platform::Off
        }
    }
}

/// Runs `weir bench`.
pub fn run(args: &BenchArgs) -> Result<Vec<BenchResult>, CliError> {
    if args.metrics_ab {
        let plan = crate::lab::metrics_ab::AbPlan {
            seconds: args.ab_seconds,
            segment: Duration::from_millis(args.ab_segment_ms),
            warmup: Duration::from_millis(args.ab_warmup_ms),
            scrape_per_s: args.scrape_per_s,
            seed: args.seed,
        };
        let report = crate::lab::metrics_ab::run(args, &plan)?;
        print!("{}", crate::lab::metrics_ab::text(&report));
        if let Some(path) = &args.json {
            append_json(path, &report)?;
        }
        return Ok(Vec::new());
    }
    if args.fail_at_record.is_some() && (args.source == SourceKind::Kafka || args.sink == SinkKind::Kafka) {
        return Err(CliError::Usage(
            "--fail-at-record runs the generator's keyed job, with any sink but Kafka's; the Kafka path's \
             failures are tested by the crash and broker-restart tests"
                .into(),
        ));
    }
    match (args.source, args.sink) {
        (SourceKind::Kafka, SinkKind::Kafka) => return crate::lab::kafka_bench::run(args).map(|_| Vec::new()),
        (SourceKind::Kafka, _) | (_, SinkKind::Kafka) => {
            return Err(CliError::Usage(
                "the Kafka benchmark reads and writes Kafka: --source kafka --sink kafka".into(),
            ))
        }
        _ => {}
    }
    if args.keys == 0 {
        return Err(CliError::Usage("--keys must be at least 1".into()));
    }
    if let Some(r) = args.rate {
        if !(r.is_finite() && r > 0.0) {
            return Err(CliError::Usage(format!("--rate must be a positive number, got {r}")));
        }
    }
    let events = args.events.unwrap_or(match args.rate {
        None => 100_000_000,
        Some(r) => ((r * 5.0) as u64).max(1000),
    });
    if events == 0 {
        return Err(CliError::Usage("--events must be at least 1".into()));
    }
    if !(1..=crate::lab::pipelines::MAX_STAGES).contains(&args.stages) {
        return Err(CliError::Usage(format!(
            "--stages must be between 1 and {}, got {}",
            crate::lab::pipelines::MAX_STAGES,
            args.stages
        )));
    }
    if args.stages > 1 && args.pipeline != Kind::Keyed {
        return Err(CliError::Usage("--stages needs --pipeline keyed".into()));
    }
    if let Some(at) = args.fail_at_record {
        if args.pipeline != Kind::Keyed {
            return Err(CliError::Usage("--fail-at-record needs --pipeline keyed".into()));
        }
        if at >= events {
            return Err(CliError::Usage(format!(
                "--fail-at-record {at}: the run has records 0 to {}",
                events - 1
            )));
        }
    }
    if !(1..=args.stages).contains(&args.fail_stage) {
        return Err(CliError::Usage(format!(
            "--fail-stage {}: the job has keyed stages 1 to {} (--stages)",
            args.fail_stage, args.stages
        )));
    }
    let cores = weir_core::available_cores();
    let sweep = if args.parallelism.is_empty() {
        vec![cores]
    } else {
        args.parallelism.clone()
    };
    let mut results = Vec::new();
    println!("{}", header());
    for &parallelism in &sweep {
        let spec = Spec {
            kind: args.pipeline,
            events,
            rate: args.rate,
            keys: args.keys,
            parallelism,
            seed: args.seed,
            slow_ns: 0,
            state: args.state,
            stages: args.stages,
            sink: args.sink,
            sink_dir: std::path::PathBuf::new(),
            warmup_ms: args.warmup_ms,
            failure: args.fail_at_record.map(|at| {
                // The timeline covers the schedule and a margin (closed
                // loop: the cap).
                let ms = args
                    .rate
                    .map_or(usize::MAX, |r| (events as f64 / r * 1e3) as usize * 2 + 10_000);
                crate::lab::failure::FailureProbe::in_stage(at, args.fail_stage, parallelism, ms)
            }),
        };
        if args.checkpoint_interval_ms == 0 {
            return Err(CliError::Usage("--checkpoint-interval-ms must be at least 1".into()));
        }
        let (dir, temporary) = match &args.checkpoint_dir {
            Some(d) => (d.clone(), false),
            None => (temp_checkpoint_dir(), true),
        };
        let mut config = config_for(args, parallelism, &dir);
        // Stateless, closed loop: the copy bandwidth of this moment, to
        // read the job's bytes/s against (measured before the job, on as
        // many threads as it has workers).
        let copy = (args.pipeline == Kind::Stateless && args.rate.is_none())
            .then(|| crate::lab::copy_probe::measure(config.workers.min(parallelism), args.batch_size));
        // Keyed, closed loop: the ceiling its parts give at this moment
        // (ring and map microbenchmarks, `parts_probe`), measured before
        // the job like the copy bandwidth. At parallelism 1 the keyed
        // subtask runs on its source's worker and takes each batch by
        // reference: no ring on the path.
        let parts = (args.pipeline == Kind::Keyed && args.rate.is_none()).then(|| {
            crate::lab::parts_probe::measure(
                config.workers.min(parallelism),
                args.keys,
                args.batch_size,
                args.ring_capacity,
                parallelism > 1,
            )
        });
        config.metrics_addr = args.metrics_addr;
        let result = run_one(
            &spec,
            config,
            args.mode,
            args.platform_probe.for_run(args.rate.is_some()),
        )
        .map(|mut r| {
            r.copy = copy;
            r.parts = parts;
            r
        });
        if temporary {
            let _ = std::fs::remove_dir_all(&dir);
        }
        let mut result = result?;
        if args.pipeline == Kind::Keyed && args.rate.is_none() {
            result.scaling = fit_scaling(&results, &result, args.batch_size, args.keys);
        }
        println!("{}", row(&result));
        if let Some(p) = platform_row(&result) {
            println!("{p}");
        }
        if let Some(c) = copy_line(&result) {
            println!("    {c}");
        }
        if let Some(c) = parts_line(&result) {
            println!("    {c}");
        }
        if let Some(e) = excess_line(&result) {
            println!("    {e}");
        }
        if let Some(w) = warmup_line(&result) {
            println!("    {w}");
        }
        if let Some(tasks) = &result.dedup {
            let parts: Vec<String> = tasks
                .iter()
                .map(|t| {
                    format!(
                        "{}: {} B of positions, backup {} B at the last snapshot (at most {} B, {} overflows)",
                        t.task, t.state_bytes, t.backup_bytes, t.backup_peak_bytes, t.backup_overflows
                    )
                })
                .collect();
            println!("    dedup state: {}", parts.join("; "));
        }
        if let Some(f) = &result.failure {
            println!("    {}", f.line());
            if result.sink_records > result.events {
                println!(
                    "    at-least-once: {} records reached the count sink twice (they had passed its barrier \
                     before the checkpoint's other inputs)",
                    result.sink_records - result.events
                );
            }
        }
        if let Some(e) = endpoint_line(&result) {
            println!("    {e}");
        }
        if let Some(f) = &result.fsyncs {
            println!(
                "    fsyncs: {:.1} per checkpoint (p50 {:.1} µs / p99 {:.1} µs each)",
                f.per_checkpoint, f.p50_us, f.p99_us
            );
        }
        if let Some(v) = &result.visible_latency_us {
            println!(
                "    visible in the {} sink's target: p50 {:.1} µs, p99 {:.1} µs, p99.9 {:.1} µs, max {:.1} µs",
                result.sink.name(),
                v.p50,
                v.p99,
                v.p999,
                v.max
            );
        }
        if let Some(m) = &result.scaling {
            println!("{}", m.describe());
        }
        if let Some(path) = &args.json {
            append_json(path, &result)?;
        }
        results.push(result);
    }
    Ok(results)
}

/// The scaling model, fitted when `latest` and an earlier run of the sweep
/// are the one- and two-worker runs of the same job (in either order),
/// with the one-way handoff between the runs' cores and the exchange's
/// routing measured now (and the handoff measured just before the
/// two-worker run, which tells whether the host changed state around it),
/// and the sweep's source batches of `batch` records over `keys` keys.
fn fit_scaling(
    earlier: &[BenchResult],
    latest: &BenchResult,
    batch: usize,
    keys: u64,
) -> Option<crate::lab::scaling_model::Model> {
    let workers_of = |r: &BenchResult| (r.workers, r.parallelism);
    let other = match workers_of(latest) {
        (1, 1) => (2, 2),
        (2, 2) => (1, 1),
        _ => return None,
    };
    let peer = earlier.iter().rev().find(|r| workers_of(r) == other)?;
    let (one, two) = if latest.workers == 1 {
        (latest, peer)
    } else {
        (peer, latest)
    };
    let handoff = crate::lab::handoff_probe::one_way_ns()?;
    let route = crate::lab::parts_probe::route_ns(keys, batch);
    let before = two.parts.and_then(|p| p.handoff_ns);
    // One worker takes its batches by reference; two send every record
    // through a ring: its trip, from the one-core ring probe measured
    // before the one-worker run.
    let ring = one
        .parts
        .filter(|p| !p.ring_on_path && p.ring_items_per_sec > 0.0)
        .map_or(0.0, |p| 1e9 / p.ring_items_per_sec);
    crate::lab::scaling_model::Model::fit(one.events_per_sec, two.events_per_sec, batch, handoff, route, ring)
        .map(|m| m.with_handoff_before(before))
}

/// One run's result with the raw data behind it (for plots).
pub struct RunOutput {
    /// The row.
    pub result: BenchResult,
    /// End-to-end latency, nanoseconds.
    pub latency_ns: hdrhistogram::Histogram<u64>,
    /// From emission until visible in the sink's target, nanoseconds
    /// (empty for the counting sink).
    pub visible_latency_ns: hdrhistogram::Histogram<u64>,
    /// What the platform probe measured during the run (`None`: it was off).
    pub platform: Option<PlatformResult>,
}

/// The runtime configuration of a `weir bench` run of `parallelism`,
/// checkpointing (if at all) into `dir`.
pub fn config_for(args: &BenchArgs, parallelism: usize, dir: &std::path::Path) -> RuntimeConfig {
    // One worker per core used: `--parallelism 1,2` compares one core
    // with two (more workers than tasks would idle).
    let cores = weir_core::available_cores();
    let mut config = runtime_config(
        args.workers.unwrap_or(parallelism.clamp(1, cores)),
        args.ring_capacity,
        args.batch_size,
        args.mode,
        args.checkpoint_interval_ms,
        dir,
    );
    if let Some(c) = config.checkpointing.as_mut() {
        c.max_concurrent = args.max_concurrent_checkpoints;
    }
    if let Some(d) = &args.state_dir {
        config.state_dir = Some(d.clone());
    }
    config
}

/// The runtime configuration of a benchmark run.
pub fn runtime_config(
    workers: usize,
    ring_capacity: usize,
    batch_size: usize,
    mode: Mode,
    interval_ms: u64,
    dir: &std::path::Path,
) -> RuntimeConfig {
    RuntimeConfig {
        workers,
        ring_capacity,
        batch_size,
        checkpointing: mode.checkpoint_mode().map(|m| CheckpointConfig {
            interval: Duration::from_millis(interval_ms),
            restore: weir_core::RestoreFrom::Nothing,
            retained: 1,
            // The benchmark's operators are deterministic: under dedup a
            // failed subtask recovers alone in any keyed stage.
            dedup_deterministic: true,
            ..CheckpointConfig::new(m, dir)
        }),
        ..RuntimeConfig::default()
    }
}

/// A fresh temporary checkpoint folder for one run.
pub fn temp_checkpoint_dir() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("weir-bench-{}-{}", std::process::id(), clock::now_ns()))
}

fn run_one(spec: &Spec, config: RuntimeConfig, mode: Mode, probe: Platform) -> Result<BenchResult, CliError> {
    run_one_full(spec, config, mode, probe).map(|o| o.result)
}

/// A fresh temporary folder for a run's sink output, removed afterwards.
pub fn temp_sink_dir() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("weir-sink-{}-{}", std::process::id(), clock::now_ns()))
}

/// Runs one benchmark job and checks its output count; the platform is
/// measured on the workers' cores by `probe`'s method. A run
/// with a failure probe restarts once, at once, whatever `config` says.
pub fn run_one_full(
    spec: &Spec,
    mut config: RuntimeConfig,
    mode: Mode,
    probe: Platform,
) -> Result<RunOutput, CliError> {
    if spec.failure.is_some() {
        // One injected failure, one restart, at once.
        config.restart = weir_core::RestartStrategy::FixedDelay {
            attempts: 1,
            delay: std::time::Duration::ZERO,
        };
    }
    let mut spec = spec.clone();
    let cleanup = spec.sink != SinkKind::Count && spec.sink_dir.as_os_str().is_empty();
    if cleanup {
        spec.sink_dir = temp_sink_dir();
    }
    let out = run_one_inner(&spec, config, mode, probe).and_then(|out| check_failure_output(&spec, mode, out));
    if cleanup {
        let _ = std::fs::remove_dir_all(&spec.sink_dir);
    }
    out
}

/// After a failure run with a sink that writes `key,value,seq` lines (the
/// direct, WAL and two-phase file sinks), reads its files back: every
/// record must be there, and once in the exactly-once modes. The figures go
/// into the failure report.
fn check_failure_output(spec: &Spec, mode: Mode, mut out: RunOutput) -> Result<RunOutput, CliError> {
    let lines = matches!(spec.sink, SinkKind::Direct | SinkKind::Wal | SinkKind::TwoPcFile);
    let Some(report) = out.result.failure.as_mut().filter(|_| lines) else {
        return Ok(out);
    };
    let dir = spec.sink_dir.join("out");
    let check = crate::lab::failure::OutputCheck::of_files(&dir, spec.events)
        .map_err(|e| CliError::Wrong(format!("the failure run's output could not be checked: {e}")))?;
    if check.missing > 0 || (mode.exactly_once() && check.duplicated > 0) {
        return Err(CliError::Wrong(format!(
            "{} with the {} sink: after one failure its files hold {} lines, {} records missing and {} \
             duplicated ({})",
            mode.name(),
            spec.sink.name(),
            check.lines,
            check.missing,
            check.duplicated,
            dir.display()
        )));
    }
    report.output = Some(check);
    Ok(out)
}

fn run_one_inner(spec: &Spec, config: RuntimeConfig, mode: Mode, probe: Platform) -> Result<RunOutput, CliError> {
    let totals = Totals::default();
    let workers = config.workers;
    // Tasks of the job: one chain per subtask, two for the keyed job (the
    // exchange splits it).
    let tasks = match spec.kind {
        Kind::Keyed => 2 * spec.parallelism,
        _ => spec.parallelism,
    };
    // Worker w runs on core w: the platform figure covers the cores the
    // workers use; the spin run takes its own time, before the job.
    let probe = probe.start(workers.min(weir_core::available_cores()));
    // Every generator subtask shares one schedule origin, slightly in the
    // future so that thread start-up is not counted as latency.
    let start_ns = clock::now_ns() + 5_000_000;
    let syncs_before = weir_core::disk::sync_stats();
    let io_before = crate::lab::disk_writes::IoCounters::now();
    let ran = build(spec, start_ns, &totals).run(config).and_then(|job| {
        // The platform figure leaves the warm-up out, as the latency does.
        if let Some(rate) = spec.rate {
            job.measure_worker_delays_from(start_ns + (spec.warmup_records() as f64 / rate * 1e9) as u64);
        }
        crate::cli::metrics_arg::announce(&job);
        watch(&job, spec.events);
        job.join()
    });
    let io_after = crate::lab::disk_writes::IoCounters::now();
    // Stopped whatever happened, so that its threads never outlive the run.
    let platform = probe.finish();
    let result = ran?;
    if result.outcome != Outcome::Finished {
        return Err(CliError::Wrong("the job was cancelled".into()));
    }
    let delivered = totals.count.load(Ordering::Relaxed);
    let failure = spec.failure.as_ref().and_then(|p| p.report(spec.parallelism));
    if let Some(expected) = spec.kind.expected_output(spec.events) {
        // A failure under at-least-once delivers the replayed records
        // again: more, never fewer.
        let duplicates_allowed = failure.is_some() && mode == Mode::AtLeastOnce;
        if delivered < expected || (delivered > expected && !duplicates_allowed) {
            return Err(CliError::Wrong(format!(
                "{delivered} records reached the sinks, expected {expected}"
            )));
        }
    }
    let seconds = result.elapsed.as_secs_f64();
    let latency_us = Percentiles::from_ns(&result.metrics.latency_ns);
    let open = spec.rate.is_some();
    let platform_us = platform.as_ref().map(|p| Percentiles::from_ns(&p.latency_ns));
    let row = BenchResult {
        pipeline: spec.kind.name(),
        mode: mode.name(),
        state: spec.state,
        parallelism: spec.parallelism,
        workers,
        keys: spec.keys,
        rate: spec.rate,
        events: spec.events,
        warmup_records: spec.warmup_records(),
        sink_records: delivered,
        seconds,
        events_per_sec: spec.events as f64 / seconds,
        events_per_sec_per_worker: spec.events as f64 / seconds / workers.min(tasks).max(1) as f64,
        copy: None,
        parts: None,
        scaling: None,
        latency_us,
        sink: spec.sink,
        visible_latency_us: (spec.sink != SinkKind::Count && !result.metrics.visible_latency_ns.is_empty())
            .then(|| Percentiles::from_ns(&result.metrics.visible_latency_ns)),
        checkpoints: mode
            .checkpoint_mode()
            .map(|_| CheckpointSummary::from_stats(&result.metrics.checkpoints)),
        platform_us,
        platform_probe: platform.as_ref().map(ProbeInfo::of),
        worker_gaps: open.then(|| Gaps::of(&result.metrics.worker_delays)),
        excess_us: platform_us.map(|p| Excess::of(&latency_us, &p)),
        metrics_endpoint_cpu_s: result.metrics_endpoint_cpu.map(|d| d.as_secs_f64()),
        fsyncs: (result.metrics.checkpoints.completed > 0).then(|| {
            Syncs::of(
                &weir_core::disk::sync_stats().since(&syncs_before),
                result.metrics.checkpoints.completed,
            )
        }),
        failure,
        stages: spec.stages,
        disk_writes: crate::lab::disk_writes::DiskWrites::between(io_before, io_after, spec.events),
        dedup: (mode == Mode::Dedup).then(|| {
            result
                .metrics
                .tasks
                .iter()
                .filter(|t| t.input_capacity > 0)
                .map(|t| crate::lab::report::DedupTask {
                    task: format!("{}[{}]", t.name, t.subtask),
                    state_bytes: t.dedup_state_bytes,
                    backup_bytes: t.backup_bytes,
                    backup_peak_bytes: t.backup_peak_bytes,
                    backup_overflows: t.backup_overflows,
                })
                .collect()
        }),
        machine: Machine::here(),
    };
    Ok(RunOutput {
        result: row,
        latency_ns: result.metrics.latency_ns,
        visible_latency_ns: result.metrics.visible_latency_ns,
        platform,
    })
}

/// Shows a progress bar on a terminal until the job ends; returns within
/// a few milliseconds of its end (the platform probe stops right after).
pub fn watch(job: &JobHandle, events: u64) {
    let terminal = std::io::stderr().is_terminal();
    let bar = terminal.then(|| {
        let b = ProgressBar::new(events);
        b.set_style(
            ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {human_pos}/{human_len} {per_sec}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        b
    });
    let Some(bar) = bar else {
        // Nothing to show: the caller joins the job, which wakes nobody
        // while it runs (a polling thread would wake on the workers'
        // cores and delay their records).
        return;
    };
    let bar = Some(bar);
    // One atomic load per poll; the bar moves every 100 ms.
    let mut shown = std::time::Instant::now();
    while !job.is_finished() {
        std::thread::sleep(Duration::from_millis(5));
        if let Some(b) = bar.as_ref().filter(|_| shown.elapsed() >= Duration::from_millis(100)) {
            shown = std::time::Instant::now();
            let emitted: u64 = job
                .metrics()
                .tasks
                .iter()
                .filter(|t| t.input_capacity == 0)
                .map(|t| t.records_in)
                .sum();
            b.set_position(emitted);
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
}

/// Appends `result` to the JSON lines file at `path` (created if missing).
pub(crate) fn append_json(path: &std::path::Path, result: &impl serde::Serialize) -> Result<(), CliError> {
    let io = |source| CliError::Io {
        path: path.display().to_string(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io)?;
    let line = serde_json::to_string(result).expect("a result always serialises");
    writeln!(f, "{line}").map_err(io)
}

/// `KEY=VALUE` of `--kafka-set`.
fn parse_kafka_setting(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(format!(
            "{s:?}: expected KEY=VALUE, a librdkafka setting such as socket.nagle.disable=true"
        )),
    }
}
