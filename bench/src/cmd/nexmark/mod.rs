//! `weir nexmark`: the Nexmark queries over an event file, with exactly-once
//! output, and the event file generator. (The in-process Nexmark jobs of
//! `weir bench --pipeline nexmark-qN` are the lab's `nexmark_jobs`, built
//! on [`queries`].)
//!
//! A query run reads the JSON Lines event file, runs the query with
//! checkpoints in the chosen mode, and writes its rows through the
//! two-phase-commit file sink into a hidden staging folder of the output
//! folder; when the job has ended (every window fired on the end-of-input
//! watermark, the final checkpoint committed), the committed rows are
//! sorted bytewise under the header into `DIR/qN.csv`, written durably
//! (temporary name, fsync, rename, folder fsync). Killed at any instant and
//! started again with the same arguments, the run resumes from its latest
//! checkpoint and produces the same file.

pub mod queries;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use weir_core::time::WatermarkStrategy;
use weir_core::{clock, CheckpointConfig, Pipeline, RestartStrategy, RestoreFrom, RuntimeConfig};
use weir_io::nexmark::{write_events_file, Event, NexmarkConfig};
use weir_io::FileSource;

use crate::cli::{CliError, Mode};
pub use queries::{Query, Row};

/// Fault point hit once per input event of a query run (crash tests arm
/// it through `WEIR_FAULTS`).
pub const FAULT_RECORD: &str = "nexmark.record";

/// Arguments of `weir nexmark`.
#[derive(Debug, clap::Args)]
pub struct NexmarkArgs {
    /// The query to run (with --input).
    #[arg(long, value_enum, conflicts_with = "generate")]
    pub query: Option<Query>,
    /// Event file (JSON Lines) to run the query over.
    #[arg(long, requires = "query")]
    pub input: Option<PathBuf>,
    /// With --query: the folder for `qN.csv`. With --generate: the event
    /// file to write.
    #[arg(long)]
    pub output: PathBuf,
    /// Write an event file of this many events instead of running a query.
    #[arg(long)]
    pub generate: Option<u64>,
    /// Event-time rate of the generated events, events per second.
    #[arg(long, default_value_t = 10_000)]
    pub rate: u64,
    /// Seed of the generated events.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Checkpoint mode of the query run.
    #[arg(long, value_enum, default_value = "aligned")]
    pub mode: Mode,
    /// Time between checkpoints, milliseconds.
    #[arg(long, default_value_t = 1_000)]
    pub checkpoint_interval_ms: u64,
    /// Checkpoint folder [default: DIR/.qN-checkpoints]; removed after
    /// success (the output is final then, and a new run starts afresh).
    #[arg(long)]
    pub checkpoint_dir: Option<PathBuf>,
    /// Parallelism of the keyed operators.
    #[arg(long, default_value_t = 2)]
    pub parallelism: usize,
    /// How far out of time order the input may be, milliseconds.
    #[arg(long, default_value_t = 0)]
    pub out_of_orderness_ms: i64,
    /// Serve the job's metrics while it runs: PORT (on 127.0.0.1) or
    /// IP:PORT (0.0.0.0:PORT exposes the unauthenticated endpoint to the
    /// network). Paths: / (live page), /metrics, /api/job.
    #[arg(long, value_parser = crate::cli::metrics_arg::parse)]
    pub metrics_addr: Option<std::net::SocketAddr>,
}

