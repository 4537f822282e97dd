//! Event time end to end: watermarks over several uneven inputs, windows
//! of every kind, timers, late data, and two-input joins, each compared
//! with a direct computation, in every checkpoint mode, with injected
//! failures and recovery.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use weir_core::join::Either;
use weir_core::process::{KeyedProcessFunction, TimerContext};
use weir_core::time::WatermarkStrategy;
use weir_core::timers::TimeDomain;
use weir_core::window::{AggregateFunction, Windowed, Windows};
use weir_core::{
    BoxError, CheckpointConfig, CheckpointMode, CollectSink, Pipeline, RestartStrategy, RuntimeConfig, Sink,
    SinkContext, Stream,
};
use weir_io::{GenContext, Generator, GeneratorConfig};

use common::{Target, TxSink};

/// (key, event time ms, value)
type Ev = (u64, i64, u64);

/// Event `seq` of source `seed`: time advances 1 ms per 2 events with up
/// to 40 ms of disorder.
fn event(seq: u64, random: u64, keys: u64) -> Ev {
    let jitter = (random >> 20) % 40;
    (random % keys, (seq / 2) as i64 + 1_000 - jitter as i64, seq)
}

fn events(seed: u64, n: u64, keys: u64) -> Vec<Ev> {
    (0..n)
        .map(|seq| {
            let random = weir_io::generator::splitmix64(seq ^ weir_io::generator::splitmix64(seed));
            event(seq, random, keys)
        })
        .collect()
}

/// Panics in a map after pseudo-random numbers of records, `failures` times.
#[derive(Clone)]
struct Chaos {
    seen: Arc<AtomicU64>,
    next: Arc<AtomicU64>,
    left: Arc<AtomicU32>,
}

impl Chaos {
    fn new(failures: u32) -> Self {
        Chaos {
            seen: Arc::new(AtomicU64::new(0)),
            next: Arc::new(AtomicU64::new(3_000)),
            left: Arc::new(AtomicU32::new(failures)),
        }
    }
    fn tick(&self) {
        let n = self.seen.fetch_add(1, Ordering::Relaxed) + 1;
        if n == self.next.load(Ordering::Relaxed) && self.left.load(Ordering::Relaxed) > 0 {
            let left = self.left.fetch_sub(1, Ordering::Relaxed);
            // Close enough to the first (at 3,000) that every failure
            // fires in the smallest job (6,000 records), however little a
            // restore replays.
            self.next.store(n + 500 + u64::from(left) * 337, Ordering::Relaxed);
            panic!("injected failure after {n} records");
        }
    }
}

struct Setup {
    mode: Option<CheckpointMode>,
    failures: u32,
}

fn config(s: &Setup, dir: &std::path::Path) -> RuntimeConfig {
    RuntimeConfig {
        workers: 2,
        ring_capacity: 256,
        checkpointing: s.mode.map(|mode| CheckpointConfig {
            interval: Duration::from_millis(5),
            timeout: Duration::from_secs(20),
            ..CheckpointConfig::new(mode, dir)
        }),
        restart: RestartStrategy::FixedDelay {
            attempts: 20,
            delay: Duration::from_millis(1),
        },
        ..RuntimeConfig::default()
    }
}

/// A fast and a slow source of events with watermarks, united.
fn sources(p: &Pipeline, n: u64, keys: u64, chaos: &Chaos) -> Stream<Ev> {
    let gen = |seed, events, rate| GeneratorConfig {
        seed,
        events: Some(events),
        rate: Some(rate),
        start_ns: None,
    };
    let fast = gen(1, n, 400_000.0);
    let slow = gen(2, n / 4, 60_000.0);
    let wm = WatermarkStrategy::bounded(40, |e: &Ev| e.1);
    let a = p
        .source("fast", 2, move |i, q| {
            Generator::new(fast, i, q, move |c: GenContext| event(c.seq, c.random, keys)).unwrap()
        })
        .assign_watermarks(wm.clone());
    let b = p
        .source("slow", 1, move |i, q| {
            Generator::new(slow, i, q, move |c: GenContext| event(c.seq, c.random, keys)).unwrap()
        })
        .assign_watermarks(wm);
    let ch = chaos.clone();
    a.union(vec![b]).map(move |e: Ev| {
        ch.tick();
        e
    })
}

fn all_events(n: u64, keys: u64) -> Vec<Ev> {
    let mut v = events(1, n, keys);
    v.extend(events(2, n / 4, keys));
    v
}

#[derive(Clone)]
struct CountSum;

impl AggregateFunction<Ev> for CountSum {
    type Acc = (u64, u64);
    type Output = (u64, u64);
    fn add(&self, acc: &mut (u64, u64), e: &Ev) {
        acc.0 += 1;
        acc.1 += e.2;
    }
    fn result(&self, acc: &(u64, u64)) -> (u64, u64) {
        *acc
    }
    fn merge(&self, acc: &mut (u64, u64), o: (u64, u64)) {
        acc.0 += o.0;
        acc.1 += o.1;
    }
}

