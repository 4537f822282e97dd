//! `weir compare`: the same pipeline in every checkpoint mode, one after
//! the other in one process, closed loop (throughput) and open loop at a
//! fixed rate (latency); one table, ratios against no checkpointing, JSON
//! rows and an SVG figure.

use std::io::Write;
use std::path::PathBuf;

use serde::Serialize;

use crate::bench_cmd::{run_one_full, runtime_config, temp_checkpoint_dir, CliError, Mode, RunOutput};
use crate::pipelines::{Kind, SinkKind, Spec, StateBackend};
use crate::plot::{write_svg, Series};
use crate::report::{si, BenchResult, Machine};

/// The workload variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// The pipeline as is.
    Normal,
    /// A slow operator after the keyed one (5 µs per record): queues fill,
    /// aligned barriers wait for them to drain, unaligned ones overtake.
    Backpressure,
}

/// Arguments of `weir compare`.
#[derive(Debug, clap::Args)]
pub struct CompareArgs {
    /// Which job to run.
    #[arg(long, value_enum, default_value = "keyed")]
    pub pipeline: Kind,
    /// Records per closed-loop run [default: 20000000; 400000 with --scenario backpressure].
    #[arg(long)]
    pub events: Option<u64>,
    /// Records per second of the open-loop run.
    #[arg(long, default_value_t = 200_000.0)]
    pub rate: f64,
    /// Length of the open-loop run, seconds.
    #[arg(long, default_value_t = 3.0)]
    pub open_seconds: f64,
    /// Time between checkpoints, milliseconds.
    #[arg(long, default_value_t = 100)]
    pub checkpoint_interval_ms: u64,
    /// Workload variant.
    #[arg(long, value_enum, default_value = "normal")]
    pub scenario: Scenario,
    /// Distinct keys.
    #[arg(long, default_value_t = 10_000)]
    pub keys: u64,
    /// Keyed pipeline: where the per-key state lives.
    #[arg(long, value_enum, default_value = "mapped")]
    pub state: StateBackend,
    /// The sink whose visibility latency is compared [default: wal].
    #[arg(long, value_enum, default_value = "wal")]
    pub sink: SinkKind,
    /// Parallelism of every operator [default: one per core].
    #[arg(long)]
    pub parallelism: Option<usize>,
    /// Write every run as a JSON line here [default: <results>/compare.json].
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the SVG figure here [default: <results>/compare.svg].
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Folder for the default outputs.
    #[arg(long, default_value = "results")]
    pub results: PathBuf,
}

const MODES: [Mode; 4] = [Mode::None, Mode::AtLeastOnce, Mode::Aligned, Mode::Unaligned];

/// One JSON line: a run with its kind.
#[derive(Serialize)]
struct JsonRow<'a> {
    run: &'static str,
    scenario: &'static str,
    #[serde(flatten)]
    result: &'a BenchResult,
}

fn fmt_opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |x| format!("{x:.2}"))
}

/// Runs `weir compare`.
pub fn run(args: &CompareArgs) -> Result<(), CliError> {
    let positive = |x: f64| x.is_finite() && x > 0.0;
    if !positive(args.rate) || !positive(args.open_seconds) {
        return Err(CliError::Usage("--rate and --open-seconds must be positive".into()));
    }
    if args.checkpoint_interval_ms == 0 {
        return Err(CliError::Usage("--checkpoint-interval-ms must be at least 1".into()));
    }
    if args.scenario == Scenario::Backpressure && args.pipeline != Kind::Keyed {
        return Err(CliError::Usage("--scenario backpressure needs --pipeline keyed".into()));
    }
    let cores = weir_core::available_cores();
    let parallelism = args.parallelism.unwrap_or(cores);
    let slow_ns = if args.scenario == Scenario::Backpressure {
        5_000
    } else {
        0
    };
    let closed_events = args.events.unwrap_or(if slow_ns > 0 { 400_000 } else { 20_000_000 });
    let open_events = ((args.rate * args.open_seconds) as u64).max(1000);
    let machine = Machine::here();
    let scenario = match args.scenario {
        Scenario::Normal => "normal",
        Scenario::Backpressure => "backpressure",
    };
    println!(
        "weir compare: {} pipeline, {scenario} scenario, parallelism {parallelism}, checkpoints every {} ms",
        args.pipeline.name(),
        args.checkpoint_interval_ms
    );
    println!(
        "measured now on this machine: {} ({} cores), unix time {}",
        machine.cpu, machine.cores, machine.unix_time
    );
    let mut closed: Vec<RunOutput> = Vec::new();
    let mut open: Vec<RunOutput> = Vec::new();
    for mode in MODES {
        for (rate, events, out) in [
            (None, closed_events, &mut closed),
            (Some(args.rate), open_events, &mut open),
        ] {
            let spec = Spec {
                kind: args.pipeline,
                events,
                rate,
                keys: args.keys,
                parallelism,
                seed: 1,
                slow_ns,
                state: args.state,
                sink: args.sink,
                sink_dir: std::path::PathBuf::new(),
            };
            let dir = temp_checkpoint_dir();
            let config = runtime_config(
                cores,
                weir_core::RuntimeConfig::default().ring_capacity,
                weir_core::RuntimeConfig::default().batch_size,
                mode,
                args.checkpoint_interval_ms,
                &dir,
            );
            eprintln!(
                "  running {:<13} {} ...",
                mode.name(),
                if rate.is_some() { "open loop" } else { "closed loop" }
            );
            let r = run_one_full(&spec, config, mode, true);
            let _ = std::fs::remove_dir_all(&dir);
            out.push(r?);
        }
    }
    print_table(&closed, &open);
    std::fs::create_dir_all(&args.results).map_err(|source| CliError::Io {
        path: args.results.display().to_string(),
        source,
    })?;
    let json = args.json.clone().unwrap_or_else(|| args.results.join("compare.json"));
    let plot = args.plot.clone().unwrap_or_else(|| args.results.join("compare.svg"));
    write_json(&json, scenario, &closed, &open)?;
    let series: Vec<Series> = MODES
        .iter()
        .zip(open.iter().zip(&closed))
        .map(|(m, (o, c))| Series {
            name: m.name().to_string(),
            latency_ns: o.latency_ns.clone(),
            checkpoints: c.checkpoint_durations.clone(),
        })
        .collect();
    write_svg(&plot, &format!("{} ({scenario})", args.pipeline.name()), &series).map_err(|e| CliError::Io {
        path: plot.display().to_string(),
        source: std::io::Error::other(e.to_string()),
    })?;
    println!("\nwrote {} and {}", json.display(), plot.display());
    Ok(())
}

