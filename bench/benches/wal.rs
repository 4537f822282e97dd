//! Benchmark of the write-ahead-log sink (`weir_io::WalSink`): records
//! committed per second, 32-byte records, against the target of 20 M/s.
//!
//! Run: `nice -n -15 cargo bench -p weir-bench --bench wal`
//! (one to two minutes; needs ~3 GiB of free disk).
//!
//! Each sink subtask is driven by hand on a thread of its own, the way the
//! runtime drives it: batches of 1024 records are written, and every
//! `epoch` records a barrier (`pre_commit`: the log is written and fsynced)
//! is followed by the checkpoint's completion (`commit`: the epoch's output
//! is written to its file, fsynced, renamed, the folder fsynced, the marker
//! written and fsynced, the committed log segments deleted, on the sink's
//! committer thread). The sink's log thread writes and fsyncs the log; the
//! driver writes only while the sink is ready (`Sink::ready`), as a worker
//! does, and waits for the barrier's sync where the runtime's snapshot
//! pool would. The clock runs from the first write to the last commit
//! done, so every record counted is durable and visible. Each record costs
//! 48 bytes of log (16 of framing) and 32 bytes of output.
//!
//! Columns: `par` sink subtasks (driver threads, each with the sink's two
//! threads), `write`/`fsync`/`commit` the share of the drivers' time in
//! `write` (and waiting for `ready`), waiting for the barrier's sync, and
//! in `commit` calls, `records/CPU-s` records per second of the process's
//! CPU time (all threads): the sink's own cost, whatever else the machine
//! runs.
//!
//! The runs go to two folders: `target/bench-wal` (the disk) and, where it
//! exists, `/dev/shm` (memory: the sink's own cost, without the disk's).
//! Set `WEIR_WAL_BENCH_RECORDS` to change the records per run (default
//! 20 M) and `WEIR_WAL_BENCH_DIR` to add a folder.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use weir_core::harness::Harness;
use weir_core::Sink;
use weir_io::{WalSink, WalSinkConfig};

/// Records per `write` call, like the runtime's default batch.
const BATCH: u64 = 1024;

/// Bytes of one record: `r` + 16 hex digits + 14 `.` + `\n`.
const RECORD_BYTES: usize = 32;

/// Two hex digits for every byte value.
static HEX_PAIRS: [[u8; 2]; 256] = {
    let digits = b"0123456789abcdef";
    let mut t = [[0u8; 2]; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = [digits[i >> 4], digits[i & 0xf]];
        i += 1;
    }
    t
};

/// Appends a 32-byte line for `seq`: no allocation, no formatting machinery.
#[inline]
fn encode(seq: &u64, out: &mut Vec<u8>) {
    let mut line = *b"r0000000000000000..............\n";
    for (i, b) in seq.to_be_bytes().iter().enumerate() {
        line[1 + 2 * i..3 + 2 * i].copy_from_slice(&HEX_PAIRS[*b as usize]);
    }
    out.extend_from_slice(&line);
}

/// CPU time of the whole process (user and system, every thread, the
/// committer threads included), from `/proc/self/stat` in clock ticks of
/// 10 ms; `None` where that does not exist.
fn process_cpu() -> Option<Duration> {
    let s = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which is in parentheses): utime is the
    // 12th, stime the 13th.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

/// What one sink subtask measured.
struct Run {
    seconds: f64,
    write: Duration,
    pre_commit: Duration,
    commit: Duration,
}

/// Drives subtask `subtask` of a WAL sink through `records` records with a
/// checkpoint every `epoch` records.
fn drive(cfg: &WalSinkConfig, subtask: usize, records: u64, epoch: u64) -> Run {
    let mut sink = WalSink::new(cfg.clone(), subtask, encode, |_: &u64| 0);
    let mut h = Harness::new(subtask, 1);
    let mut batch: Vec<u64> = Vec::with_capacity(BATCH as usize);
    let (mut write, mut pre_commit, mut commit) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let mut id = 0;
    let start = Instant::now();
    let mut seq = 0;
    while seq < records {
        let end = (seq + epoch).min(records);
        let t = Instant::now();
        while seq < end {
            if !h.ready_sink(&mut sink).unwrap() {
                // Backpressure: the log thread lags.
                std::thread::yield_now();
                continue;
            }
            let hi = (seq + BATCH).min(end);
            batch.extend(seq..hi);
            h.write_sink(&mut sink, &mut batch).unwrap();
            seq = hi;
        }
        let t1 = Instant::now();
        id += 1;
        let _ = sink.pre_commit(id).unwrap();
        let t2 = Instant::now();
        sink.commit(id).unwrap();
        let t3 = Instant::now();
        write += t1 - t;
        pre_commit += t2 - t1;
        commit += t3 - t2;
    }
    // The last commits, on the committer thread, are part of the run.
    let t = Instant::now();
    sink.wait_idle().unwrap();
    commit += t.elapsed();
    let seconds = start.elapsed().as_secs_f64();
    h.finish_sink(&mut sink).unwrap();
    Run {
        seconds,
        write,
        pre_commit,
        commit,
    }
}