/// (key, window start, window end, count, sum)
type WinRow = (u64, i64, i64, u64, u64);

fn run_windows(s: &Setup, windows: Windows, n: u64, keys: u64) -> (Vec<WinRow>, usize) {
    let dir = tempfile::tempdir().unwrap();
    let chaos = Chaos::new(s.failures);
    let p = Pipeline::new("windows");
    let target = Arc::new(Mutex::new(Target::default()));
    let t = target.clone();
    let ckpt = s.mode.is_some();
    sources(&p, n, keys, &chaos)
        .key_by(|e: &Ev| e.0)
        .parallelism(2)
        .window(windows, |e: &Ev| e.1)
        .aggregate(CountSum, |k: &u64, w, (c, sum)| (*k, w.start, w.end, c, sum))
        // The bound is the disorder: nothing is late.
        .flat_map(|w: Windowed<WinRow, Ev>| match w {
            Windowed::Result(r) => Some(r),
            Windowed::Late(e) => panic!("late record {e:?} within the out-of-orderness bound"),
        })
        .sink("tx", move |i| TxSink::new(i, t.clone(), ckpt));
    let result = p.run(config(s, dir.path())).unwrap().join().unwrap();
    let mut rows = std::mem::take(&mut target.lock().unwrap().rows);
    rows.sort();
    (rows, result.metrics.checkpoints.restarts.len())
}

fn expected_windows(windows: Windows, evs: &[Ev]) -> Vec<WinRow> {
    let mut m: BTreeMap<(u64, i64, i64), (u64, u64)> = BTreeMap::new();
    match windows {
        Windows::Session { gap_ms } => {
            let mut by_key: BTreeMap<u64, Vec<&Ev>> = BTreeMap::new();
            for e in evs {
                by_key.entry(e.0).or_default().push(e);
            }
            for (k, mut es) in by_key {
                es.sort_by_key(|e| e.1);
                let mut cur: Option<(i64, i64, u64, u64)> = None;
                for e in es {
                    cur = match cur {
                        Some((s, end, c, sum)) if e.1 <= end => Some((s, end.max(e.1 + gap_ms), c + 1, sum + e.2)),
                        Some((s, end, c, sum)) => {
                            m.insert((k, s, end), (c, sum));
                            Some((e.1, e.1 + gap_ms, 1, e.2))
                        }
                        None => Some((e.1, e.1 + gap_ms, 1, e.2)),
                    };
                }
                if let Some((s, end, c, sum)) = cur {
                    m.insert((k, s, end), (c, sum));
                }
            }
        }
        _ => {
            let mut ws = Vec::new();
            for e in evs {
                ws.clear();
                windows.assign(e.1, &mut ws);
                for w in &ws {
                    let v = m.entry((e.0, w.start, w.end)).or_default();
                    v.0 += 1;
                    v.1 += e.2;
                }
            }
        }
    }
    m.into_iter().map(|((k, s, e), (c, sum))| (k, s, e, c, sum)).collect()
}

fn check_windows(windows: Windows, keys: u64) {
    let n = 20_000;
    let expected = expected_windows(windows, &all_events(n, keys));
    let setups = [
        Setup {
            mode: None,
            failures: 0,
        },
        Setup {
            mode: Some(CheckpointMode::Aligned),
            failures: 3,
        },
        Setup {
            mode: Some(CheckpointMode::Unaligned),
            failures: 3,
        },
    ];
    for s in &setups {
        let (rows, restarts) = run_windows(s, windows, n, keys);
        assert_eq!(restarts, s.failures as usize, "{windows:?} {:?}", s.mode);
        assert!(
            rows == expected,
            "{windows:?} {:?}: {} rows, expected {}",
            s.mode,
            rows.len(),
            expected.len()
        );
    }
}

#[test]
fn tumbling_windows_are_exact_across_failures() {
    check_windows(Windows::tumbling(100), 20);
}

#[test]
fn sliding_windows_are_exact_across_failures() {
    check_windows(Windows::sliding(200, 50), 10);
}

#[test]
fn session_windows_are_exact_across_failures() {
    // Sparse keys: real gaps between sessions.
    check_windows(Windows::session(30), 500);
}

#[test]
fn at_least_once_windows_lose_nothing() {
    let n = 20_000;
    let windows = Windows::tumbling(100);
    let expected = expected_windows(windows, &all_events(n, 20));
    let s = Setup {
        mode: Some(CheckpointMode::AtLeastOnce),
        failures: 2,
    };
    let (rows, _) = run_windows(&s, windows, n, 20);
    // Every window is there; a replayed one may count a record twice.
    let got: BTreeMap<(u64, i64), u64> = rows.iter().map(|r| ((r.0, r.1), r.3)).collect();
    for e in &expected {
        assert!(got.get(&(e.0, e.1)).is_some_and(|&c| c >= e.3), "window {e:?} lost");
    }
}

