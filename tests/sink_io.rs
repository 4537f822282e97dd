//! Where sink I/O runs, and what a slow sink thread does to a job.
//!
//! - Every sink of weir-io writes, syncs and commits on a thread of its
//!   own: a job runs with [`fault::forbid_on_workers`] on, which fails any
//!   durable step (each passes a named fault point) taken on a worker
//!   thread, and its output is exactly what the input says.
//! - A sink whose thread lags (its writes slowed by [`Action::Sleep`] at
//!   its write fault point) backpressures the job like a full ring: the
//!   bytes it holds stay bounded, and nothing is lost.
//!
//! Fault points are process-wide: every test here holds [`serial`].

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use weir_core::fault::{self, Action};
use weir_core::{
    BoxError, CheckpointConfig, CheckpointMode, Outcome, Pipeline, PreCommit, RuntimeConfig, Sink, SinkContext,
};
use weir_io::{direct, DirectFileSink, GenContext, Generator, GeneratorConfig};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    let g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    fault::disarm_all();
    fault::forbid_on_workers(false);
    g
}

/// A record: key, running count of the key, emission stamp.
type Rec = (u64, u64, u64);

fn line(r: &Rec, out: &mut Vec<u8>) {
    use std::io::Write;
    let _ = writeln!(out, "{},{}", r.0, r.1);
}

/// A line padded to about 110 bytes: the backpressure test needs volume.
fn wide_line(r: &Rec, out: &mut Vec<u8>) {
    use std::io::Write;
    let _ = writeln!(out, "{},{},{:0>100}", r.0, r.1, r.2);
}

fn stamp(r: &Rec) -> u64 {
    r.2
}

/// `(key, count)` of every line of the non-hidden files of `dir`.
fn lines(dir: &Path) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || !e.file_type().unwrap().is_file() {
            continue;
        }
        let text = std::fs::read_to_string(e.path()).unwrap();
        assert!(text.is_empty() || text.ends_with('\n'), "{name} ends in a partial line");
        for l in text.lines() {
            let mut fields = l.split(',');
            let (k, c) = (fields.next().unwrap(), fields.next().unwrap_or(""));
            let k = k.parse().unwrap_or_else(|_| panic!("{name}: bad line {l:?}"));
            out.push((k, c.parse().unwrap_or_else(|_| panic!("{name}: bad line {l:?}"))));
        }
    }
    out
}

/// Checks that `got` holds, for every key with `n` records, the counts
/// `1..=n` exactly once.
fn assert_exactly_once(got: &[(u64, u64)], expected: &HashMap<u64, u64>) {
    let mut per_key: HashMap<u64, Vec<u64>> = HashMap::new();
    for &(k, c) in got {
        per_key.entry(k).or_default().push(c);
    }
    assert_eq!(per_key.len(), expected.len(), "keys in the output");
    for (k, n) in expected {
        let mut counts = per_key.remove(k).unwrap_or_default();
        counts.sort_unstable();
        assert_eq!(counts, (1..=*n).collect::<Vec<_>>(), "key {k}");
    }
}

const KEYS: u64 = 50;

fn key_of(c: &GenContext) -> u64 {
    ((u128::from(c.random) * u128::from(KEYS)) >> 64) as u64
}

/// How many records each key gets from the generator settings.
fn expected(gen: GeneratorConfig, parallelism: usize) -> HashMap<u64, u64> {
    let mut n = HashMap::new();
    for i in 0..parallelism {
        let mut g = Generator::new(gen, i, parallelism, |c: GenContext| key_of(&c)).unwrap();
        let mut h = weir_core::harness::Harness::new(i, parallelism);
        let mut out = Vec::new();
        while h.poll_source(&mut g, &mut out, 4096).unwrap() != weir_core::SourcePoll::Done {}
        for k in out {
            *n.entry(k).or_insert(0) += 1;
        }
    }
    n
}

/// generator -> key_by -> running count -> `sink`, with aligned
/// checkpoints every 20 ms into `dir/checkpoints`.
fn run_keyed<S, F>(gen: GeneratorConfig, dir: &Path, make_sink: F)
where
    S: Sink<Rec>,
    F: Fn(usize) -> S + Send + Sync + 'static,
{
    let p = Pipeline::new("sink-io");
    p.source("gen", 2, move |i, n| {
        Generator::new(gen, i, n, |c: GenContext| (key_of(&c), 0u64, c.emitted_ns)).unwrap()
    })
    .key_by(|r: &Rec| r.0)
    .parallelism(2)
    .process_heap(|_k: &u64, count: &mut u64, r: Rec, out: &mut weir_core::Output<Rec>| {
        *count += 1;
        out.emit((r.0, *count, r.2));
    })
    .sink("out", make_sink);
    let config = RuntimeConfig {
        workers: 2,
        checkpointing: Some(CheckpointConfig {
            interval: Duration::from_millis(20),
            ..CheckpointConfig::new(CheckpointMode::Aligned, dir.join("checkpoints"))
        }),
        ..RuntimeConfig::default()
    };
    let result = p.run(config).unwrap().join().unwrap();
    assert_eq!(result.outcome, Outcome::Finished);
    assert!(
        result.metrics.checkpoints.completed >= 3,
        "checkpoints happened during the run: {}",
        result.metrics.checkpoints.completed
    );
}