/// `subtasks` sink subtasks on their own threads, `records` in all; the
/// output is checked, then deleted.
/// Returns each subtask's figures and the process's CPU time.
fn run(dir: &Path, records: u64, epoch: u64, subtasks: usize) -> (Vec<Run>, Option<Duration>) {
    let _ = std::fs::remove_dir_all(dir);
    let cfg = WalSinkConfig::new(dir.join("wal"), dir.join("out"));
    let each = records / subtasks as u64;
    let cpu0 = process_cpu();
    let runs: Vec<Run> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..subtasks)
            .map(|i| {
                let cfg = &cfg;
                s.spawn(move || drive(cfg, i, each, epoch))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let cpu = process_cpu().zip(cpu0).map(|(b, a)| b - a);
    // Check the output before throwing it away: every record, in order.
    let out = weir_io::committed_files(&cfg.target_dir).unwrap();
    let bytes: u64 = out.iter().map(|f| std::fs::metadata(f).unwrap().len()).sum();
    assert_eq!(
        bytes,
        each * subtasks as u64 * RECORD_BYTES as u64,
        "committed output size"
    );
    let last = std::fs::read(out.last().unwrap()).unwrap();
    let mut expected = Vec::new();
    encode(&(each - 1), &mut expected);
    assert!(last.ends_with(&expected), "the last record is the last line");
    let _ = std::fs::remove_dir_all(dir);
    (runs, cpu)
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is accepted.
    let records: u64 = std::env::var("WEIR_WAL_BENCH_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000_000);
    let mut places: Vec<(String, PathBuf)> = vec![(
        "disk".into(),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-wal"),
    )];
    if Path::new("/dev/shm").is_dir() {
        places.push(("memory".into(), PathBuf::from("/dev/shm/weir-bench-wal")));
    }
    if let Ok(d) = std::env::var("WEIR_WAL_BENCH_DIR") {
        places.push((d.clone(), PathBuf::from(d).join("weir-bench-wal")));
    }
    eprintln!("WAL sink: {records} records of {RECORD_BYTES} bytes per run, batches of {BATCH}");
    eprintln!(
        "{:<8} {:>9} {:>3} {:>8} {:>11} {:>12} {:>8} {:>8} {:>8} {:>15}",
        "place", "epoch", "par", "seconds", "records/s", "log+out MB/s", "write", "fsync", "commit", "records/CPU-s"
    );
    for (name, dir) in &places {
        // 200 K records is one 10 ms checkpoint at 20 M/s; 2 M is 100 ms.
        for (epoch, subtasks) in [(200_000u64, 1usize), (2_000_000, 1), (200_000, 2)] {
            let (runs, cpu) = run(dir, records, epoch, subtasks);
            let seconds = runs.iter().map(|r| r.seconds).fold(0.0, f64::max);
            let total = (records / subtasks as u64 * subtasks as u64) as f64;
            let rate = total / seconds;
            let mbs = rate * (RECORD_BYTES as f64 * 2.0 + 16.0) / 1e6;
            let sum = |f: fn(&Run) -> Duration| runs.iter().map(f).sum::<Duration>().as_secs_f64();
            let busy = sum(|r| r.write) + sum(|r| r.pre_commit) + sum(|r| r.commit);
            let pct = |d: f64| 100.0 * d / busy;
            let per_cpu = cpu.map_or("-".to_string(), |c| format!("{:.2} M", total / c.as_secs_f64() / 1e6));
            eprintln!(
                "{:<8} {:>9} {:>3} {:>8.3} {:>9.2} M {:>12.0} {:>7.1}% {:>7.1}% {:>7.1}% {:>15}",
                name,
                epoch,
                subtasks,
                seconds,
                rate / 1e6,
                mbs,
                pct(sum(|r| r.write)),
                pct(sum(|r| r.pre_commit)),
                pct(sum(|r| r.commit)),
                per_cpu
            );
        }
    }
}