/// Counts per window of key 1 over the records at 5, 15, 7, 30, 3 ms, one
/// record per batch (a watermark after each, newest - 1), with `lateness`.
fn late_run(windows: Windows, lateness: i64) -> Vec<Windowed<(i64, u64), Ev>> {
    let items = Arc::new(vec![(1u64, 5i64, 1u64), (1, 15, 2), (1, 7, 3), (1, 30, 4), (1, 3, 5)]);
    let out = Arc::new(Mutex::new(Vec::new()));
    let o = out.clone();
    let p = Pipeline::new("late");
    p.source("in", 1, move |i, n| weir_core::VecSource::new(items.clone(), i, n))
        .assign_watermarks(WatermarkStrategy::ascending(|e: &Ev| e.1))
        .key_by(|e: &Ev| e.0)
        .window(windows, |e: &Ev| e.1)
        .allowed_lateness_ms(lateness)
        .aggregate(CountSum, |_: &u64, w, (c, _)| (w.start, c))
        .sink("collect", move |_| CollectSink::new(o.clone()));
    let config = RuntimeConfig {
        batch_size: 1,
        ..RuntimeConfig::default()
    };
    p.run(config).unwrap().join().unwrap();
    let got = out.lock().unwrap().clone();
    got
}

/// Late records come out on the side, and allowed lateness fires again.
#[test]
fn late_records_reach_the_side_output_and_lateness_refires() {
    // One source, in this order: ts 5, 15 (wm 14: window [0,10) fires),
    // 7 (late but within lateness 10: fires again with 2 records),
    // 30 (wm 29: cleanup of [0,10) at 9+10 and fire of [10,20)), 3 (late).
    let got = late_run(Windows::tumbling(10), 10);
    assert_eq!(
        got,
        vec![
            Windowed::Result((0, 1)),
            Windowed::Result((0, 2)),
            Windowed::Result((10, 1)),
            Windowed::Late((1, 3, 5)),
            Windowed::Result((30, 1)),
        ]
    );
}

/// Sliding windows kept in panes: a late record within the allowed
/// lateness fires again every complete window holding it, and a record past
/// it goes to the side output.
#[test]
fn sliding_panes_refire_late_records_and_route_later_ones_aside() {
    // Sliding 10 ms every 5 ms, lateness 5 ms; watermark = newest - 1.
    let got = late_run(Windows::sliding(10, 5), 5);
    assert_eq!(
        got,
        vec![
            // ts 15 (watermark 14) completes [0, 10) and [5, 15).
            Windowed::Result((0, 1)),
            Windowed::Result((5, 1)),
            // ts 7: [0, 10) is past its lateness, [5, 15) is not.
            Windowed::Result((5, 2)),
            // ts 30 (watermark 29) completes [10, 20) and [15, 25).
            Windowed::Result((10, 1)),
            Windowed::Result((15, 1)),
            // ts 3: every window holding it is past its lateness.
            Windowed::Late((1, 3, 5)),
            // End of input.
            Windowed::Result((25, 1)),
            Windowed::Result((30, 1)),
        ]
    );
}