#[test]
fn direct_sink_does_no_io_on_a_worker() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let gen = GeneratorConfig {
        seed: 7,
        events: Some(30_000),
        rate: Some(100_000.0),
        start_ns: None,
    };
    let out = dir.path().join("out");
    let o = out.clone();
    fault::forbid_on_workers(true);
    run_keyed(gen, dir.path(), move |i| DirectFileSink::new(o.clone(), i, line, stamp));
    fault::forbid_on_workers(false);
    assert_exactly_once(&lines(&out), &expected(gen, 2));
}

/// The forbidding works: a durable step on a worker fails the job.
#[test]
fn io_on_a_worker_fails_the_job_when_forbidden() {
    let _g = serial();
    /// Passes a fault point in `write`, on the worker.
    struct OnWorker;
    impl Sink<Rec> for OnWorker {
        fn write(&mut self, batch: &mut Vec<Rec>, _: &mut SinkContext<'_>) -> Result<(), BoxError> {
            fault::hit("test.write-on-worker")?;
            batch.clear();
            Ok(())
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let gen = GeneratorConfig {
        seed: 1,
        events: Some(1_000),
        rate: None,
        start_ns: None,
    };
    fault::forbid_on_workers(true);
    let p = Pipeline::new("forbidden");
    p.source("gen", 1, move |i, n| {
        Generator::new(gen, i, n, |c: GenContext| (key_of(&c), 0u64, 0u64)).unwrap()
    })
    .sink("on-worker", |_| OnWorker);
    let cfg = RuntimeConfig {
        workers: 1,
        ..RuntimeConfig::default()
    };
    let err = p.run(cfg).unwrap().join().unwrap_err().to_string();
    fault::forbid_on_workers(false);
    assert!(err.contains("test.write-on-worker") && err.contains("worker"), "{err}");
    drop(dir);
}

/// A sink with its bytes in flight measured after every call.
trait Buffered {
    fn buffered(&self) -> usize;
}

impl<T, F, E> Buffered for DirectFileSink<T, F, E>
where
    F: Fn(&T, &mut Vec<u8>),
    E: Fn(&T) -> u64,
{
    fn buffered(&self) -> usize {
        self.buffered_bytes()
    }
}

/// Wraps a sink; keeps the most bytes it ever held in `peak`.
struct Watch<S> {
    inner: S,
    peak: Arc<AtomicU64>,
}

impl<S: Buffered> Watch<S> {
    fn note(&self) {
        self.peak.fetch_max(self.inner.buffered() as u64, Ordering::Relaxed);
    }
}

impl<S: Sink<Rec> + Buffered> Sink<Rec> for Watch<S> {
    fn write(&mut self, batch: &mut Vec<Rec>, ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
        let r = self.inner.write(batch, ctx);
        self.note();
        r
    }
    fn open(&mut self, ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
        self.inner.open(ctx)
    }
    fn ready(&mut self, ctx: &mut SinkContext<'_>) -> Result<bool, BoxError> {
        let r = self.inner.ready(ctx);
        self.note();
        r
    }
    fn finish(&mut self, ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
        self.inner.finish(ctx)
    }
    fn pre_commit(&mut self, checkpoint: u64) -> Result<Vec<u8>, BoxError> {
        self.inner.pre_commit(checkpoint)
    }
    fn pre_commit_detached(&mut self, checkpoint: u64) -> Result<PreCommit, BoxError> {
        let r = self.inner.pre_commit_detached(checkpoint);
        self.note();
        r
    }
    fn commit(&mut self, checkpoint: u64) -> Result<(), BoxError> {
        self.inner.commit(checkpoint)
    }
    fn abort(&mut self, checkpoint: u64) -> Result<(), BoxError> {
        self.inner.abort(checkpoint)
    }
    fn restore(&mut self, checkpoint: u64, state: &[u8]) -> Result<(), BoxError> {
        self.inner.restore(checkpoint, state)
    }
}

/// One scheduling turn's output at most (the default batch of 1,024
/// records of ~110 bytes), with room to spare.
const ONE_TURN_BYTES: u64 = 256 << 10;

#[test]
fn a_slow_direct_sink_thread_backpressures_and_loses_nothing() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    // Closed loop: the generator runs as fast as it can; every write of the
    // sink's thread takes 200 ms more, long enough for a worker to fill the
    // sink's bound (4 MiB, at 20 MB/s) even in a debug build on a slow
    // machine (at 50 ms, 80 MB/s were needed, and a slow hour missed it).
    let gen = GeneratorConfig {
        seed: 3,
        events: Some(1_500_000),
        rate: None,
        start_ns: None,
    };
    let out = dir.path().join("out");
    let o = out.clone();
    let peak = Arc::new(AtomicU64::new(0));
    let pk = Arc::clone(&peak);
    fault::arm(direct::FAULT_WRITE, Action::Sleep(200_000));
    run_keyed(gen, dir.path(), move |i| Watch {
        inner: DirectFileSink::new(o.clone(), i, wide_line, stamp),
        peak: Arc::clone(&pk),
    });
    fault::disarm_all();
    assert_exactly_once(&lines(&out), &expected(gen, 2));
    let peak = peak.load(Ordering::Relaxed);
    let bound = direct::MAX_PENDING_BYTES as u64 + ONE_TURN_BYTES;
    assert!(peak <= bound, "the sink held {peak} bytes, more than its bound {bound}");
    assert!(
        peak >= direct::MAX_PENDING_BYTES as u64,
        "the thread never lagged enough to backpressure (peak {peak} bytes): the test proves nothing"
    );
}
