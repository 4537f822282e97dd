//! `weir`: benchmarks and jobs of the weir stream engine.

mod bench_cmd;
mod checkpoints_cmd;
mod co_runners;
mod compare_cmd;
mod copy_probe;
mod cpu_time;
mod disk_probe;
mod event;
mod handoff_probe;
mod kafka_bench;
mod metrics_ab;
mod metrics_arg;
mod nexmark;
mod parts_probe;
mod pipelines;
mod platform;
mod plot;
mod report;
mod run_cmd;
mod scale_out;
mod scaling_model;

use clap::{Parser, Subcommand};

/// weir: an embeddable stream engine with exactly-once checkpoints.
#[derive(Debug, Parser)]
#[command(name = "weir", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// What does exactly-once cost? Every checkpoint mode with the sinks a
    /// user would choose for it: latency and visibility beside the
    /// machine's own delays, throughput, checkpoints and their fsyncs;
    /// tables, JSON, SVG.
    Compare(compare_cmd::CompareArgs),
    /// Run a benchmark job and print throughput and latency.
    Bench(bench_cmd::BenchArgs),
    /// Run a job that can be killed at any instant and resumed: keyed
    /// counts of `key,value` lines, written exactly once.
    Run(run_cmd::RunArgs),
    /// List, inspect and verify the checkpoints in a checkpoint directory.
    Checkpoints(checkpoints_cmd::CheckpointsArgs),
    /// Run a Nexmark query over an event file into DIR/qN.csv, or write
    /// an event file with the Nexmark generator.
    Nexmark(nexmark::NexmarkArgs),
}

fn main() {
    // Logs (failures, restarts, checkpoints restored from) go to stderr;
    // WEIR_LOG sets the filter (default: info).
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("WEIR_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    weir_core::fault::arm_from_env();
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Compare(args) => compare_cmd::run(args),
        Command::Bench(args) => bench_cmd::run(args).map(|_| ()),
        Command::Run(args) => run_cmd::run(args),
        Command::Checkpoints(args) => checkpoints_cmd::run(args),
        Command::Nexmark(args) => nexmark::run(args),
    };
    if let Err(e) = result {
        eprintln!("weir: error: {e}");
        let code = match e {
            bench_cmd::CliError::Usage(_) => 2,
            _ => 1,
        };
        std::process::exit(code);
    }
}
