//! `weir run`: a real job to kill and resume. Reads `key,value` lines from
//! files or folders and `key,value` record values from Kafka topics, keeps
//! a running count and sum per key, and writes one line `key,count,sum` per
//! input record through a committing sink. Given the same arguments again,
//! it resumes from its latest checkpoint. With `--instances`, one of N
//! processes sharing a job over Kafka: weir-io's [`shards`] settles which
//! shards it runs and puts their folders in place.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use weir_core::{
    clock, BoxError, CheckpointConfig, Output, Pipeline, RestartStrategy, RestoreFrom, RuntimeConfig, Source,
    SourceContext, SourcePoll,
};
use weir_io::kafka::{KafkaSourceConfig, KafkaSourceStats};
use weir_io::shards;
use weir_io::{
    BadRecords, DirectFileSink, FileSource, KafkaRecordInfo, KafkaSource, LineInfo, ParseError, WalSink, WalSinkConfig,
};

use crate::cli::{CliError, Mode};

/// Which committing sink `weir run` writes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RunSink {
    /// Write-ahead log, committed to files when a checkpoint completes.
    Wal,
    /// Two-phase commit: a temporary file per epoch, renamed at commit.
    #[value(name = "2pc-file")]
    TwoPcFile,
    /// Written at once (at-least-once).
    Direct,
}

/// What to do with malformed input lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BadRecordsArg {
    /// Stop with an error naming the file and line.
    Fail,
    /// Skip them into a rejected-records file and go on.
    Skip,
}

/// The only job `weir run` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum JobKind {
    /// Running count and sum per key.
    KeyedCount,
}

/// Arguments of `weir run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The job.
    #[arg(long, value_enum)]
    pub job: JobKind,
    /// Input: a file or a folder of files of `key,value` lines, or
    /// `kafka:HOST:PORT/TOPIC` (`key,value` record values, read committed).
    /// Repeat for several inputs, which are read side by side (a union).
    /// A Kafka input is read up to the end it has when the job first
    /// starts, unless --follow.
    #[arg(long, required = true)]
    pub input: Vec<String>,
    /// Kafka inputs: keep reading new records (the job runs until stopped;
    /// run it again to resume).
    #[arg(long)]
    pub follow: bool,
    /// Output folder (committed files are its regular, non-hidden files),
    /// or `kafka:HOST:PORT/TOPIC` (record key: the key; value:
    /// `key,count,sum`; with `--sink wal` exactly-once for read_committed
    /// readers, with `--sink direct` at-least-once).
    #[arg(long)]
    pub output: String,
    /// Checkpoint folder; a completed checkpoint in it is resumed from.
    #[arg(long)]
    pub checkpoint_dir: PathBuf,
    /// Checkpoint mode.
    #[arg(long, value_enum, default_value = "aligned")]
    pub mode: Mode,
    /// Time between checkpoints, milliseconds.
    #[arg(long, default_value_t = 100)]
    pub checkpoint_interval_ms: u64,
    /// Parallelism of the source, the keyed operator and the sink.
    #[arg(long, default_value_t = 2)]
    pub parallelism: usize,
    /// The sink.
    #[arg(long, value_enum, default_value = "wal")]
    pub sink: RunSink,
    /// Malformed lines: stop, or skip into a rejected-records file.
    #[arg(long, value_enum, default_value = "fail")]
    pub bad_records: BadRecordsArg,
    /// Rejected-records file [default: <checkpoint-dir>/rejected-records.tsv].
    #[arg(long)]
    pub rejected: Option<PathBuf>,
    /// Read at most this many lines per second per source subtask (to
    /// watch a job, or give a crash test time to kill it); 0: no limit.
    #[arg(long, default_value_t = 0)]
    pub throttle: u64,
    /// Run one of N processes of a job over Kafka (Kafka inputs and
    /// output only): the job is cut into shards, one per partition of the
    /// first input topic at its first start; process I runs the shards
    /// `s mod N == I`, each with its folder under --checkpoint-dir. Give
    /// a job that may be rescaled later --instances from its first start
    /// (even 1). See docs/guide/kafka.md, "Several processes".
    #[arg(long)]
    pub instances: Option<usize>,
    /// Which process of --instances this is, 0 to N-1.
    #[arg(long)]
    pub instance: Option<usize>,
    /// With --instances: the checkpoint folder of a process of the job's
    /// previous run; repeat it for every old process when the number of
    /// processes changes. Shards this process now owns are copied from
    /// the newest copy in them (stop every old process first).
    #[arg(long)]
    pub rescale_from: Vec<PathBuf>,
    /// Serve the job's metrics while it runs: PORT (on 127.0.0.1) or
    /// IP:PORT (0.0.0.0:PORT exposes the unauthenticated endpoint to the
    /// network). Paths: / (live page), /metrics, /api/job.
    #[arg(long, value_parser = crate::cli::metrics_arg::parse)]
    pub metrics_addr: Option<std::net::SocketAddr>,
}

