//! `weir-timely`: weir's two benchmark jobs (`weir bench --pipeline keyed`
//! and `stateless`) written in timely dataflow, so that
//! `bench/peers/timely/compare.sh` can set timely beside weir on the same
//! records, rates and cores.
//!
//! It runs one job and prints one JSON line with `weir bench --json`'s
//! field names (`pipeline`, `events`, `seconds`, `events_per_sec`,
//! `latency_us {p50, p99, p999, max}`, ...), plus `engine: "timely"` and
//! the variant it ran (`input`, `time`). The jobs are in [`job`]; see
//! README.md for what each option changes and why the defaults are the
//! fair ones.

mod job;

use std::process::ExitCode;

use job::{Input, Pipeline, Spec, TimeGrain};

/// What `--help` prints.
const USAGE: &str = "\
weir-timely: weir's benchmark jobs in timely dataflow (one run, one JSON line)

usage: weir-timely [options]
  --pipeline keyed|stateless   the job [keyed]
  --events N                   records in total [100000000; 5 s worth with --rate]
  --rate R                     open loop at R records/s in total [closed loop]
  --keys K                     distinct keys [10000]
  --workers W                  timely worker threads, pinned to cores 0..W [2]
  --seed S                     generator seed [1]
  --warmup-ms MS               open loop: records of the schedule's first MS ms
                               are not measured (as weir bench) [200]
  --input source|handle        a source operator, or an InputHandle fed by the
                               worker's loop [source]
  --time batch|ms|record       timestamp per generator batch, per millisecond of
                               the clock, or per record (its seq) [batch]
  --lag T                      closed loop: the feeder stays at most T timestamps
                               ahead of the sink's probe [16 batches, 1 ms, or
                               16384 records per worker]
  --batch N                    records per generator poll, as weir's batch [1024]
  --no-pin                     leave the workers unpinned
  --json PATH                  also append the JSON line to PATH
";

/// Parses the command line into a [`Spec`] and an optional JSON path.
fn parse(args: impl Iterator<Item = String>) -> Result<(Spec, Option<String>), String> {
    let mut spec = Spec::default();
    let mut events = None;
    let mut lag = None;
    let mut json = None;
    let mut args = args.peekable();
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: String| v.parse::<u64>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--pipeline" => {
                spec.pipeline = match value()?.as_str() {
                    "keyed" => Pipeline::Keyed,
                    "stateless" => Pipeline::Stateless,
                    other => return Err(format!("--pipeline {other}: keyed or stateless")),
                }
            }
            "--events" => events = Some(number(value()?)?),
            "--rate" => {
                let v = value()?;
                let r: f64 = v.parse().map_err(|e| format!("--rate {v}: {e}"))?;
                if !(r.is_finite() && r > 0.0 && r <= 1e10) {
                    return Err(format!("--rate {v}: a positive number of records/s, at most 1e10"));
                }
                spec.rate = Some(r);
            }
            "--keys" => spec.keys = number(value()?)?,
            "--workers" => spec.workers = number(value()?)? as usize,
            "--seed" => spec.seed = number(value()?)?,
            "--warmup-ms" => spec.warmup_ms = number(value()?)?,
            "--input" => {
                spec.input = match value()?.as_str() {
                    "source" => Input::Source,
                    "handle" => Input::Handle,
                    other => return Err(format!("--input {other}: source or handle")),
                }
            }
            "--time" => {
                spec.time = match value()?.as_str() {
                    "batch" => TimeGrain::Batch,
                    "ms" => TimeGrain::Millisecond,
                    "record" => TimeGrain::Record,
                    other => return Err(format!("--time {other}: batch, ms or record")),
                }
            }
            "--lag" => lag = Some(number(value()?)?),
            "--batch" => spec.batch = number(value()?)? as usize,
            "--no-pin" => spec.pin = false,
            "--json" => json = Some(value()?),
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown option {other}")),
        }
    }
    if spec.keys == 0 || spec.workers == 0 || spec.batch == 0 {
        return Err("--keys, --workers and --batch must be at least 1".into());
    }
    spec.events = events.unwrap_or(match spec.rate {
        None => 100_000_000,
        Some(r) => ((r * 5.0) as u64).max(1000),
    });
    if spec.events == 0 {
        return Err("--events must be at least 1".into());
    }
    spec.lag = lag.unwrap_or(match spec.time {
        TimeGrain::Batch => 16,
        TimeGrain::Millisecond => 1,
        TimeGrain::Record => 16_384 * spec.workers as u64,
    });
    Ok((spec, json))
}

fn main() -> ExitCode {
    let (spec, json) = match parse(std::env::args().skip(1)) {
        Ok(p) => p,
        Err(e) if e.is_empty() => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("weir-timely: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let report = match job::run(&spec) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("weir-timely: {e}");
            return ExitCode::FAILURE;
        }
    };
    let line = serde_json::to_string(&report).expect("a report always serialises");
    println!("{line}");
    if let Some(path) = json {
        use std::io::Write;
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| writeln!(f, "{line}"));
        if let Err(e) = written {
            eprintln!("weir-timely: {path}: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