/// A source subtask with nothing to emit is marked idle after the
/// strategy's timeout, so the other input alone moves event time on and
/// windows fire while the idle one is still open.
#[test]
fn an_idle_input_does_not_hold_windows_back() {
    use weir_core::{Source, SourceContext, SourcePoll};

    /// Emits one early record, then nothing until a window result was seen
    /// (or 10 s passed), then ends.
    struct Quiet {
        sent: bool,
        seen: Arc<std::sync::atomic::AtomicBool>,
        started: std::time::Instant,
    }
    impl Source<Ev> for Quiet {
        fn poll(&mut self, out: &mut Vec<Ev>, _: usize, _: &mut SourceContext<'_>) -> Result<SourcePoll, BoxError> {
            if !self.sent {
                self.sent = true;
                out.push((1, 0, 0));
                return Ok(SourcePoll::Ready);
            }
            if self.seen.load(Ordering::Relaxed) || self.started.elapsed() > Duration::from_secs(10) {
                return Ok(SourcePoll::Done);
            }
            Ok(SourcePoll::Idle)
        }
    }

    /// Records the first result, and whether the quiet source was still open then.
    struct Watch {
        seen: Arc<std::sync::atomic::AtomicBool>,
        first_after: Arc<Mutex<Option<Duration>>>,
        started: std::time::Instant,
    }
    impl Sink<WinRow> for Watch {
        fn write(&mut self, batch: &mut Vec<WinRow>, _: &mut SinkContext<'_>) -> Result<(), BoxError> {
            if !batch.is_empty() && !self.seen.swap(true, Ordering::Relaxed) {
                *self.first_after.lock().unwrap() = Some(self.started.elapsed());
            }
            batch.clear();
            Ok(())
        }
    }

    let seen = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let first_after = Arc::new(Mutex::new(None));
    let started = std::time::Instant::now();
    let p = Pipeline::new("idle");
    let wm = WatermarkStrategy::bounded(0, |e: &Ev| e.1).idle_after_ms(50);
    let s2 = seen.clone();
    let quiet = p
        .source("quiet", 1, move |_, _| Quiet {
            sent: false,
            seen: s2.clone(),
            started,
        })
        .assign_watermarks(wm.clone());
    // A busy source: 200 ms of event time per 1000 records, slowly.
    let gen = GeneratorConfig {
        seed: 4,
        events: Some(20_000),
        rate: Some(20_000.0),
        start_ns: None,
    };
    let busy = p
        .source("busy", 1, move |i, q| {
            Generator::new(gen, i, q, |c: GenContext| (c.seq % 3, (c.seq / 5) as i64, c.seq)).unwrap()
        })
        .assign_watermarks(wm);
    let (s3, f2) = (seen.clone(), first_after.clone());
    busy.union(vec![quiet])
        .key_by(|e: &Ev| e.0)
        .window(Windows::tumbling(100), |e: &Ev| e.1)
        .aggregate(CountSum, |k: &u64, w, (c, sum)| (*k, w.start, w.end, c, sum))
        .flat_map(Windowed::result)
        .sink("watch", move |_| Watch {
            seen: s3.clone(),
            first_after: f2.clone(),
            started,
        });
    p.run(RuntimeConfig {
        workers: 2,
        ..RuntimeConfig::default()
    })
    .unwrap()
    .join()
    .unwrap();
    let first = first_after.lock().unwrap().expect("windows fired");
    // Without idleness the quiet input would hold event time at its
    // first record until it ended (10 s).
    assert!(first < Duration::from_secs(5), "first window result after {first:?}");
}

/// Per key, a running sum emitted by an event-time timer 50 ms after each
/// key's first record: timers survive recovery and fire exactly once.
#[derive(Clone)]
struct Delayed;

impl KeyedProcessFunction<u64, Ev, (u64, i64, u64, u64)> for Delayed {
    type State = (i64, u64, u64); // (timer, count, sum)
    type Buffered = ();
    fn process(&mut self, e: Ev, st: &mut Self::State, ctx: &mut TimerContext<'_, u64, (u64, i64, u64, u64)>) {
        if st.1 == 0 {
            st.0 = e.1 - e.1.rem_euclid(50) + 49;
            ctx.register_event_timer(st.0);
        }
        st.1 += 1;
        st.2 += e.2;
    }
    fn on_timer(
        &mut self,
        time: i64,
        domain: TimeDomain,
        st: &mut Self::State,
        ctx: &mut TimerContext<'_, u64, (u64, i64, u64, u64)>,
    ) {
        assert_eq!(domain, TimeDomain::EventTime);
        assert_eq!(time, st.0);
        assert!(ctx.watermark() >= time, "fired before the watermark passed it");
        ctx.emit((*ctx.key(), time, st.1, st.2));
        ctx.clear_state();
    }
}

#[test]
fn event_time_timers_fire_once_across_failures() {
    let n = 20_000;
    let keys = 30;
    // Direct: per key, buckets of 50 ms starting at a key's first record
    // after the previous bucket closed; with disorder the engine sees
    // records in another order, so compare totals per key and the
    // invariant that every record is counted exactly once.
    let evs = all_events(n, keys);
    let mut totals: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for e in &evs {
        let t = totals.entry(e.0).or_default();
        t.0 += 1;
        t.1 += e.2;
    }
    for mode in [None, Some(CheckpointMode::Aligned), Some(CheckpointMode::Unaligned)] {
        let s = Setup {
            mode,
            failures: if mode.is_some() { 3 } else { 0 },
        };
        let dir = tempfile::tempdir().unwrap();
        let chaos = Chaos::new(s.failures);
        let p = Pipeline::new("timers");
        let target = Arc::new(Mutex::new(Target::default()));
        let t = target.clone();
        sources(&p, n, keys, &chaos)
            .key_by(|e: &Ev| e.0)
            .parallelism(2)
            .process_function(Delayed)
            .sink("tx", move |i| TxSink::new(i, t.clone(), mode.is_some()));
        let result = p.run(config(&s, dir.path())).unwrap().join().unwrap();
        assert_eq!(result.metrics.checkpoints.restarts.len(), s.failures as usize);
        let rows = std::mem::take(&mut target.lock().unwrap().rows);
        let mut got: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
        for (k, _, c, sum) in rows {
            let g = got.entry(k).or_default();
            g.0 += c;
            g.1 += sum;
        }
        assert_eq!(got, totals, "{mode:?}");
    }
}