/// Longest accepted key.
const MAX_KEY: usize = 64;

/// One input record.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Rec {
    key: String,
    value: i64,
    emitted_ns: u64,
}

/// One output record.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Counted {
    key: String,
    count: u64,
    sum: i64,
    emitted_ns: u64,
}

/// One `--input`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Input {
    /// A file or a folder.
    Files(PathBuf),
    /// `kafka:BROKERS/TOPIC`.
    Kafka { brokers: String, topic: String },
}

impl Input {
    fn parse(s: &str) -> Result<Input, CliError> {
        let Some(rest) = s.strip_prefix("kafka:") else {
            let path = PathBuf::from(s);
            if !path.exists() {
                return Err(CliError::Usage(format!("--input {s}: no such file or folder")));
            }
            return Ok(Input::Files(path));
        };
        match rest.rsplit_once('/') {
            Some((brokers, topic)) if !brokers.is_empty() && !topic.is_empty() => Ok(Input::Kafka {
                brokers: brokers.to_string(),
                topic: topic.to_string(),
            }),
            _ => Err(CliError::Usage(format!(
                "--input {s}: a Kafka input is kafka:HOST:PORT/TOPIC (several brokers: kafka:H1:P1,H2:P2/TOPIC)"
            ))),
        }
    }
}

/// Parses a Kafka record's value as a `key,value` line.
fn parse_kafka(value: &[u8], info: &KafkaRecordInfo<'_>) -> Result<Rec, ParseError> {
    let line = LineInfo {
        file: info.topic,
        line_number: info.offset as u64 + 1,
        emitted_ns: info.emitted_ns,
    };
    parse(value, &line)
}

/// Parses `key,value`.
fn parse(line: &[u8], info: &LineInfo<'_>) -> Result<Rec, ParseError> {
    let text = std::str::from_utf8(line).map_err(|_| ParseError::new("the line is not UTF-8"))?;
    let text = text.strip_suffix('\r').unwrap_or(text);
    let (key, value) = text
        .split_once(',')
        .ok_or_else(|| ParseError::new("expected `key,value`: no comma"))?;
    if key.is_empty() || key.len() > MAX_KEY {
        return Err(ParseError::new(format!(
            "the key must have 1 to {MAX_KEY} characters, it has {}",
            key.len()
        )));
    }
    if let Some(c) = key
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
    {
        return Err(ParseError::new(format!(
            "the key has the character {c:?}; allowed: A-Z a-z 0-9 _ -"
        )));
    }
    let value: i64 = value
        .parse()
        .map_err(|_| ParseError::new(format!("the value {value:?} is not a signed 64-bit integer")))?;
    Ok(Rec {
        key: key.to_string(),
        value,
        emitted_ns: info.emitted_ns,
    })
}

/// Lets a source emit at most `per_sec` records per second.
struct Throttled<S> {
    inner: S,
    per_sec: u64,
    start_ns: Option<u64>,
    emitted: u64,
}

