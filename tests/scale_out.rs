//! `weir run --instances N --instance I` against the real broker: a job
//! over one topic shared by two and by three processes, one of them
//! killed (SIGKILL) and restarted; and a job rescaled from two processes
//! to three and back to two, each step stopped by SIGKILL mid-stream.
//! A `read_committed` reader checks that every key's counts `1..=n`
//! appear exactly once, with sums that add the key's input values.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::kafka;
use common::runs::{check, kafka_rows, Drained, Rng};

/// Partitions of the input topic: the job's shards.
const PARTITIONS: i32 = 6;
const LINES: usize = 6000;
const KEYS: u64 = 40;
/// Partitions of the output topic.
const OUT_PARTITIONS: i32 = 2;

/// A job's topics and expected values.
struct Job {
    input: String,
    output: String,
    values: HashMap<String, Vec<i64>>,
}

/// Creates the topics and fills the input: each key's lines in one
/// partition (the record key is the line's key), in order.
fn job(seed: u64) -> Job {
    let b = kafka::broker();
    let input = kafka::unique_topic("scale-in");
    let output = kafka::unique_topic("scale-out");
    b.create_topic(&input, PARTITIONS);
    b.create_topic(&output, OUT_PARTITIONS);
    let mut rng = Rng(seed);
    let mut values: HashMap<String, Vec<i64>> = HashMap::new();
    let mut records = Vec::with_capacity(LINES);
    for _ in 0..LINES {
        let k = rng.next() % KEYS;
        let v = (rng.next() % 2001) as i64 - 1000;
        let key = format!("key-{k}");
        records.push(((k % PARTITIONS as u64) as i32, format!("{key},{v}")));
        values.entry(key).or_default().push(v);
    }
    let keys: Vec<String> = records
        .iter()
        .map(|(_, l)| l.split(',').next().unwrap().to_string())
        .collect();
    b.produce(
        &input,
        records
            .iter()
            .zip(&keys)
            .map(|((p, l), k)| (*p, k.as_str(), l.clone(), None)),
    );
    Job { input, output, values }
}

