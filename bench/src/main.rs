//! `weir`: benchmarks and jobs of the weir stream engine.

mod bench_cmd;
mod checkpoints_cmd;
mod event;
mod pipelines;
mod report;

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
    /// Run a benchmark job and print throughput and latency.
    Bench(bench_cmd::BenchArgs),
    /// List, inspect and verify the checkpoints in a checkpoint directory.
    Checkpoints(checkpoints_cmd::CheckpointsArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Bench(args) => bench_cmd::run(args).map(|_| ()),
        Command::Checkpoints(args) => checkpoints_cmd::run(args),
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
