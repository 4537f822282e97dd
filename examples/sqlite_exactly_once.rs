//! Exactly-once output into SQLite, through failures.
//!
//! ```text
//! readings (generator, p=2) -> chaos -> key_by(sensor) -> running count and sum (p=2)
//!     -> two-phase-commit SQLite sink (p=2) -> table `counts` in one database file
//! ```
//!
//! Every reading produces one row `(sensor, count, sum)`: the sensor's
//! running count and sum including that reading. The job checkpoints with
//! aligned barriers every 10 ms, and the `chaos` operator panics three
//! times along the way: each time the job restarts from its latest
//! checkpoint, the sources rewind, the keyed state comes back, and the sink
//! commits again the transactions the checkpoint recorded.
//!
//! Each sink subtask stages its rows in a staging table, marks them durable
//! at the barrier (pre-commit), and moves them into `counts` in one SQLite
//! transaction, together with its committed epoch in `weir_sink_epochs`, when
//! the checkpoint completes (commit). A commit whose epoch is not above the
//! recorded one does nothing, so a commit repeated after recovery never adds
//! rows twice.
//!
//! At the end the example checks the table: for every sensor with `n`
//! readings, exactly the counts `1..=n`, once each, and the right final
//! sum; then it prints the visibility latency (emission to commit).
//!
//! Run it with `cargo run --release -p weir-bench --example sqlite_exactly_once`
//! (a few seconds). Pass a path to keep the database there.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use weir_core::{CheckpointConfig, CheckpointMode, Pipeline, RestartStrategy, RuntimeConfig};
use weir_io::rusqlite::Connection;
use weir_io::{GenContext, Generator, GeneratorConfig, SqlRow, SqliteTable};

/// Readings over all source subtasks.
const READINGS: u64 = 300_000;
/// Distinct sensors (keys).
const SENSORS: u64 = 100;
/// Readings per second, over all source subtasks: the job runs ~1.5 s.
const RATE: f64 = 200_000.0;
/// Panics injected by the chaos operator.
const FAILURES: u32 = 3;
const SEED: u64 = 2024;