impl<T: Send + 'static, S: Source<T>> Source<T> for Throttled<S> {
    fn poll(&mut self, out: &mut Vec<T>, max: usize, ctx: &mut SourceContext<'_>) -> Result<SourcePoll, BoxError> {
        if self.per_sec == 0 {
            return self.inner.poll(out, max, ctx);
        }
        let now = ctx.now_ns();
        let start = *self.start_ns.get_or_insert(now);
        let allowed = ((now - start) as u128 * self.per_sec as u128 / 1_000_000_000) as u64 + 1;
        let n = allowed.saturating_sub(self.emitted).min(max as u64) as usize;
        if n == 0 {
            return Ok(SourcePoll::Idle);
        }
        let before = out.len();
        let status = self.inner.poll(out, n, ctx)?;
        self.emitted += (out.len() - before) as u64;
        Ok(status)
    }
    fn offset(&self) -> Vec<u8> {
        self.inner.offset()
    }
    fn checkpoint_offset(&mut self, checkpoint: u64) -> Vec<u8> {
        self.inner.checkpoint_offset(checkpoint)
    }
    fn checkpoint_complete(&mut self, checkpoint: u64) -> Result<(), BoxError> {
        self.inner.checkpoint_complete(checkpoint)
    }
    fn seek(&mut self, offset: &[u8]) -> Result<(), BoxError> {
        self.inner.seek(offset)
    }
    fn is_replayable(&self) -> bool {
        self.inner.is_replayable()
    }
}

fn encode(r: &Counted, out: &mut Vec<u8>) {
    weir_io::text::Line::new(out).str(&r.key).u64(r.count).i64(r.sum).end();
}

/// A Kafka output record: key, then `key,count,sum`.
fn encode_kafka(r: &Counted, out: &mut Vec<u8>) {
    weir_io::kafka::framing::encode_with(r.key.as_bytes(), out, |out| {
        weir_io::text::Line::new(out).str(&r.key).u64(r.count).i64(r.sum).done()
    });
}

/// Where `--output` goes.
enum OutputTo {
    Folder(PathBuf),
    Kafka(Input),
}