/// A processing-time timer registered before a failure, due while the job
/// is restarting, fires after recovery.
#[test]
fn processing_time_timer_due_during_downtime_fires_after_recovery() {
    #[derive(Clone)]
    struct Remind(Arc<AtomicU32>);
    impl KeyedProcessFunction<u64, u64, (u64, i64)> for Remind {
        type State = u8;
        type Buffered = ();
        fn process(&mut self, v: u64, st: &mut u8, ctx: &mut TimerContext<'_, u64, (u64, i64)>) {
            if v == 500 {
                // Due 150 ms from now: after the failure below (100 ms
                // later, after several checkpoints hold the timer) and
                // before the restart (60 ms delay) completes.
                *st = 1;
                ctx.register_processing_timer(ctx.processing_time() + 150);
            }
            if v == 1_000 && self.0.fetch_add(1, Ordering::Relaxed) == 0 {
                panic!("injected failure with a timer pending");
            }
        }
        fn on_timer(&mut self, time: i64, d: TimeDomain, st: &mut u8, ctx: &mut TimerContext<'_, u64, (u64, i64)>) {
            assert_eq!(d, TimeDomain::ProcessingTime);
            assert_eq!(*st, 1, "the state set with the timer was restored");
            assert!(ctx.processing_time() >= time);
            ctx.emit((*ctx.key(), time));
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let p = Pipeline::new("ptimer");
    let out = Arc::new(Mutex::new(Target::default()));
    let o = out.clone();
    let gen = GeneratorConfig {
        seed: 3,
        events: Some(1_500),
        rate: Some(5_000.0),
        start_ns: None,
    };
    p.source("in", 1, move |i, q| {
        Generator::new(gen, i, q, |c: GenContext| c.seq).unwrap()
    })
    .key_by(|_: &u64| 7u64)
    .process_function(Remind(Arc::new(AtomicU32::new(0))))
    .sink("tx", move |i| TxSink::new(i, o.clone(), true));
    let mut cfg = config(
        &Setup {
            mode: Some(CheckpointMode::Aligned),
            failures: 1,
        },
        dir.path(),
    );
    cfg.restart = RestartStrategy::FixedDelay {
        attempts: 3,
        delay: Duration::from_millis(60),
    };
    let result = p.run(cfg).unwrap().join().unwrap();
    assert_eq!(result.metrics.checkpoints.restarts.len(), 1);
    let rows = out.lock().unwrap().rows.clone();
    assert_eq!(rows.len(), 1, "the timer fired exactly once: {rows:?}");
}

/// (side, key, time, id)
type Rec = (u64, i64, u64);

fn join_inputs(n: u64, keys: u64) -> (Vec<Rec>, Vec<Rec>) {
    let l = events(11, n, keys).into_iter().map(|e| (e.0, e.1, e.2)).collect();
    let r = events(12, n / 3, keys).into_iter().map(|e| (e.0, e.1, e.2)).collect();
    (l, r)
}

/// Runs `build` over a fast left and a slow right input in `mode` with
/// failures; returns the committed output sorted.
fn run_join<O>(
    mode: Option<CheckpointMode>,
    n: u64,
    keys: u64,
    build: impl FnOnce(Stream<Rec>, Stream<Rec>) -> Stream<O>,
) -> Vec<O>
where
    O: Clone + Ord + Serialize + DeserializeOwned + Send + 'static,
{
    let dir = tempfile::tempdir().unwrap();
    let failures = if mode.is_some() { 2 } else { 0 };
    let chaos = Chaos::new(failures);
    let p = Pipeline::new("join");
    let gen = |seed, events, rate| GeneratorConfig {
        seed,
        events: Some(events),
        rate: Some(rate),
        start_ns: None,
    };
    let (lc, rc) = (gen(11, n, 300_000.0), gen(12, n / 3, 40_000.0));
    let wm = WatermarkStrategy::bounded(40, |e: &Rec| e.1);
    let ch = chaos.clone();
    let left = p
        .source("left", 2, move |i, q| {
            Generator::new(lc, i, q, move |c: GenContext| event(c.seq, c.random, keys)).unwrap()
        })
        .assign_watermarks(wm.clone())
        .map(move |e: Rec| {
            ch.tick();
            e
        });
    let right = p
        .source("right", 1, move |i, q| {
            Generator::new(rc, i, q, move |c: GenContext| event(c.seq, c.random, keys)).unwrap()
        })
        .assign_watermarks(wm);
    let target = Arc::new(Mutex::new(Target::default()));
    let t = target.clone();
    build(left, right).sink("tx", move |i| TxSink::new(i, t.clone(), mode.is_some()));
    let result = p
        .run(config(&Setup { mode, failures }, dir.path()))
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(result.metrics.checkpoints.restarts.len(), failures as usize);
    let mut rows = std::mem::take(&mut target.lock().unwrap().rows);
    rows.sort();
    rows
}

const MODES: [Option<CheckpointMode>; 4] = [
    None,
    Some(CheckpointMode::Aligned),
    Some(CheckpointMode::Unaligned),
    Some(CheckpointMode::AtLeastOnce),
];

fn check_join<O: Clone + Ord + std::fmt::Debug + Serialize + DeserializeOwned + Send + 'static>(
    expected: Vec<O>,
    n: u64,
    keys: u64,
    build: impl Fn(Stream<Rec>, Stream<Rec>) -> Stream<O>,
) {
    for mode in MODES {
        let got = run_join(mode, n, keys, &build);
        if mode == Some(CheckpointMode::AtLeastOnce) {
            let got: std::collections::BTreeSet<O> = got.into_iter().collect();
            let exp: std::collections::BTreeSet<O> = expected.iter().cloned().collect();
            assert_eq!(got, exp, "at-least-once: nothing lost");
        } else {
            assert!(
                got == expected,
                "{mode:?}: {} rows, expected {}",
                got.len(),
                expected.len()
            );
        }
    }
}

#[test]
fn inner_join_in_every_mode() {
    let (n, keys) = (6_000, 400);
    let (l, r) = join_inputs(n, keys);
    let mut expected = Vec::new();
    for a in &l {
        for b in r.iter().filter(|b| b.0 == a.0) {
            expected.push((a.2, b.2));
        }
    }
    expected.sort();
    check_join(expected, n, keys, |left, right| {
        left.connect(right)
            .key_by(|a: &Rec| a.0, |b: &Rec| b.0)
            .parallelism(2)
            .inner_join(|a: &Rec, b: &Rec| (a.2, b.2))
    });
}

#[test]
fn interval_join_in_every_mode() {
    let (n, keys) = (20_000, 50);
    let (l, r) = join_inputs(n, keys);
    let (lower, upper) = (-20, 30);
    let mut expected = Vec::new();
    for a in &l {
        for b in r
            .iter()
            .filter(|b| b.0 == a.0 && a.1 + lower <= b.1 && b.1 <= a.1 + upper)
        {
            expected.push((a.2, b.2));
        }
    }
    expected.sort();
    assert!(expected.len() > 1_000, "a meaningful join: {}", expected.len());
    check_join(expected, n, keys, |left, right| {
        left.connect(right)
            .key_by(|a: &Rec| a.0, |b: &Rec| b.0)
            .parallelism(2)
            .interval_join(
                lower,
                upper,
                |a: &Rec| a.1,
                |b: &Rec| b.1,
                |a: &Rec, b: &Rec| (a.2, b.2),
            )
    });
}

#[test]
fn window_join_in_every_mode() {
    let (n, keys) = (20_000, 50);
    let (l, r) = join_inputs(n, keys);
    let size = 100;
    let mut expected = Vec::new();
    for a in &l {
        for b in r
            .iter()
            .filter(|b| b.0 == a.0 && a.1.div_euclid(size) == b.1.div_euclid(size))
        {
            expected.push((a.1 - a.1.rem_euclid(size), a.2, b.2));
        }
    }
    expected.sort();
    check_join(expected, n, keys, |left, right| {
        left.connect(right)
            .key_by(|a: &Rec| a.0, |b: &Rec| b.0)
            .parallelism(2)
            .window_join(
                Windows::tumbling(size),
                |a: &Rec| a.1,
                |b: &Rec| b.1,
                |w, a: &Rec, b: &Rec| (w.start, a.2, b.2),
            )
            .flat_map(|w: Windowed<(i64, u64, u64), Either<Rec, Rec>>| match w {
                Windowed::Result(r) => Some(r),
                Windowed::Late(e) => panic!("late {e:?}"),
            })
    });
}

/// A co-process function over two inputs: per key, the left count at the
/// moment each right record arrives is order-dependent, so compare the
/// final per-key totals, emitted on the end-of-input watermark.
#[derive(Clone)]
struct Totals;

impl KeyedProcessFunction<u64, Either<Rec, Rec>, (u64, u64, u64)> for Totals {
    type State = (u64, u64);
    type Buffered = ();
    fn process(&mut self, r: Either<Rec, Rec>, st: &mut (u64, u64), ctx: &mut TimerContext<'_, u64, (u64, u64, u64)>) {
        match r {
            Either::Left(_) => st.0 += 1,
            Either::Right(_) => st.1 += 1,
        }
        ctx.register_event_timer(i64::MAX);
    }
    fn on_timer(
        &mut self,
        _: i64,
        _: TimeDomain,
        st: &mut (u64, u64),
        ctx: &mut TimerContext<'_, u64, (u64, u64, u64)>,
    ) {
        ctx.emit((*ctx.key(), st.0, st.1));
    }
}

#[test]
fn co_process_in_every_mode() {
    let (n, keys) = (20_000, 50);
    let (l, r) = join_inputs(n, keys);
    let mut m: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for a in &l {
        m.entry(a.0).or_default().0 += 1;
    }
    for b in &r {
        m.entry(b.0).or_default().1 += 1;
    }
    let expected: Vec<(u64, u64, u64)> = m.into_iter().map(|(k, (a, b))| (k, a, b)).collect();
    for mode in MODES.into_iter().take(3) {
        let got = run_join(mode, n, keys, |left, right| {
            left.connect(right)
                .key_by(|a: &Rec| a.0, |b: &Rec| b.0)
                .parallelism(2)
                .process_function(Totals)
        });
        assert_eq!(got, expected, "{mode:?}");
    }
}

/// A source that states its own event time (`SourceContext::emit_watermark`):
/// subtask 0 emits events 0..50 of key 1 at 10 ms apart, a watermark behind
/// each batch, then nothing, without ever finishing; subtask 1 has nothing
/// and says so once (`SourceContext::mark_idle`). Windows must fire from
/// these watermarks alone while the job runs.
struct OwnTime {
    subtask: usize,
    next: i64,
}

impl weir_core::Source<Ev> for OwnTime {
    fn poll(
        &mut self,
        out: &mut Vec<Ev>,
        max: usize,
        ctx: &mut weir_core::SourceContext<'_>,
    ) -> Result<weir_core::SourcePoll, BoxError> {
        if self.subtask == 1 {
            if self.next == 0 {
                self.next = 1;
                ctx.mark_idle();
            }
            return Ok(weir_core::SourcePoll::Idle);
        }
        let end = (self.next + max as i64).min(50);
        for i in self.next..end {
            out.push((1, i * 10, i as u64));
        }
        if end > self.next {
            ctx.emit_watermark((end - 1) * 10);
        }
        self.next = end;
        Ok(if out.is_empty() {
            weir_core::SourcePoll::Idle
        } else {
            weir_core::SourcePoll::Ready
        })
    }
}

#[test]
fn a_source_emits_its_own_watermarks_and_idleness() {
    let out = Arc::new(Mutex::new(Vec::new()));
    let o = out.clone();
    let p = Pipeline::new("own-time");
    p.source("own", 2, |i, _| OwnTime { subtask: i, next: 0 })
        .key_by(|e: &Ev| e.0)
        .parallelism(2)
        .window(Windows::tumbling(100), |e: &Ev| e.1)
        .aggregate(CountSum, |_: &u64, w, (c, _)| (w.start, c))
        .sink("collect", move |_| CollectSink::new(o.clone()));
    let job = p.run(RuntimeConfig::default()).unwrap();
    // Events up to 490 ms: windows [0, 100) .. [300, 400) are complete
    // (watermark 490); [400, 500) is not.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while out.lock().unwrap().len() < 4 {
        assert!(
            std::time::Instant::now() < deadline,
            "no window fired: {:?}",
            out.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(50));
    job.cancel();
    job.join().unwrap();
    let got: Vec<(i64, u64)> = out
        .lock()
        .unwrap()
        .iter()
        .map(|w: &Windowed<(i64, u64), Ev>| match w {
            Windowed::Result(r) => *r,
            Windowed::Late(e) => panic!("late {e:?}"),
        })
        .collect();
    assert_eq!(got, vec![(0, 10), (100, 10), (200, 10), (300, 10)]);
}

/// Records per source batch (`RuntimeConfig::batch_size`) and window size
/// of the late-records job below.
const LATE_BATCH: i64 = 8;

/// The input of [`late_records_run`]: batches of `LATE_BATCH` records with
/// timestamps `i` (record `i`), keys `i % 3`, except that in every batch
/// `k >= 2` record 3 is late: its timestamp is in window `k - 2`, which the
/// watermark in front of the batch (`8k - 2`, after batch `k - 1`) has
/// fired, and the watermark before that (`8k - 10`) had not.
fn late_items(batches: i64) -> Vec<Ev> {
    (0..batches * LATE_BATCH)
        .map(|i| {
            let (k, slot) = (i / LATE_BATCH, i % LATE_BATCH);
            let ts = if k >= 2 && slot == 3 {
                (k - 2) * LATE_BATCH + (k % 5)
            } else {
                i
            };
            ((i % 3) as u64, ts, i as u64)
        })
        .collect()
}

/// (0, key, window start, count, sum) for a result; (1, key, ts, value, 0)
/// for a late record.
type LateRow = (u8, u64, i64, u64, u64);

/// What `late_items` gives in a run without failures, computed directly:
/// one source, so each window task sees the batches in order, with the
/// ascending watermark (newest - 1) after each.
fn expected_late_rows(items: &[Ev]) -> Vec<LateRow> {
    let mut windows: BTreeMap<(u64, i64), (u64, u64)> = BTreeMap::new();
    let mut rows = Vec::new();
    let mut wm = i64::MIN;
    for batch in items.chunks(LATE_BATCH as usize) {
        for e in batch {
            let start = e.1 - e.1.rem_euclid(LATE_BATCH);
            if start + LATE_BATCH - 1 <= wm {
                rows.push((1, e.0, e.1, e.2, 0));
            } else {
                let w = windows.entry((e.0, start)).or_default();
                w.0 += 1;
                w.1 += e.2;
            }
        }
        wm = wm.max(batch.iter().map(|e| e.1).max().unwrap() - 1);
    }
    rows.extend(windows.into_iter().map(|((k, s), (c, sum))| (0, k, s, c, sum)));
    rows.sort_unstable();
    rows
}

/// Tumbling windows of `LATE_BATCH` ms with the late side output over
/// `late_items`, the window task slow (20 µs per record) behind small
/// rings so that unaligned barriers overtake records and watermarks.
/// Returns the committed rows, sorted, the restarts and the channel-state
/// bytes of the completed checkpoints.
fn late_records_run(mode: Option<CheckpointMode>, failures: u32, batches: i64) -> (Vec<LateRow>, usize, u64) {
    let items = Arc::new(late_items(batches));
    let dir = tempfile::tempdir().unwrap();
    let chaos = Chaos::new(failures);
    let target: Arc<Mutex<Target<LateRow>>> = Arc::default();
    let t = target.clone();
    let ckpt = mode.is_some();
    let p = Pipeline::new("late-records");
    p.source("in", 1, move |i, n| weir_core::VecSource::new(items.clone(), i, n))
        .assign_watermarks(WatermarkStrategy::ascending(|e: &Ev| e.1))
        .map(move |e: Ev| {
            chaos.tick();
            e
        })
        .key_by(|e: &Ev| e.0)
        .parallelism(2)
        .window(Windows::tumbling(LATE_BATCH), |e: &Ev| {
            let t0 = std::time::Instant::now();
            while t0.elapsed() < Duration::from_micros(20) {
                std::hint::spin_loop();
            }
            e.1
        })
        .aggregate(CountSum, |k: &u64, w, (c, sum)| (*k, w.start, c, sum))
        .map(|w: Windowed<(u64, i64, u64, u64), Ev>| match w {
            Windowed::Result((k, start, c, sum)) => (0u8, k, start, c, sum),
            Windowed::Late((k, ts, v)) => (1u8, k, ts, v, 0),
        })
        .sink("tx", move |i| TxSink::new(i, t.clone(), ckpt));
    let config = RuntimeConfig {
        workers: 2,
        ring_capacity: 64,
        batch_size: LATE_BATCH as usize,
        checkpointing: mode.map(|mode| CheckpointConfig {
            interval: Duration::from_millis(5),
            timeout: Duration::from_secs(20),
            ..CheckpointConfig::new(mode, dir.path())
        }),
        restart: RestartStrategy::FixedDelay {
            attempts: 20,
            delay: Duration::from_millis(1),
        },
        ..RuntimeConfig::default()
    };
    let result = p.run(config).unwrap().join().unwrap();
    let stats = &result.metrics.checkpoints;
    let channel_bytes = stats.history.iter().map(|r| r.channel_state_bytes).sum();
    let mut rows = std::mem::take(&mut target.lock().unwrap().rows);
    rows.sort_unstable();
    (rows, stats.restarts.len(), channel_bytes)
}

/// Watermarks are part of channel state. Under unaligned checkpoints with
/// in-flight records and injected failures, the window results and the
/// late side output equal those of the failure-free run.
/// Every batch holds a record that only the watermark in front of it
/// makes late: replayed without that watermark (or after a restore that
/// starts event time again from the beginning), it would join a window
/// that already fired.
#[test]
fn late_records_are_the_same_across_unaligned_restores() {
    let batches = 1_500;
    let expected = expected_late_rows(&late_items(batches));
    let late = expected.iter().filter(|r| r.0 == 1).count();
    assert_eq!(late, batches as usize - 2, "one late record per batch from the third");
    let (free, _, _) = late_records_run(None, 0, batches);
    assert!(free == expected, "the failure-free run gives the direct computation");
    for mode in [CheckpointMode::Unaligned, CheckpointMode::Aligned] {
        let (rows, restarts, channel_bytes) = late_records_run(Some(mode), 3, batches);
        assert_eq!(restarts, 3, "{mode:?}");
        if mode == CheckpointMode::Unaligned {
            assert!(channel_bytes > 0, "unaligned checkpoints stored in-flight records");
        }
        let diff: Vec<_> = rows
            .iter()
            .filter(|r| !expected.contains(r))
            .chain(expected.iter().filter(|r| !rows.contains(r)))
            .take(6)
            .collect();
        assert!(
            rows == expected,
            "{mode:?}: {} rows, expected {} (late: {} vs {}); first differences: {diff:?}",
            rows.len(),
            expected.len(),
            rows.iter().filter(|r| r.0 == 1).count(),
            late
        );
    }
}
