//! The end-to-end guarantee, tested the hard way: `weir run` is killed with
//! SIGKILL at random instants, restarted with the same arguments each
//! time until it exits 0, and then its committed output is checked.
//!
//! At least 20 kills land over the scenarios (each asserts its share).
//!
//! Aligned and unaligned: for every key with `n` input records, the
//! committed output holds exactly the lines with counts `1..=n`, once each,
//! with sums consistent with the input. At-least-once: no count missing.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::runs::{check, kafka_rows, produce_lines, tail, Drained, Rng};

const FILES: usize = 3;
const LINES_PER_FILE: usize = 4000;
const KEYS: u64 = 40;

/// Writes the input files; returns every key's values.
fn write_input(dir: &Path, seed: u64) -> HashMap<String, Vec<i64>> {
    std::fs::create_dir_all(dir).unwrap();
    let mut rng = Rng(seed);
    let mut values: HashMap<String, Vec<i64>> = HashMap::new();
    for f in 0..FILES {
        let mut text = String::new();
        for _ in 0..LINES_PER_FILE {
            let key = format!("key-{}", rng.next() % KEYS);
            let v = (rng.next() % 2001) as i64 - 1000;
            text.push_str(&format!("{key},{v}\n"));
            values.entry(key).or_default().push(v);
        }
        std::fs::write(dir.join(format!("in-{f}.txt")), text).unwrap();
    }
    values
}

/// The input of the file scenarios (seed `seed`, written to `files`) in
/// `topic`, created with 3 partitions, each key's lines in one partition in
/// input order; returns every key's values.
fn kafka_input(b: &common::kafka::Broker, topic: &str, files: &Path, seed: u64) -> HashMap<String, Vec<i64>> {
    b.create_topic(topic, 3);
    let values = write_input(files, seed);
    let mut lines = Vec::new();
    for f in 0..FILES {
        let text = std::fs::read_to_string(files.join(format!("in-{f}.txt"))).unwrap();
        lines.extend(text.lines().map(str::to_string));
    }
    produce_lines(b, topic, 3, &lines);
    values
}

/// Committed output lines: (key, count, sum), from the regular files
/// whose names do not start with '.'.
fn committed(dir: &Path) -> Vec<(String, u64, i64)> {
    let mut rows = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || !entry.file_type().unwrap().is_file() {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).unwrap();
        assert!(
            text.is_empty() || text.ends_with('\n'),
            "{name}: a committed file ends with a partial line"
        );
        for line in text.lines() {
            let mut p = line.split(',');
            let (k, c, s) = (p.next().unwrap(), p.next().unwrap(), p.next().unwrap());
            assert!(p.next().is_none(), "{name}: bad line {line:?}");
            rows.push((k.to_string(), c.parse().unwrap(), s.parse().unwrap()));
        }
    }
    rows
}