/// Runs `weir run`.
pub fn run(args: &RunArgs) -> Result<(), CliError> {
    if args.parallelism == 0 {
        return Err(CliError::Usage("--parallelism must be at least 1".into()));
    }
    if args.checkpoint_interval_ms == 0 {
        return Err(CliError::Usage("--checkpoint-interval-ms must be at least 1".into()));
    }
    let inputs = args
        .input
        .iter()
        .map(|s| Input::parse(s))
        .collect::<Result<Vec<_>, _>>()?;
    let io = |path: &PathBuf| {
        let p = path.display().to_string();
        move |source| CliError::Io {
            path: p.clone(),
            source,
        }
    };
    let output_to = match args.output.strip_prefix("kafka:") {
        Some(_) => match Input::parse(&args.output) {
            Ok(k @ Input::Kafka { .. }) => OutputTo::Kafka(k),
            _ => {
                return Err(CliError::Usage(format!(
                    "--output {}: a Kafka output is kafka:HOST:PORT/TOPIC",
                    args.output
                )))
            }
        },
        None => OutputTo::Folder(PathBuf::from(&args.output)),
    };
    let sharded = args.instances.is_some();
    if !sharded && (args.instance.is_some() || !args.rescale_from.is_empty()) {
        return Err(CliError::Usage(
            "--instance and --rescale-from belong to a job of several processes: give --instances N too".into(),
        ));
    }
    if let Some(n) = args.instances {
        return run_instances(args, &inputs, &output_to, n);
    }
    if let OutputTo::Folder(dir) = &output_to {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    let workers = weir_core::available_cores().min(2 * args.parallelism);
    let started = start_job(args, &inputs, &output_to, &args.checkpoint_dir, None, workers, true)?;
    let result = started.job.join()?;
    report(
        args,
        &output_to,
        "",
        &result,
        &started.kafka_stats,
        started.started,
        started.rejected.as_ref(),
    )
}

/// One running job: a whole `weir run`, or one shard of it.
/// When a job was started: on weir's clock (for durations) and in Unix
/// milliseconds (to compare with checkpoint records, which use the wall
/// clock: weir's clock drifts from it by a few parts per hundred).
#[derive(Debug, Clone, Copy)]
struct StartedAt {
    clock_ns: u64,
    unix_ms: f64,
}

struct Started {
    job: weir_core::JobHandle,
    kafka_stats: Vec<(String, Arc<KafkaSourceStats>)>,
    started: StartedAt,
    /// With `--bad-records skip` and file inputs: the rejected-records
    /// file and its lines when the job started.
    rejected: Option<(PathBuf, u64)>,
}

/// `(shards, shard)` of a job of several processes.
type Shard = (usize, usize);

/// Builds the keyed count over `inputs` into `output_to` with its
/// checkpoints in `checkpoint_dir` (a shard's: only its partitions, its
/// sink slots) and starts it; with `serve_metrics` it serves
/// `--metrics-addr` (one job per process does).
fn start_job(
    args: &RunArgs,
    inputs: &[Input],
    output_to: &OutputTo,
    checkpoint_dir: &std::path::Path,
    shard: Option<Shard>,
    workers: usize,
    serve_metrics: bool,
) -> Result<Started, CliError> {
    let io = |path: &std::path::Path| {
        let p = path.display().to_string();
        move |source| CliError::Io {
            path: p.clone(),
            source,
        }
    };
    std::fs::create_dir_all(checkpoint_dir).map_err(io(checkpoint_dir))?;
    let p = args.parallelism;
    let bad = match args.bad_records {
        BadRecordsArg::Fail => BadRecords::Fail,
        BadRecordsArg::Skip => BadRecords::Skip {
            rejected: args
                .rejected
                .clone()
                .unwrap_or_else(|| checkpoint_dir.join("rejected-records.tsv")),
        },
    };
    let rejected = match &bad {
        BadRecords::Skip { rejected } if inputs.iter().any(|i| matches!(i, Input::Files(_))) => {
            Some((rejected.clone(), count_lines(rejected).map_err(io(rejected))?))
        }
        _ => None,
    };
    let pipeline = Pipeline::new("keyed-count");
    let throttle = args.throttle;
    let mut kafka_stats: Vec<(String, Arc<KafkaSourceStats>)> = Vec::new();
    let mut streams = Vec::new();
    for (k, input) in inputs.iter().enumerate() {
        // The first input keeps the name it always had, so that a job of one
        // input resumes from checkpoints of earlier versions.
        let name = |base: &str| {
            if k == 0 {
                base.to_string()
            } else {
                format!("{base}-{k}")
            }
        };
        let stream = match input {
            Input::Files(path) => {
                let (path, bad) = (path.clone(), bad.clone());
                pipeline.source(&name("lines"), p, move |i, n| Throttled {
                    inner: FileSource::new(path.clone(), i, n, parse).bad_records(bad.clone()),
                    per_sec: throttle,
                    start_ns: None,
                    emitted: 0,
                })
            }
            Input::Kafka { brokers, topic } => {
                let mut config = KafkaSourceConfig::new(brokers, topic);
                if let Some((shards, s)) = shard {
                    config = config.shard(shards, s);
                }
                if !args.follow {
                    config = config.bounded();
                }
                if args.bad_records == BadRecordsArg::Skip {
                    config = config.skip_bad_records();
                }
                kafka_stats.push((topic.clone(), config.stats()));
                pipeline.source(&name("kafka"), p, move |i, n| Throttled {
                    inner: KafkaSource::new(config.clone(), i, n, parse_kafka),
                    per_sec: throttle,
                    start_ns: None,
                    emitted: 0,
                })
            }
        };
        streams.push(stream);
    }
    let first = streams.remove(0);
    let input = if streams.is_empty() {
        first
    } else {
        first.union(streams)
    };
    let counted = input
        .key_by(|r: &Rec| r.key.clone())
        .parallelism(p)
        .process(|key: &String, st: &mut [i64; 2], r: Rec, out: &mut Output<Counted>| {
            st[0] += 1;
            st[1] = st[1].wrapping_add(r.value);
            out.emit(Counted {
                key: key.clone(),
                count: st[0] as u64,
                sum: st[1],
                emitted_ns: r.emitted_ns,
            });
        })
        .name("count");
    let emitted = |r: &Counted| r.emitted_ns;
    match (output_to, args.sink) {
        (OutputTo::Folder(output), RunSink::Wal) => {
            let config = WalSinkConfig::new(output.join(".weir-wal"), output.clone());
            counted.sink("wal", move |i| WalSink::new(config.clone(), i, encode, emitted));
        }
        (OutputTo::Folder(output), RunSink::TwoPcFile) => {
            let output = output.clone();
            counted.sink("2pc-file", move |i| {
                weir_io::two_phase_file_sink(output.clone(), i, encode, emitted)
            });
        }
        (OutputTo::Folder(output), RunSink::Direct) => {
            let output = output.clone();
            counted.sink("direct", move |i| {
                DirectFileSink::new(output.clone(), i, encode, emitted)
            });
        }
        (OutputTo::Kafka(Input::Kafka { brokers, topic }), sink) => {
            let mut config = weir_io::kafka::KafkaSinkConfig::new(brokers, topic);
            config.partitions = p as i32;
            if let Some((_, s)) = shard {
                // A shard's slots: its own, whichever process runs it.
                config.slot_base = s * p;
            }
            let config = Arc::new(config);
            match sink {
                RunSink::Wal => {
                    // The sink's log lives with the job's checkpoints.
                    let wal = WalSinkConfig::new(checkpoint_dir.join("kafka-wal"), checkpoint_dir.join("unused"));
                    counted.sink("kafka", move |i| {
                        weir_io::kafka::exactly_once(config.clone(), wal.clone(), i, encode_kafka, emitted)
                    });
                }
                RunSink::Direct => {
                    counted.sink("kafka", move |i| {
                        weir_io::kafka::at_least_once(config.clone(), i, encode_kafka, emitted)
                    });
                }
                RunSink::TwoPcFile => {
                    return Err(CliError::Usage(
                        "--sink 2pc-file writes files; a Kafka output takes --sink wal (exactly-once: a write-ahead \
                         log, then one transaction per checkpoint) or --sink direct (at-least-once)"
                            .into(),
                    ))
                }
            }
        }
        (OutputTo::Kafka(Input::Files(_)), _) => unreachable!("parsed as Kafka above"),
    }
    let config = RuntimeConfig {
        workers,
        // Several shards' runtimes share the cores of one process.
        pin_workers: shard.is_none(),
        checkpointing: args.mode.checkpoint_mode().map(|m| CheckpointConfig {
            interval: Duration::from_millis(args.checkpoint_interval_ms),
            restore: RestoreFrom::Latest,
            // weir run's keyed count is deterministic: under dedup a failed
            // subtask recovers alone in any stage.
            dedup_deterministic: true,
            ..CheckpointConfig::new(m, checkpoint_dir)
        }),
        restart: RestartStrategy::FixedDelay {
            attempts: 3,
            delay: Duration::from_millis(100),
        },
        metrics_addr: args.metrics_addr.filter(|_| serve_metrics),
        ..RuntimeConfig::default()
    };
    let started = StartedAt {
        clock_ns: clock::now_ns(),
        unix_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64() * 1e3),
    };
    let job = pipeline.run(config)?;
    crate::cli::metrics_arg::announce(&job);
    Ok(Started {
        job,
        kafka_stats,
        started,
        rejected,
    })
}