/// One output row: sensor, running count, running sum, emission stamp.
type Row = (u64, u64, u64, u64);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let keep = std::env::args().nth(1).map(PathBuf::from);
    let scratch = tempfile::tempdir()?;
    let root = keep.unwrap_or_else(|| scratch.path().to_path_buf());
    std::fs::create_dir_all(&root)?;
    let db = root.join("counts.sqlite");
    let _ = std::fs::remove_file(&db);
    let checkpoints = root.join("checkpoints");
    let _ = std::fs::remove_dir_all(&checkpoints);

    let table = SqliteTable::new(&db, "counts", &["sensor", "count", "sum"])
        .create("CREATE TABLE IF NOT EXISTS counts (sensor INTEGER, count INTEGER, sum INTEGER)");
    let bind = |r: &Row, row: &mut SqlRow<'_, '_>| {
        row.push(r.0 as i64).push(r.1 as i64).push(r.2 as i64);
    };

    // The injected panics print one line, not a backtrace.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info.payload().downcast_ref::<String>().map_or("", |s| s.as_str());
        if msg.starts_with("chaos:") {
            eprintln!("{msg}");
        } else {
            default_hook(info);
        }
    }));

    // Panics every 60,000 readings (counting replays), FAILURES times.
    let seen = Arc::new(AtomicU64::new(0));
    let left = Arc::new(AtomicU32::new(FAILURES));
    let chaos = move |r: (u64, u64, u64)| {
        let n = seen.fetch_add(1, Ordering::Relaxed) + 1;
        if n.is_multiple_of(60_000) && left.load(Ordering::Relaxed) > 0 {
            left.fetch_sub(1, Ordering::Relaxed);
            panic!("chaos: injected failure after {n} readings");
        }
        r
    };

    let gen = GeneratorConfig {
        seed: SEED,
        events: Some(READINGS),
        rate: Some(RATE),
        // One schedule for every attempt: records replayed after a restart
        // keep their original emission times, so the failures show in the
        // latency.
        start_ns: Some(weir_core::clock::now_ns()),
    };
    let p = Pipeline::new("sqlite-exactly-once");
    p.source("readings", 2, move |i, n| {
        Generator::new(gen, i, n, |c: GenContext| (c.random % SENSORS, c.seq, c.emitted_ns)).unwrap()
    })
    .map(chaos)
    .name("chaos")
    .key_by(|r: &(u64, u64, u64)| r.0)
    .parallelism(2)
    .process_heap(
        |sensor: &u64, st: &mut (u64, u64), (_, value, at): (u64, u64, u64), out| {
            st.0 += 1;
            st.1 += value;
            out.emit((*sensor, st.0, st.1, at));
        },
    )
    .name("running-count")
    .sink("sqlite", move |i| {
        weir_io::two_phase_sqlite_sink(table.clone(), i, bind, |r: &Row| r.3)
    });

    let config = RuntimeConfig {
        workers: 2,
        checkpointing: Some(CheckpointConfig {
            interval: Duration::from_millis(10),
            ..CheckpointConfig::new(CheckpointMode::Aligned, &checkpoints)
        }),
        restart: RestartStrategy::FixedDelay {
            attempts: FAILURES + 2,
            delay: Duration::from_millis(10),
        },
        ..RuntimeConfig::default()
    };
    let result = p.run(config)?.join()?;
    let stats = &result.metrics.checkpoints;

    // Check the table: exactly once per sensor.
    let mut expected: HashMap<u64, (u64, u64)> = HashMap::new();
    for seq in 0..READINGS {
        let random = weir_io::generator::splitmix64(seq ^ weir_io::generator::splitmix64(SEED));
        let e = expected.entry(random % SENSORS).or_default();
        e.0 += 1;
        e.1 += seq;
    }
    let conn = Connection::open(&db)?;
    let mut got: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
    let mut stmt = conn.prepare("SELECT sensor, count, sum FROM counts")?;
    let mut rows = stmt.query([])?;
    let mut total = 0u64;
    while let Some(r) = rows.next()? {
        let (s, c, sum): (i64, i64, i64) = (r.get(0)?, r.get(1)?, r.get(2)?);
        got.entry(s as u64).or_default().push((c as u64, sum as u64));
        total += 1;
    }
    for (sensor, (n, sum)) in &expected {
        let mut rows = got.remove(sensor).unwrap_or_default();
        rows.sort_unstable();
        let counts: Vec<u64> = rows.iter().map(|r| r.0).collect();
        if counts != (1..=*n).collect::<Vec<_>>() || rows.last().map(|r| r.1) != Some(*sum) {
            return Err(format!("sensor {sensor}: expected counts 1..={n} once each and sum {sum}").into());
        }
    }
    if !got.is_empty() {
        return Err(format!("rows for unknown sensors: {:?}", got.keys()).into());
    }

    let mut durations: Vec<u64> = stats.history.iter().map(|c| c.duration_us).collect();
    durations.sort_unstable();
    let sink_sync_us: Vec<u64> = stats
        .history
        .iter()
        .flat_map(|c| c.tasks.iter().filter(|t| t.task.contains("sqlite")).map(|t| t.sync_us))
        .collect();
    let lat = &result.metrics.visible_latency_ns;
    let ms = |q: f64| lat.value_at_quantile(q) as f64 / 1e6;
    println!(
        "{READINGS} readings, {total} rows in {} — exactly once per sensor",
        db.display()
    );
    println!(
        "{} checkpoints completed, {} restarts (restored from {:?}), {:.2} s",
        stats.completed,
        stats.restarts.len(),
        stats.restarts.iter().map(|r| r.restored_from).collect::<Vec<_>>(),
        result.elapsed.as_secs_f64()
    );
    if !durations.is_empty() {
        println!(
            "checkpoint duration: median {:.1} ms, max {:.1} ms; sink pre-commit (at the barrier): mean {:.1} ms",
            durations[durations.len() / 2] as f64 / 1e3,
            durations[durations.len() - 1] as f64 / 1e3,
            sink_sync_us.iter().sum::<u64>() as f64 / sink_sync_us.len().max(1) as f64 / 1e3
        );
    }
    println!(
        "visibility latency (emission to commit, failures included): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms over {} rows",
        ms(0.5),
        ms(0.99),
        lat.max() as f64 / 1e6,
        lat.len()
    );
    Ok(())
}