/// Runs `weir nexmark`.
pub fn run(args: &NexmarkArgs) -> Result<(), CliError> {
    match (args.generate, args.query, &args.input) {
        (Some(n), None, None) => generate(args, n),
        (None, Some(q), Some(input)) => run_query(args, q, input),
        _ => Err(CliError::Usage(
            "give either --generate N --output FILE, or --query qN --input FILE --output DIR".into(),
        )),
    }
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> CliError + '_ {
    move |source| CliError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn generate(args: &NexmarkArgs, n: u64) -> Result<(), CliError> {
    let cfg = NexmarkConfig {
        seed: args.seed,
        events_per_second: args.rate,
        ..NexmarkConfig::default()
    };
    cfg.validate().map_err(|e| CliError::Usage(e.to_string()))?;
    let started = clock::now_ns();
    write_events_file(&args.output, &cfg, n).map_err(|e| CliError::Wrong(e.to_string()))?;
    println!(
        "weir nexmark: wrote {n} events (seed {}, {} events/s of event time) to {} in {:.2} s",
        args.seed,
        args.rate,
        args.output.display(),
        (clock::now_ns() - started) as f64 / 1e9
    );
    Ok(())
}

fn run_query(args: &NexmarkArgs, q: Query, input: &Path) -> Result<(), CliError> {
    if args.parallelism == 0 || args.parallelism > 256 {
        return Err(CliError::Usage("--parallelism must be between 1 and 256".into()));
    }
    if args.checkpoint_interval_ms == 0 {
        return Err(CliError::Usage("--checkpoint-interval-ms must be at least 1".into()));
    }
    if !input.is_file() {
        return Err(CliError::Usage(format!("--input {}: no such file", input.display())));
    }
    let out_dir = &args.output;
    std::fs::create_dir_all(out_dir).map_err(io_err(out_dir))?;
    let staging = out_dir.join(format!(".{}-parts", q.name()));
    let ckpt_dir = args
        .checkpoint_dir
        .clone()
        .unwrap_or_else(|| out_dir.join(format!(".{}-checkpoints", q.name())));

    let pipeline = Pipeline::new(&format!("nexmark-{}", q.name()));
    let input = input.to_path_buf();
    let events = pipeline
        .source("events", 1, move |i, n| {
            FileSource::new(input.clone(), i, n, weir_io::nexmark::parse_line)
        })
        .map(|e: Event| {
            if let Err(err) = weir_core::fault::hit(FAULT_RECORD) {
                panic!("{FAULT_RECORD}: {err}");
            }
            e
        })
        .name("read")
        .assign_watermarks(WatermarkStrategy::bounded(args.out_of_orderness_ms, |e: &Event| {
            e.date_time()
        }));
    let rows = Arc::new(AtomicU64::new(0));
    let staged = staging.clone();
    let emitted = |_: &Row| 0;
    queries::build(q, events, args.parallelism).sink("csv", move |i| {
        weir_io::two_phase_file_sink(
            staged.clone(),
            i,
            |r: &Row, out: &mut Vec<u8>| r.write_csv(out),
            emitted,
        )
    });
    let config = RuntimeConfig {
        workers: weir_core::available_cores().min(2 * args.parallelism),
        checkpointing: args.mode.checkpoint_mode().map(|m| CheckpointConfig {
            interval: Duration::from_millis(args.checkpoint_interval_ms),
            restore: RestoreFrom::Latest,
            ..CheckpointConfig::new(m, &ckpt_dir)
        }),
        restart: RestartStrategy::FixedDelay {
            attempts: 5,
            delay: Duration::from_millis(50),
        },
        metrics_addr: args.metrics_addr,
        ..RuntimeConfig::default()
    };
    let started = clock::now_ns();
    let job = pipeline.run(config)?;
    crate::cli::metrics_arg::announce(&job);
    let result = job.join()?;
    let n = assemble(q, &staging, out_dir)?;
    rows.store(n, Ordering::Relaxed);
    std::fs::remove_dir_all(&staging).map_err(io_err(&staging))?;
    if ckpt_dir.exists() {
        std::fs::remove_dir_all(&ckpt_dir).map_err(io_err(&ckpt_dir))?;
    }
    let ck = &result.metrics.checkpoints;
    println!(
        "weir nexmark {}: {} rows to {} in {:.2} s; {} checkpoints, restored from {}, {} restarts",
        q.name(),
        n,
        out_dir.join(format!("{}.csv", q.name())).display(),
        (clock::now_ns() - started) as f64 / 1e9,
        ck.completed,
        ck.restored_from
            .map_or("nothing".to_string(), |id| format!("checkpoint {id}")),
        ck.restarts.len()
    );
    Ok(())
}

/// Sorts the committed rows under the header into `DIR/qN.csv`, durably.
/// Returns the number of rows.
fn assemble(q: Query, staging: &Path, out_dir: &Path) -> Result<u64, CliError> {
    let files = if staging.exists() {
        weir_io::committed_files(staging).map_err(|e| CliError::Wrong(e.to_string()))?
    } else {
        Vec::new()
    };
    let mut lines: Vec<Vec<u8>> = Vec::new();
    for f in &files {
        let bytes = weir_core::vfs::read(f).map_err(io_err(f))?;
        if !bytes.is_empty() && !bytes.ends_with(b"\n") {
            return Err(CliError::Wrong(format!("{}: the last line is incomplete", f.display())));
        }
        lines.extend(
            bytes
                .split(|&b| b == b'\n')
                .filter(|l| !l.is_empty())
                .map(<[u8]>::to_vec),
        );
    }
    lines.sort_unstable();
    let mut out = Vec::with_capacity(lines.iter().map(|l| l.len() + 1).sum::<usize>() + 64);
    out.extend_from_slice(q.header().as_bytes());
    out.push(b'\n');
    for l in &lines {
        out.extend_from_slice(l);
        out.push(b'\n');
    }
    let target = out_dir.join(format!("{}.csv", q.name()));
    weir_io::durable::write_file(&target, &out)?;
    Ok(lines.len() as u64)
}