/// Lines in `path`: 0 if it does not exist. Read in 64 KiB pieces: the
/// file only grows, run after run.
fn count_lines(path: &Path) -> std::io::Result<u64> {
    use std::io::Read;
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let (mut buf, mut lines) = (vec![0u8; 64 << 10], 0u64);
    loop {
        match file.read(&mut buf) {
            Ok(0) => return Ok(lines),
            Ok(n) => lines += buf[..n].iter().filter(|&&b| b == b'\n').count() as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Prints what a finished job did; `label` names a shard.
fn report(
    args: &RunArgs,
    output_to: &OutputTo,
    label: &str,
    result: &weir_core::JobResult,
    kafka_stats: &[(String, Arc<KafkaSourceStats>)],
    started: StartedAt,
    rejected: Option<&(PathBuf, u64)>,
) -> Result<(), CliError> {
    let m = &result.metrics;
    let read: u64 = m
        .tasks
        .iter()
        .filter(|t| t.input_capacity == 0)
        .map(|t| t.records_in)
        .sum();
    let ck = &m.checkpoints;
    println!(
        "weir run{label}: {} records read in this run ({:.2} s), {} checkpoints completed, {} failed, restored from {}, {} restarts",
        read,
        (clock::now_ns() - started.clock_ns) as f64 / 1e9,
        ck.completed,
        ck.failed,
        ck.restored_from.map_or("nothing (fresh start)".to_string(), |id| format!("checkpoint {id}")),
        ck.restarts.len()
    );
    // The first output this run committed: its first completed checkpoint
    // (the sinks commit when it completes), from this run's start (what a
    // restart after a crash costs before new output shows).
    let start_unix_ms = started.unix_ms;
    if let Some(first) = ck.history.iter().min_by_key(|r| r.id) {
        let committed_ms = first.trigger_unix_ms as f64 + first.duration_us as f64 / 1e3 - start_unix_ms;
        // The coordinator counts from its own start, after the restore.
        let restore_ms = committed_ms - first.trigger_ms - first.duration_us as f64 / 1e3;
        println!(
            "weir run{label}: first checkpoint of this run (checkpoint {}) completed, its output committed, {:.1} ms \
             after the start ({:.1} ms to restore and start the job, the first trigger {:.1} ms later, {:.1} ms \
             to complete it)",
            first.id,
            committed_ms,
            restore_ms,
            first.trigger_ms,
            first.duration_us as f64 / 1e3
        );
    }
    if let Some((path, before)) = rejected {
        // Saturating: a file cut short meanwhile (by hand) counts nothing.
        let skipped = count_lines(path)
            .map_err(|source| CliError::Io {
                path: path.display().to_string(),
                source,
            })?
            .saturating_sub(*before);
        if skipped > 0 {
            // Replays after a restart write a bad line again (the file is
            // at-least-once), so this counts rejections, not distinct lines.
            println!(
                "weir run{label}: {skipped} malformed input lines skipped in this run, written to {}",
                path.display()
            );
        }
    }
    for (topic, stats) in kafka_stats {
        if stats.skipped() > 0 {
            println!(
                "weir run{label}: {} malformed records of Kafka topic {topic} skipped",
                stats.skipped()
            );
        }
    }
    if let OutputTo::Folder(dir) = output_to {
        if args.mode == Mode::AtLeastOnce || args.sink == RunSink::Direct {
            let dups = duplicates(dir).map_err(|source| CliError::Io {
                path: dir.display().to_string(),
                source,
            })?;
            println!("weir run: {dups} duplicate output lines (at-least-once)");
        }
    }
    Ok(())
}

/// `--instances N --instance I`: settles this process's shards (copying
/// adopted ones from --rescale-from folders), runs one job per shard, and
/// stops them all when one fails.
fn run_instances(args: &RunArgs, inputs: &[Input], output_to: &OutputTo, n: usize) -> Result<(), CliError> {
    if n == 0 {
        return Err(CliError::Usage("--instances must be at least 1".into()));
    }
    let i = args.instance.ok_or_else(|| {
        CliError::Usage(format!(
            "--instances {n} needs --instance I, with I from 0 to {}",
            n - 1
        ))
    })?;
    if i >= n {
        return Err(CliError::Usage(format!(
            "--instance {i} is out of range: process numbers of --instances {n} are 0 to {}",
            n - 1
        )));
    }
    let files = inputs.iter().any(|i| matches!(i, Input::Files(_)));
    let (Some(Input::Kafka { brokers, topic }), false) = (inputs.first(), files) else {
        return Err(CliError::Usage(
            "--instances splits a job by Kafka partitions: every --input must be kafka:HOST:PORT/TOPIC (files \
             have no partitions to split by key; run them with a single process)"
                .into(),
        ));
    };
    if !matches!(output_to, OutputTo::Kafka(_)) {
        return Err(CliError::Usage(
            "--instances needs a Kafka --output (kafka:HOST:PORT/TOPIC): the processes write one topic, each \
             shard through sink slots of its own"
                .into(),
        ));
    }
    let shape = shards::JobShape {
        shards: 0,
        parallelism: args.parallelism,
        inputs: args.input.join(" "),
        output: args.output.clone(),
    };
    let count = || partitions_of(brokers, topic);
    let plan = shards::prepare(&args.checkpoint_dir, &args.rescale_from, n, i, shape, count)?;
    for (s, from, generation) in &plan.adopted {
        println!(
            "weir run: process {i} of {n}: shard {s} adopted from {} (generation {generation})",
            from.display()
        );
    }
    println!(
        "weir run: process {i} of {n}: shards {:?} of {}",
        plan.owned.iter().map(|o| o.0).collect::<Vec<_>>(),
        plan.shards
    );
    let workers = (weir_core::available_cores() / plan.owned.len()).clamp(1, 2 * args.parallelism);
    let mut running = Vec::new();
    for (k, (s, dir)) in plan.owned.iter().enumerate() {
        // One endpoint per process, the first shard's (the others would ask
        // for the same address).
        match start_job(args, inputs, output_to, dir, Some((plan.shards, *s)), workers, k == 0) {
            Ok(job) => running.push(Some((*s, job))),
            Err(e) => {
                stop_all(&mut running);
                return Err(e);
            }
        }
    }
    let mut results = Vec::new();
    while running.iter().any(Option::is_some) {
        for slot in running.iter_mut() {
            if !slot.as_ref().is_some_and(|(_, j)| j.job.is_finished()) {
                continue;
            }
            let (s, job) = slot.take().expect("checked above");
            let Started {
                job,
                kafka_stats,
                started,
                rejected,
            } = job;
            match job.join() {
                Ok(result) => results.push((s, result, kafka_stats, started, rejected)),
                Err(e) => {
                    eprintln!("weir run: shard {s} failed; stopping the other shards of this process");
                    stop_all(&mut running);
                    return Err(e.into());
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    results.sort_by_key(|r| r.0);
    for (s, result, stats, started, rejected) in &results {
        let label = format!(" (shard {s})");
        report(args, output_to, &label, result, stats, *started, rejected.as_ref())?;
    }
    Ok(())
}

/// Cancels and waits for every job still running.
fn stop_all(running: &mut [Option<(usize, Started)>]) {
    for (_, job) in running.iter().flatten() {
        job.job.cancel();
    }
    for (_, job) in running.iter_mut().filter_map(Option::take) {
        let _ = job.job.join();
    }
}

/// The number of partitions of `topic`: the shards of a new job.
fn partitions_of(brokers: &str, topic: &str) -> Result<usize, CliError> {
    use weir_io::rdkafka::consumer::{BaseConsumer, Consumer};
    let failed = |what: String| CliError::Usage(format!("kafka:{brokers}/{topic}: {what}"));
    let consumer: BaseConsumer = weir_io::rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .map_err(|e| failed(format!("cannot create a client: {e}")))?;
    let md = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(30))
        .map_err(|e| failed(format!("cannot read the topic's metadata: {e}")))?;
    let n = md.topics().first().map_or(0, |t| t.partitions().len());
    if n == 0 {
        return Err(failed(
            "the topic has no partitions (does it exist?): the shards of a job of several processes are the \
             partitions of its first input topic"
                .into(),
        ));
    }
    Ok(n)
}

/// Lines of the committed output that repeat an earlier `key,count`.
fn duplicates(dir: &std::path::Path) -> std::io::Result<u64> {
    let mut seen = HashSet::new();
    let mut dups = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') || !entry.file_type()?.is_file() {
            continue;
        }
        for line in std::fs::read_to_string(entry.path())?.lines() {
            let mut parts = line.rsplitn(2, ',');
            let _sum = parts.next();
            if let Some(key_count) = parts.next() {
                if !seen.insert(key_count.to_string()) {
                    dups += 1;
                }
            }
        }
    }
    Ok(dups)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> LineInfo<'static> {
        LineInfo {
            file: "f",
            line_number: 1,
            emitted_ns: 7,
        }
    }

    #[test]
    fn parses_good_lines_and_explains_bad_ones() {
        let r = parse(b"user_1-a,-42", &info()).unwrap();
        assert_eq!((r.key.as_str(), r.value, r.emitted_ns), ("user_1-a", -42, 7));
        for (line, why) in [
            (&b"nocomma"[..], "no comma"),
            (b",5", "1 to 64"),
            (b"a b,5", "character ' '"),
            (b"k,12x", "not a signed 64-bit integer"),
            (b"k,99999999999999999999", "not a signed 64-bit integer"),
        ] {
            let e = parse(line, &info()).unwrap_err();
            assert!(e.reason().contains(why), "{:?}: {}", std::str::from_utf8(line), e);
        }
        let long = format!("{},1", "k".repeat(65));
        assert!(parse(long.as_bytes(), &info()).is_err());
    }
}
