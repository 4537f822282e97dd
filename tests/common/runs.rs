//! Shared by the tests that run the `weir` binary (`tests/crash.rs`,
//! `tests/scale_out.rs`): a deterministic random sequence, child processes
//! whose stderr is drained while they run, Kafka input production and
//! output parsing, and the exact check of a keyed count's output.

use std::collections::HashMap;
use std::process::{Command, Stdio};

use super::kafka::Broker;

/// A deterministic pseudo-random sequence (SplitMix64).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// The `weir` binary with `args`, its stderr piped, logging warnings, and
/// forbidding file I/O on the job's workers (`WEIR_FORBID_WORKER_IO`): a
/// sink's durable steps must run on its own threads.
pub fn weir(args: &[String]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_weir"));
    c.args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .env("WEIR_LOG", "warn")
        .env("WEIR_FORBID_WORKER_IO", "1");
    c
}

/// The last `n` bytes (or a little more, at a character boundary) of `s`.
pub fn tail(s: &str, n: usize) -> &str {
    let mut from = s.len().saturating_sub(n);
    while !s.is_char_boundary(from) {
        from -= 1;
    }
    &s[from..]
}

/// The most of a child's stderr a [`Drained`] keeps: its last bytes.
pub const KEPT_LOG_BYTES: usize = 256 * 1024;

/// A `weir` child whose stderr is read while it runs, on a thread of its
/// own, keeping the last [`KEPT_LOG_BYTES`]. A child that logs more than a
/// pipe holds (64 KiB: a job's clients log every failed reconnection while
/// its broker is down) would otherwise block in its next write to stderr
/// and look hung.
pub struct Drained {
    child: std::process::Child,
    log: Option<std::thread::JoinHandle<String>>,
}

impl Drained {
    /// Starts `weir` with `args` ([`weir`]).
    pub fn spawn(args: &[String]) -> Self {
        use std::io::Read;
        let mut child = weir(args).spawn().unwrap();
        let mut err = child.stderr.take().expect("stderr is piped");
        let log = std::thread::spawn(move || {
            let (mut kept, mut dropped) = (Vec::new(), 0usize);
            let mut buf = [0u8; 8192];
            while let Ok(n @ 1..) = err.read(&mut buf) {
                kept.extend_from_slice(&buf[..n]);
                if kept.len() > KEPT_LOG_BYTES {
                    let cut = kept.len() - KEPT_LOG_BYTES;
                    kept.drain(..cut);
                    dropped += cut;
                }
            }
            let text = String::from_utf8_lossy(&kept).into_owned();
            match dropped {
                0 => text,
                n => format!("[{n} earlier bytes of the log left out]\n{text}"),
            }
        });
        Drained { child, log: Some(log) }
    }

    /// Its exit status, if it has exited.
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().unwrap()
    }

    /// What it wrote to stderr (the tail), once it has exited.
    pub fn log(&mut self) -> String {
        self.log
            .take()
            .map_or_else(String::new, |t| t.join().unwrap_or_default())
    }

    /// Waits for it to exit.
    pub fn wait(&mut self) -> std::process::ExitStatus {
        self.child.wait().unwrap()
    }

    /// Kills it (SIGKILL), waits for it and returns its log.
    pub fn kill(&mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.log()
    }
}

/// Produces `lines` (`key,value`) to `topic`, each to partition
/// `sum of the key's bytes mod partitions`, so that each key's values are
/// in one partition, in order.
pub fn produce_lines(b: &Broker, topic: &str, partitions: u32, lines: &[String]) {
    b.produce(
        topic,
        lines.iter().map(|l| {
            let key = l.split(',').next().unwrap();
            let p = key.bytes().map(u32::from).sum::<u32>() % partitions;
            (p as i32, "", l.clone(), None)
        }),
    );
}

/// The `key,count,sum` records a `read_committed` reader sees in `output`
/// (of `partitions` partitions) on `b`, each record's key checked against
/// its value's.
pub fn kafka_rows(b: &Broker, output: &str, partitions: i32) -> Vec<(String, u64, i64)> {
    super::kafka::read_committed_from(b, output, partitions)
        .into_iter()
        .map(|(k, v)| {
            let mut p = v.split(',');
            let (key, c, s) = (p.next().unwrap(), p.next().unwrap(), p.next().unwrap());
            assert_eq!(k, key, "the record's key is its count's key");
            (key.to_string(), c.parse().unwrap(), s.parse().unwrap())
        })
        .collect()
}

/// Checks a keyed count's output `rows` (key, count, sum) against each
/// key's input `values`. Exactly once: every key's counts `1..=n` once
/// each, each sum adding one of the key's values, the last sum their
/// total. Otherwise (at least once): no count missing. No other keys.
pub fn check(values: &HashMap<String, Vec<i64>>, rows: &[(String, u64, i64)], exactly_once: bool) {
    let mut by_key: HashMap<&str, Vec<(u64, i64)>> = HashMap::new();
    for (k, c, s) in rows {
        by_key.entry(k.as_str()).or_default().push((*c, *s));
    }
    for (k, vals) in values {
        let mut got = by_key.remove(k.as_str()).unwrap_or_default();
        got.sort();
        let n = vals.len() as u64;
        if exactly_once {
            let counts: Vec<u64> = got.iter().map(|r| r.0).collect();
            assert_eq!(
                counts,
                (1..=n).collect::<Vec<_>>(),
                "key {k}: counts 1..={n} exactly once"
            );
            // Each step adds one of the key's values; the last is the total.
            let mut pool = vals.clone();
            let mut prev = 0i64;
            for &(c, s) in &got {
                let step = s - prev;
                let i = pool
                    .iter()
                    .position(|v| *v == step)
                    .unwrap_or_else(|| panic!("key {k} count {c}: sum {s} adds {step}, not an input value"));
                pool.swap_remove(i);
                prev = s;
            }
            assert_eq!(prev, vals.iter().sum::<i64>(), "key {k}: final sum");
        } else {
            let have: std::collections::HashSet<u64> = got.iter().map(|r| r.0).collect();
            for c in 1..=n {
                assert!(have.contains(&c), "key {k}: count {c} missing");
            }
        }
    }
    assert!(
        by_key.is_empty(),
        "output for keys not in the input: {:?}",
        by_key.keys()
    );
}