fn print_table(closed: &[RunOutput], open: &[RunOutput]) {
    println!(
        "\n{:<13} {:>10} | {:>8} {:>8} {:>9} {:>9} | {:>8} {:>8} | {:>5} {:>4} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10}",
        "mode",
        "events/s",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "max µs",
        "vis p50",
        "vis p99",
        "ckpts",
        "fail",
        "dur p50",
        "dur p99",
        "align p50",
        "align p99",
        "state B",
        "channel B"
    );
    println!(
        "{:<13} {:>10} | {:^38} | {:^17} | {:^70}",
        "", "(closed)", "processing latency (open loop)", "visibility (ms)", "checkpoints (closed loop, ms)"
    );
    for (c, o) in closed.iter().zip(open) {
        let l = &o.result.latency_us;
        let ck = c.result.checkpoints.as_ref();
        println!(
            "{:<13} {:>10} | {:>8.1} {:>8.1} {:>9.1} {:>9.1} | {:>8} {:>8} | {:>5} {:>4} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10}",
            c.result.mode,
            si(c.result.events_per_sec),
            l.p50,
            l.p99,
            l.p999,
            l.max,
            fmt_opt(o.result.visible_latency_us.map(|v| v.p50 / 1e3)),
            fmt_opt(o.result.visible_latency_us.map(|v| v.p99 / 1e3)),
            ck.map_or("-".into(), |k| k.completed.to_string()),
            ck.map_or("-".into(), |k| k.failed.to_string()),
            fmt_opt(ck.map(|k| k.duration_ms.p50)),
            fmt_opt(ck.map(|k| k.duration_ms.p99)),
            fmt_opt(ck.map(|k| k.alignment_ms.p50)),
            fmt_opt(ck.map(|k| k.alignment_ms.p99)),
            ck.map_or("-".into(), |k| k.state_bytes.to_string()),
            ck.map_or("-".into(), |k| k.channel_state_bytes.to_string()),
        );
    }
    let (base_c, base_o) = (&closed[0].result, &open[0].result);
    println!("\nratios against no checkpointing (none = 1.00):");
    println!("{:<13} {:>10} {:>10} {:>10}", "mode", "events/s", "p50", "p99");
    for (c, o) in closed.iter().zip(open).skip(1) {
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
        println!(
            "{:<13} {:>10.2} {:>10.2} {:>10.2}",
            c.result.mode,
            ratio(c.result.events_per_sec, base_c.events_per_sec),
            ratio(o.result.latency_us.p50, base_o.latency_us.p50),
            ratio(o.result.latency_us.p99, base_o.latency_us.p99)
        );
    }
    println!("(visibility: from emission until a reader of the sink's target can see the record)");
}

fn write_json(
    path: &std::path::Path,
    scenario: &'static str,
    closed: &[RunOutput],
    open: &[RunOutput],
) -> Result<(), CliError> {
    let io = |source| CliError::Io {
        path: path.display().to_string(),
        source,
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    let mut f = std::fs::File::create(path).map_err(io)?;
    for (run, rows) in [("closed-loop", closed), ("open-loop", open)] {
        for r in rows {
            let line = serde_json::to_string(&JsonRow {
                run,
                scenario,
                result: &r.result,
            })
            .expect("rows serialise");
            writeln!(f, "{line}").map_err(io)?;
        }
    }
    Ok(())
}