/// The arguments of process `i` of `n`.
/// `throttle`: records per second per shard.
fn args(j: &Job, mode: &str, throttle: u32, n: usize, i: usize, ck: &Path, rescale_from: &[PathBuf]) -> Vec<String> {
    let b = kafka::broker();
    let mut a: Vec<String> = [
        "run",
        "--job",
        "keyed-count",
        "--input",
        &format!("kafka:{}/{}", b.addr, j.input),
        "--output",
        &format!("kafka:{}/{}", b.addr, j.output),
        "--checkpoint-dir",
        ck.to_str().unwrap(),
        "--mode",
        mode,
        "--sink",
        "wal",
        "--parallelism",
        "1",
        "--checkpoint-interval-ms",
        "20",
        "--throttle",
        &throttle.to_string(),
        "--instances",
        &n.to_string(),
        "--instance",
        &i.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for f in rescale_from {
        a.push("--rescale-from".into());
        a.push(f.to_str().unwrap().into());
    }
    a
}

/// Runs the processes `procs` side by side until each exits 0; process
/// `victim` is killed `kills` times at pseudo-random instants and started
/// again with the same arguments. Returns the kills that landed.
fn run_all(procs: &[Vec<String>], victim: usize, kills: usize, rng: &mut Rng) -> usize {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut children: Vec<Option<Drained>> = procs.iter().map(|a| Some(Drained::spawn(a))).collect();
    let mut landed = 0;
    let mut kill_at = Instant::now() + Duration::from_millis(300 + rng.next() % 900);
    while children.iter().any(Option::is_some) {
        assert!(Instant::now() < deadline, "the processes never finished");
        for (i, slot) in children.iter_mut().enumerate() {
            let Some(child) = slot.as_mut() else { continue };
            if let Some(status) = child.try_wait() {
                assert!(status.success(), "process {i} failed: {status}: {}", child.log());
                *slot = None;
                continue;
            }
            if i == victim && landed < kills && Instant::now() >= kill_at {
                child.kill(); // SIGKILL
                landed += 1;
                *slot = Some(Drained::spawn(&procs[i]));
                kill_at = Instant::now() + Duration::from_millis(300 + rng.next() % 900);
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    landed
}

/// Starts the processes, waits until the output holds at least `at_least`
/// records plus a pseudo-random moment, and kills them all (SIGKILL).
/// Returns the output's records at the kill, or `None` if every process
/// finished first.
fn run_then_kill(procs: &[Vec<String>], j: &Job, at_least: usize, rng: &mut Rng) -> Option<usize> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut children: Vec<Drained> = procs.iter().map(|a| Drained::spawn(a)).collect();
    loop {
        assert!(Instant::now() < deadline, "no output within 60 s");
        for (i, c) in children.iter_mut().enumerate() {
            if let Some(status) = c.try_wait() {
                assert!(status.success(), "process {i} failed: {status}: {}", c.log());
            }
        }
        if kafka::read_committed(&j.output, OUT_PARTITIONS).len() >= at_least {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(100 + rng.next() % 300));
    let mut running = 0;
    for (i, c) in children.iter_mut().enumerate() {
        match c.try_wait() {
            Some(status) => assert!(status.success(), "process {i} failed: {status}: {}", c.log()),
            None => {
                running += 1;
                c.kill(); // SIGKILL
            }
        }
    }
    (running > 0).then(|| kafka::read_committed(&j.output, OUT_PARTITIONS).len())
}

/// Every key's counts `1..=n` exactly once, each sum adding one of the
/// key's values, the last sum their total; no other keys.
fn check_exactly_once(j: &Job) {
    check(&j.values, &kafka_rows(kafka::broker(), &j.output, OUT_PARTITIONS), true);
}

/// `n` processes over one topic; process `n - 1` is killed `kills` times.
fn shared(n: usize, mode: &str, kills: usize, seed: u64) -> usize {
    let root = tempfile::tempdir().unwrap();
    let j = job(seed);
    let procs: Vec<Vec<String>> = (0..n)
        .map(|i| args(&j, mode, 400, n, i, &root.path().join(format!("p{i}")), &[]))
        .collect();
    let landed = run_all(&procs, n - 1, kills, &mut Rng(seed ^ 0x5eed));
    check_exactly_once(&j);
    landed
}

#[test]
fn two_and_three_processes_over_one_topic_survive_killing_one() {
    assert!(shared(2, "aligned", 3, 11) >= 2);
    assert!(shared(3, "unaligned", 3, 12) >= 2);
}

/// The shard generation recorded in a process folder's shard.
fn generation(folder: &Path, shard: usize) -> String {
    let text = std::fs::read_to_string(folder.join(format!("shard-{shard:04}")).join("generation")).unwrap();
    text.lines().next().unwrap().to_string()
}

/// Slow enough that each stop lands mid-stream, however slow the machine:
/// the stops wait for output, which shows only after each run's first
/// checkpoint transaction (the sinks' producers start in 1-3 s, far more
/// under load), while the sources read from the start. At 20 lines/s a
/// shard's 1000 records take 50 s; 150 and 60 lines/s let runs finish
/// before their stop (a quiet machine, then a loaded one).
const RESCALE_THROTTLE: u32 = 20;

/// The last run, which goes to the end: as fast as the other tests'.
const FINISH_THROTTLE: u32 = 400;

#[test]
fn rescaling_2_to_3_to_2_keeps_output_exactly_once() {
    let root = tempfile::tempdir().unwrap();
    let j = job(21);
    let mut rng = Rng(21);
    let f: Vec<PathBuf> = (0..3).map(|i| root.path().join(format!("p{i}"))).collect();
    let mode = "unaligned";
    // Two processes: shards 0 2 4 | 1 3 5. Stopped mid-stream.
    let two: Vec<Vec<String>> = (0..2)
        .map(|i| args(&j, mode, RESCALE_THROTTLE, 2, i, &f[i], &[]))
        .collect();
    let a = run_then_kill(&two, &j, 1, &mut rng).expect("the first run was stopped before it finished");
    // Three: 0 3 | 1 4 | 2 5, from the two old folders (p2 is new).
    let three: Vec<Vec<String>> = (0..3)
        .map(|i| args(&j, mode, RESCALE_THROTTLE, 3, i, &f[i], &f[..2]))
        .collect();
    let b = run_then_kill(&three, &j, a + 500, &mut rng).expect("the second run was stopped before it finished");
    eprintln!("output records: {a} at the first stop, {b} at the second, of {LINES}");
    assert!(
        b > a && b < LINES,
        "the output grew across the first rescale: {a} then {b} of {LINES}"
    );
    assert_eq!(generation(&f[0], 3), "generation=1", "p0 took shard 3 over from p1");
    assert_eq!(generation(&f[2], 2), "generation=1", "p2 took shard 2 over from p0");
    // Back to two, from all three; p0 still has its old copy of shard 2
    // (generation 0), and must take p2's; one process is killed once more.
    let back: Vec<Vec<String>> = (0..2)
        .map(|i| args(&j, mode, FINISH_THROTTLE, 2, i, &f[i], &f))
        .collect();
    run_all(&back, 1, 1, &mut rng);
    assert_eq!(generation(&f[0], 2), "generation=2", "p0 took shard 2 back from p2");
    assert_eq!(generation(&f[1], 5), "generation=2", "p1 took shard 5 back from p2");
    check_exactly_once(&j);
}

#[test]
fn bad_instance_settings_are_refused_with_reasons() {
    let root = tempfile::tempdir().unwrap();
    let b = kafka::broker();
    let ck = root.path().join("ck");
    let input = root.path().join("in.txt");
    std::fs::write(&input, "a,1\n").unwrap();
    let run = |extra: &[&str], input: &str| {
        let mut a: Vec<String> = [
            "run",
            "--job",
            "keyed-count",
            "--input",
            input,
            "--output",
            &format!("kafka:{}/never-written", b.addr),
            "--checkpoint-dir",
            ck.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.extend(extra.iter().map(|s| s.to_string()));
        let out = Command::new(env!("CARGO_BIN_EXE_weir")).args(&a).output().unwrap();
        assert!(!out.status.success(), "{extra:?} was accepted");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let kafka_in = format!("kafka:{}/never-read", b.addr);
    let e = run(&["--instances", "2", "--instance", "2"], &kafka_in);
    assert!(e.contains("--instance 2 is out of range"), "{e}");
    let e = run(&["--instances", "0", "--instance", "0"], &kafka_in);
    assert!(e.contains("at least 1"), "{e}");
    let e = run(&["--instances", "2"], &kafka_in);
    assert!(e.contains("needs --instance"), "{e}");
    let e = run(&["--instance", "1"], &kafka_in);
    assert!(e.contains("give --instances"), "{e}");
    let e = run(&["--instances", "2", "--instance", "0"], input.to_str().unwrap());
    assert!(e.contains("every --input must be kafka"), "{e}");
}