/// Runs `weir run` until it exits 0, killing it `kills` times at
/// pseudo-random instants first; returns the number of kills that landed.
/// Its stderr is read while it runs ([`Drained`]), so a run that logs more
/// than a pipe holds never blocks.
fn run_with_kills(args: &[String], kills: usize, rng: &mut Rng) -> usize {
    let mut landed = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(Instant::now() < deadline, "weir run never finished");
        let mut child = Drained::spawn(args);
        if landed < kills {
            let wait = Duration::from_millis(30 + rng.next() % 400);
            let start = Instant::now();
            let mut exited = None;
            while start.elapsed() < wait {
                if let Some(status) = child.try_wait() {
                    exited = Some(status);
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            match exited {
                Some(status) => {
                    assert!(status.success(), "weir run failed: {status}: {}", child.log());
                    return landed;
                }
                None => {
                    child.kill(); // SIGKILL
                    landed += 1;
                    continue;
                }
            }
        }
        let status = child.wait();
        assert!(
            status.success(),
            "weir run failed after {landed} kills: {status}: {}",
            child.log()
        );
        return landed;
    }
}

/// `weir run` of the keyed count from `input` to `output`, checkpointing to
/// `ck` every 20 ms, each source subtask throttled to 5,000 lines/s so that
/// kills land mid-run.
fn run_args(input: &str, output: &str, ck: &Path, mode: &str, sink: &str) -> Vec<String> {
    [
        "run",
        "--job",
        "keyed-count",
        "--input",
        input,
        "--output",
        output,
        "--checkpoint-dir",
        ck.to_str().unwrap(),
        "--mode",
        mode,
        "--sink",
        sink,
        "--checkpoint-interval-ms",
        "20",
        "--throttle",
        "5000",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// What one scenario did.
struct Outcome {
    /// Kills that landed before the run finished.
    kills: usize,
    /// Checkpoints triggered over all attempts (the highest id: ids go on
    /// across restarts).
    checkpoints: u64,
    /// Output lines beyond one per (key, count): zero for exactly-once
    /// (checked), replays for at-least-once.
    duplicates: usize,
}

/// The highest checkpoint id in `ck` (folders `chk-<id>`), 0 if none.
fn last_checkpoint(ck: &Path) -> u64 {
    let Ok(dir) = std::fs::read_dir(ck) else {
        return 0;
    };
    dir.filter_map(|e| {
        let name = e.ok()?.file_name().to_string_lossy().into_owned();
        name.strip_prefix("chk-")?.parse::<u64>().ok()
    })
    .max()
    .unwrap_or(0)
}

/// Output lines beyond one per (key, count).
fn duplicates(rows: &[(String, u64, i64)]) -> usize {
    let unique: std::collections::HashSet<(&str, u64)> = rows.iter().map(|r| (r.0.as_str(), r.1)).collect();
    rows.len() - unique.len()
}

fn scenario(mode: &str, sink: &str, kills: usize, seed: u64) -> usize {
    scenario_outcome(mode, sink, kills, seed).kills
}

fn scenario_outcome(mode: &str, sink: &str, kills: usize, seed: u64) -> Outcome {
    let root = tempfile::tempdir().unwrap();
    let input = root.path().join("in");
    let values = write_input(&input, seed);
    let out: PathBuf = root.path().join("out");
    let ck: PathBuf = root.path().join("ck");
    let args = run_args(input.to_str().unwrap(), out.to_str().unwrap(), &ck, mode, sink);
    let mut rng = Rng(seed ^ 0x5eed);
    // Every sink does its I/O on threads of its own: a durable step on a
    // worker fails the run.
    let landed = run_with_kills(&args, kills, &mut rng);
    let rows = committed(&out);
    check(&values, &rows, exactly_once(mode));
    Outcome {
        kills: landed,
        checkpoints: last_checkpoint(&ck),
        duplicates: duplicates(&rows),
    }
}

/// Whether `mode` promises exactly-once output.
fn exactly_once(mode: &str) -> bool {
    mode == "aligned" || mode == "unaligned" || mode == "dedup"
}

#[test]
fn aligned_wal_survives_kills() {
    assert!(scenario("aligned", "wal", 5, 1) >= 4);
}

#[test]
fn unaligned_wal_survives_kills() {
    assert!(scenario("unaligned", "wal", 5, 2) >= 4);
}

#[test]
fn aligned_two_phase_file_survives_kills() {
    assert!(scenario("aligned", "2pc-file", 5, 3) >= 4);
}

#[test]
fn unaligned_two_phase_file_survives_kills() {
    assert!(scenario("unaligned", "2pc-file", 5, 4) >= 4);
}

#[test]
fn dedup_wal_survives_kills() {
    assert!(scenario("dedup", "wal", 5, 11) >= 4);
}

#[test]
fn dedup_two_phase_file_survives_kills() {
    assert!(scenario("dedup", "2pc-file", 5, 12) >= 4);
}

#[test]
fn at_least_once_loses_nothing_across_kills() {
    assert!(scenario("at-least-once", "wal", 3, 5) >= 2);
    assert!(scenario("at-least-once", "direct", 3, 6) >= 2);
}

/// `weir run` from a Kafka topic to a Kafka topic, killed `kills` times:
/// the input topic (3 partitions) holds the same lines as the files of the
/// other scenarios, and a `read_committed` reader checks the output topic.
fn kafka_scenario(mode: &str, sink: &str, kills: usize, seed: u64) -> usize {
    kafka_outcome(mode, sink, kills, seed).kills
}

fn kafka_outcome(mode: &str, sink: &str, kills: usize, seed: u64) -> Outcome {
    let root = tempfile::tempdir().unwrap();
    let b = common::kafka::broker();
    let input = common::kafka::unique_topic("run-in");
    let output = common::kafka::unique_topic("run-out");
    let values = kafka_input(b, &input, &root.path().join("in"), seed);
    let ck: PathBuf = root.path().join("ck");
    let args = run_args(
        &format!("kafka:{}/{input}", b.addr),
        &format!("kafka:{}/{output}", b.addr),
        &ck,
        mode,
        sink,
    );
    let mut rng = Rng(seed ^ 0x5eed);
    let landed = run_with_kills(&args, kills, &mut rng);
    let rows = kafka_rows(b, &output, 2);
    check(&values, &rows, exactly_once(mode));
    Outcome {
        kills: landed,
        checkpoints: last_checkpoint(&ck),
        duplicates: duplicates(&rows),
    }
}

#[test]
fn kafka_to_kafka_survives_kills_exactly_once_or_at_least_once() {
    assert!(kafka_scenario("aligned", "wal", 4, 7) >= 3);
    assert!(kafka_scenario("unaligned", "wal", 4, 8) >= 3);
    assert!(kafka_scenario("dedup", "wal", 4, 10) >= 3);
    assert!(kafka_scenario("at-least-once", "direct", 3, 9) >= 2);
}

/// The soak (docs/design/testing.md#the-soak): `weir run` killed at random, over every
/// mode and sink, files and Kafka (the seed picks the combination: consecutive seeds
/// go round robin), for `WEIR_SOAK_SECONDS` (default 1800),
/// each run's committed output checked exactly (at-least-once and none: no
/// count missing). Seeds start at `WEIR_SOAK_SEED` (default: the clock);
/// the first failure panics naming its seed, and `WEIR_SOAK_SEED=<seed>
/// WEIR_SOAK_SECONDS=0` replays exactly that run. Not in CI: run it with
/// `bench/soak.sh`.
#[test]
#[ignore = "a long soak; run by bench/soak.sh"]
fn soak() {
    const COMBOS: [(&str, &str); 13] = [
        ("aligned", "wal"),
        ("dedup", "wal"),
        ("dedup", "2pc-file"),
        ("dedup", "kafka wal"),
        ("aligned", "2pc-file"),
        ("unaligned", "wal"),
        ("unaligned", "2pc-file"),
        ("at-least-once", "wal"),
        ("at-least-once", "direct"),
        ("none", "direct"),
        ("aligned", "kafka wal"),
        ("unaligned", "kafka wal"),
        ("at-least-once", "kafka direct"),
    ];
    let var = |name: &str| std::env::var(name).ok().map(|v| v.parse::<u64>().expect(name));
    let seconds = var("WEIR_SOAK_SECONDS").unwrap_or(1800);
    let first = var("WEIR_SOAK_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    });
    let deadline = Instant::now() + Duration::from_secs(seconds);
    // Per combination: runs, kills, checkpoints, duplicate lines.
    let mut totals = [(0usize, 0usize, 0u64, 0usize); COMBOS.len()];
    let mut seed = first;
    let mut i = 0;
    while Instant::now() < deadline || i == 0 {
        let c = (seed % COMBOS.len() as u64) as usize;
        let (mode, sink) = COMBOS[c];
        let kills = 5 + (Rng(seed).next() % 11) as usize;
        let outcome = std::panic::catch_unwind(|| match sink.strip_prefix("kafka ") {
            Some(sink) => kafka_outcome(mode, sink, kills, seed),
            None => scenario_outcome(mode, sink, kills, seed),
        });
        let o = outcome.unwrap_or_else(|e| {
            panic!(
                "soak: {mode}/{sink} seed {seed} failed (replay: WEIR_SOAK_SEED={seed} \
                 WEIR_SOAK_SECONDS=0): {:?}",
                e.downcast_ref::<String>()
            )
        });
        let t = &mut totals[c];
        *t = (t.0 + 1, t.1 + o.kills, t.2 + o.checkpoints, t.3 + o.duplicates);
        seed += 1;
        i += 1;
    }
    println!("soak: {seconds} s from seed {first}, {i} runs, no loss, no duplicate in exactly-once output");
    println!("| mode | sink | runs | kills | checkpoints | duplicate lines |");
    println!("|---|---|---:|---:|---:|---:|");
    for ((mode, sink), (runs, kills, ck, dup)) in COMBOS.iter().zip(totals) {
        println!("| {mode} | {sink} | {runs} | {kills} | {ck} | {dup} |");
    }
}

/// `weir run` from Kafka to Kafka while its broker (one of this test's
/// own, so the binary's other tests keep theirs) is stopped and started
/// again mid-job: the job rides the outage out (its clients reconnect; a
/// call that times out fails the job, which restarts from its last
/// checkpoint, and a run that exhausts its restarts is run again with the
/// same arguments, as a supervisor would), and a `read_committed` reader
/// then sees every count exactly once.
#[test]
fn kafka_to_kafka_rides_out_a_broker_restart_exactly_once() {
    let root = tempfile::tempdir().unwrap();
    let own = common::kafka::OwnBroker::start("restart");
    let b = &own.broker;
    let input = common::kafka::unique_topic("restart-in");
    let output = common::kafka::unique_topic("restart-out");
    let values = kafka_input(b, &input, &root.path().join("in"), 11);
    let ck: PathBuf = root.path().join("ck");
    // 12,000 lines at 1,000 a second per source subtask: about 6 s of work,
    // so the outage lands in the middle.
    let args: Vec<String> = [
        "run",
        "--job",
        "keyed-count",
        "--input",
        &format!("kafka:{}/{input}", b.addr),
        "--output",
        &format!("kafka:{}/{output}", b.addr),
        "--checkpoint-dir",
        ck.to_str().unwrap(),
        "--mode",
        "aligned",
        "--sink",
        "wal",
        "--checkpoint-interval-ms",
        "50",
        "--throttle",
        "1000",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut child = Drained::spawn(&args);
    std::thread::sleep(Duration::from_millis(2500));
    if child.try_wait().is_some() {
        panic!("weir run ended before the broker was stopped: {}", child.log());
    }
    own.stop();
    let down = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    own.start_again();
    eprintln!("the broker was down for {:.1} s", down.elapsed().as_secs_f64());
    let mut runs = 1;
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let status = loop {
            if let Some(status) = child.try_wait() {
                break status;
            }
            if Instant::now() > deadline {
                panic!(
                    "weir run did not finish within 240 s of the broker's restart; its log: {}",
                    child.kill()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let log = child.log();
        if status.success() {
            eprintln!(
                "weir run finished after the broker's restart (run {runs}); its log ({} bytes kept) ends: {}",
                log.len(),
                tail(&log, 2000)
            );
            break;
        }
        // Its restarts ran out while the broker was away: run it again.
        eprintln!("weir run exited with {status} after the restart: {log}");
        assert!(
            runs < 3,
            "weir run failed {runs} times after the broker's restart: {log}"
        );
        runs += 1;
        child = Drained::spawn(&args);
    }
    let rows = kafka_rows(b, &output, 2);
    check(&values, &rows, true);
}

/// `--bad-records skip`: malformed lines are skipped, written to the
/// rejected-records file and counted in the summary; the good lines'
/// output is whole. Without it the run fails naming the file and line.
#[test]
fn bad_records_are_skipped_and_counted_or_stop_the_run() {
    let root = tempfile::tempdir().unwrap();
    let input = root.path().join("in.txt");
    std::fs::write(&input, "a,1\nb,2\nno comma\nc,x\na,5\n").unwrap();
    let weir = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
            .args(args)
            .output()
            .unwrap()
    };
    let (out, ck) = (root.path().join("out"), root.path().join("ck"));
    let base = |out: &Path, ck: &Path| {
        vec![
            "run".to_string(),
            "--job".into(),
            "keyed-count".into(),
            "--input".into(),
            input.to_str().unwrap().into(),
            "--output".into(),
            out.to_str().unwrap().into(),
            "--checkpoint-dir".into(),
            ck.to_str().unwrap().into(),
        ]
    };
    let mut args = base(&out, &ck);
    args.extend(["--bad-records".into(), "skip".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let r = weir(&args);
    let stdout = String::from_utf8_lossy(&r.stdout);
    assert!(r.status.success(), "{stdout}{}", String::from_utf8_lossy(&r.stderr));
    let rejected = ck.join("rejected-records.tsv");
    assert!(
        stdout.contains(&format!(
            "2 malformed input lines skipped in this run, written to {}",
            rejected.display()
        )),
        "{stdout}"
    );
    let lines = std::fs::read_to_string(&rejected).unwrap();
    let numbers: Vec<&str> = lines.lines().map(|l| l.split('\t').nth(1).unwrap()).collect();
    assert_eq!(numbers, ["3", "4"], "{lines}");
    let mut rows = committed(&out);
    rows.sort();
    let want = [("a", 1, 1), ("a", 2, 6), ("b", 1, 2)].map(|(k, c, s)| (k.to_string(), c, s));
    assert_eq!(rows, want);

    // The default: the first bad line stops the run, named.
    let (out, ck) = (root.path().join("out2"), root.path().join("ck2"));
    let args = base(&out, &ck);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let r = weir(&args);
    let stderr = String::from_utf8_lossy(&r.stderr);
    assert!(!r.status.success());
    assert!(
        stderr.contains(&format!("{}, line 3: expected `key,value`: no comma", input.display())),
        "{stderr}"
    );
    assert!(!ck.join("rejected-records.tsv").exists());
}
