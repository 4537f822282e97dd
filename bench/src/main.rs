//! `weir`: jobs of the weir stream engine, and its benchmarks.
//!
//! The binary has three parts, and one rule between them:
//!
//! - [`cli`]: what every command shares ([`cli::CliError`] and its exit
//!   status, [`cli::Mode`], `--metrics-addr`);
//! - [`cmd`]: the production commands, `weir run` (with its scale-out over
//!   Kafka), `weir checkpoints`, `weir nexmark`. Their durable files and
//!   decoders live in the libraries (weir-core, weir-io), on the vfs layer
//!   and its fault points, where the storage simulation tests them;
//! - [`lab`]: `weir bench` and `weir compare`, the benchmark jobs, the
//!   probes, the models and the reports.
//!
//! The rule: the lab may use [`cmd`] and [`cli`]; [`cmd`] and [`cli`] never
//! use anything of [`lab`] (no `crate::lab` path outside `lab/`). A type
//! both need belongs in [`cli`] or in a library. This file only parses the
//! command line and dispatches.

mod cli;
mod cmd;
mod lab;

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
    Compare(lab::compare::CompareArgs),
    /// Run a benchmark job and print throughput and latency.
    Bench(lab::bench::BenchArgs),
    /// Run a job that can be killed at any instant and resumed: keyed
    /// counts of `key,value` lines, written exactly once.
    Run(cmd::run::RunArgs),
    /// List, inspect and verify the checkpoints in a checkpoint directory.
    Checkpoints(cmd::checkpoints::CheckpointsArgs),
    /// Run a Nexmark query over an event file into DIR/qN.csv, or write
    /// an event file with the Nexmark generator.
    Nexmark(cmd::nexmark::NexmarkArgs),
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
        Command::Compare(args) => lab::compare::run(args),
        Command::Bench(args) => lab::bench::run(args).map(|_| ()),
        Command::Run(args) => cmd::run::run(args),
        Command::Checkpoints(args) => cmd::checkpoints::run(args),
        Command::Nexmark(args) => cmd::nexmark::run(args),
    };
    if let Err(e) = result {
        eprintln!("weir: error: {e}");
        std::process::exit(e.exit_code());
    }
}
