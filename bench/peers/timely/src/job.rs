//! weir's keyed and stateless benchmark jobs as timely dataflows: the
//! records come from weir's own generator, the sink measures latency on
//! weir's clock with weir's histogram bounds, and worker `w` is pinned to
//! core `w` as weir pins its workers. Everything between source and sink is
//! plain timely, written the way its examples write it.
//!
//! - keyed: generator -> `Exchange` pact by key -> running count and sum
//!   per key in a hash map, the sum replacing the record's value (one
//!   `unary` operator, records updated in place) -> counting sink.
//! - stateless: generator -> `map_in_place(value * 3 + 1)` ->
//!   `filter(seq % 16 != 15)` -> counting sink, all `Pipeline` (on the
//!   worker that made the records, as weir chains them).
//!
//! The generator either is a source operator (`Input::Source`) or feeds an
//! `InputHandle` from the worker's own loop (`Input::Handle`); timestamps
//! are per generator batch, per millisecond of the clock, or per record
//! ([`TimeGrain`]).

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::{Exchange, Pipeline as Local};
use timely::dataflow::operators::generic::operator::source;
use timely::dataflow::operators::vec::{Filter, Map};
use timely::dataflow::operators::{Input as _, Operator, Probe};
use timely::dataflow::{InputHandle, ProbeHandle, Scope, StreamVec};
use timely::worker::Worker;
use weir_core::harness::Harness;
use weir_core::{clock, SourcePoll};
use weir_io::{GenContext, Generator, GeneratorConfig};

/// The benchmark record: `bench/src/lab/event.rs` of weir, field for field
/// (32 bytes, plain data).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[repr(C)]
pub struct Event {
    /// Partitioning key, in `0..keys`.
    pub key: u64,
    /// Payload; the keyed job replaces it by the key's running sum.
    pub value: u64,
    /// Emission time on `weir_core::clock` (scheduled time when rated; 0
    /// for the open loop's warm-up, which is not measured).
    pub emitted_ns: u64,
    /// Global sequence number from the generator.
    pub seq: u64,
}

const _: () = assert!(std::mem::size_of::<Event>() == 32);

/// Which job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pipeline {
    /// generator -> map -> filter -> counting sink.
    Stateless,
    /// generator -> exchange by key -> running sum per key -> counting sink.
    Keyed,
}

/// How the generator's records enter the dataflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Input {
    /// A source operator (`generic::operator::source`) that polls the
    /// generator each time it is scheduled and reschedules itself.
    Source,
    /// An `InputHandle` the worker's own loop fills between `step`s, as
    /// timely's `examples/openloop.rs` does.
    Handle,
}

/// What one timestamp covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TimeGrain {
    /// One timestamp per generator poll (at most `batch` records): a
    /// counter per worker.
    Batch,
    /// The millisecond of `weir_core::clock` at which the batch was polled.
    #[serde(rename = "ms")]
    Millisecond,
    /// Every record its own timestamp, its sequence number.
    Record,
}

/// One run's settings.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The job.
    pub pipeline: Pipeline,
    /// Records in total.
    pub events: u64,
    /// Records per second in total (open loop), or full speed.
    pub rate: Option<f64>,
    /// Distinct keys.
    pub keys: u64,
    /// Timely worker threads (every operator has this parallelism).
    pub workers: usize,
    /// Generator seed.
    pub seed: u64,
    /// Open loop: the schedule's first this-many ms are the warm-up.
    pub warmup_ms: u64,
    /// Source operator or input handle.
    pub input: Input,
    /// Timestamp granularity.
    pub time: TimeGrain,
    /// Closed loop: how many timestamps the feeder may run ahead of the
    /// sink's probe (timely has no backpressure; without a bound a fast
    /// source fills memory).
    pub lag: u64,
    /// Records per generator poll (weir's default batch size).
    pub batch: usize,
    /// Pin worker `w` to core `w`.
    pub pin: bool,
}

impl Default for Spec {
    fn default() -> Self {
        Spec {
            pipeline: Pipeline::Keyed,
            events: 100_000_000,
            rate: None,
            keys: 10_000,
            workers: 2,
            seed: 1,
            warmup_ms: 200,
            input: Input::Source,
            time: TimeGrain::Batch,
            lag: 16,
            batch: 1024,
            pin: true,
        }
    }
}

impl Spec {
    /// Open loop: the records of the schedule's first `warmup_ms`, at most
    /// a quarter of the run (weir's `Spec::warmup_records`); closed loop: 0.
    pub fn warmup_records(&self) -> u64 {
        match self.rate {
            Some(rate) => ((rate * self.warmup_ms as f64 / 1e3) as u64).min(self.events / 4),
            None => 0,
        }
    }

    /// Records that must reach the sinks.
    pub fn expected_output(&self) -> u64 {
        match self.pipeline {
            Pipeline::Keyed => self.events,
            Pipeline::Stateless => self.events - self.events / 16,
        }
    }
}

/// Latency percentiles in microseconds, as `weir bench --json` writes them.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest.
    pub max: f64,
}

impl Percentiles {
    fn from_ns(h: &Histogram<u64>) -> Self {
        let us = |v: u64| v as f64 / 1000.0;
        Percentiles {
            p50: us(h.value_at_quantile(0.50)),
            p99: us(h.value_at_quantile(0.99)),
            p999: us(h.value_at_quantile(0.999)),
            max: us(h.max()),
        }
    }
}

/// One run's result: `weir bench --json`'s field names where they exist.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Always `timely`.
    pub engine: &'static str,
    /// The timely crate's version this was built with.
    pub timely_version: &'static str,
    /// The job.
    pub pipeline: Pipeline,
    /// Always `none`: timely has no checkpoints.
    pub mode: &'static str,
    /// Source operator or input handle.
    pub input: Input,
    /// Timestamp granularity.
    pub time: TimeGrain,
    /// Closed loop: the feeder's bound ahead of the probe, in timestamps.
    pub lag: Option<u64>,
    /// Worker threads.
    pub workers: usize,
    /// Every operator's parallelism (= workers in timely).
    pub parallelism: usize,
    /// Whether workers were pinned to cores.
    pub pinned: bool,
    /// Distinct keys.
    pub keys: u64,
    /// Records per second offered, if open loop.
    pub rate: Option<f64>,
    /// Records generated.
    pub events: u64,
    /// Open-loop records left out of the latency.
    pub warmup_records: u64,
    /// Records that reached the sinks.
    pub sink_records: u64,
    /// From just before the workers start to the last worker's exit.
    pub seconds: f64,
    /// `events / seconds`.
    pub events_per_sec: f64,
    /// Processing latency: sink clock minus the record's stamp.
    pub latency_us: Percentiles,
}

/// What one worker's counting sink saw.
struct Tally {
    count: u64,
    checksum: u64,
    latency_ns: Histogram<u64>,
}

impl Tally {
    fn new() -> Self {
        Tally {
            count: 0,
            checksum: 0,
            // weir's bounds (weir_core's latency histograms): 1 ns to 1 h,
            // 3 significant digits.
            latency_ns: Histogram::new_with_bounds(1, weir_core::LATENCY_MAX_NS, 3)
                .expect("static histogram bounds are valid"),
        }
    }

    /// Counts a batch and records its latencies, one clock reading for the
    /// whole activation (`now`), one histogram update per run of records
    /// with the same stamp, none for stamp 0: what weir's `CountSink` does.
    #[inline]
    fn write(&mut self, batch: &[Event], now: u64) {
        let Some(first) = batch.first() else { return };
        let mut record = |stamp: u64, run: u64| {
            if stamp != 0 {
                self.latency_ns
                    .saturating_record_n(now.saturating_sub(stamp).max(1), run);
            }
        };
        let (mut stamp, mut run) = (first.emitted_ns, 0u64);
        let mut checksum = self.checksum;
        for e in batch {
            checksum = checksum.wrapping_add(e.value);
            if e.emitted_ns == stamp {
                run += 1;
            } else {
                record(stamp, run);
                stamp = e.emitted_ns;
                run = 1;
            }
        }
        record(stamp, run);
        self.checksum = checksum;
        self.count += batch.len() as u64;
    }
}

/// One worker's share of weir's generator: subtask `index` of `peers`,
/// polled through weir-core's connector harness, so that records, keys,
/// schedule and stamps are those of `weir bench` by construction.
struct Feed<F> {
    generator: Generator<F>,
    harness: Harness,
    batch: usize,
    /// Records polled so far by this worker.
    polled: u64,
    /// Batches polled so far (the `TimeGrain::Batch` timestamp).
    epoch: u64,
    index: u64,
    peers: u64,
    /// Open loop: schedule origin and nanoseconds per global record.
    schedule: Option<(u64, f64)>,
    done: bool,
}

/// The feed of worker `index` of `peers` for `spec`, its schedule starting
/// at `start_ns`: weir's `pipelines::build` generator, record for record.
fn feed(spec: &Spec, start_ns: u64, index: usize, peers: usize) -> Feed<impl FnMut(GenContext) -> Event + Send> {
    let config = GeneratorConfig {
        seed: spec.seed,
        events: Some(spec.events),
        rate: spec.rate,
        start_ns: Some(start_ns),
    };
    let (keys, warmup) = (spec.keys, spec.warmup_records());
    let generator = Generator::new(config, index, peers, move |c: GenContext| Event {
        // weir's multiply-shift onto 0..keys.
        key: ((u128::from(c.random) * u128::from(keys)) >> 64) as u64,
        value: c.seq,
        emitted_ns: if c.seq < warmup { 0 } else { c.emitted_ns },
        seq: c.seq,
    })
    .expect("the rate is checked when the arguments are parsed");
    Feed {
        generator,
        harness: Harness::new(index, peers),
        batch: spec.batch,
        polled: 0,
        epoch: 0,
        index: index as u64,
        peers: peers as u64,
        schedule: spec.rate.map(|r| (start_ns, 1e9 / r)),
        done: false,
    }
}

impl<F: FnMut(GenContext) -> Event + Send + 'static> Feed<F> {
    /// Polls the generator once into `out` (what is due, at most a batch).
    fn poll(&mut self, out: &mut Vec<Event>) {
        let before = out.len();
        let status = self
            .harness
            .poll_source(&mut self.generator, out, self.batch)
            .expect("the generator does not fail");
        self.polled += (out.len() - before) as u64;
        self.done = status == SourcePoll::Done;
    }

    /// Open loop: how long until this worker's next record is due.
    fn until_due(&self) -> Option<Duration> {
        let (start, period) = self.schedule?;
        let seq = self.index + self.polled * self.peers;
        let due = start + (seq as f64 * period) as u64;
        Some(Duration::from_nanos(due.saturating_sub(clock::now_ns())))
    }
}

/// The timestamp of the batch just polled (`Batch`, `Millisecond`) or of
/// record `e` (`Record`).
#[inline]
fn time_of(grain: TimeGrain, epoch: u64, now_ms: u64, e: &Event) -> u64 {
    match grain {
        TimeGrain::Batch => epoch,
        TimeGrain::Millisecond => now_ms,
        TimeGrain::Record => e.seq,
    }
}

/// The job after its input: the keyed or stateless part, then the counting
/// sink, then a probe; returns the probe.
fn build<'scope>(
    pipeline: Pipeline,
    events: StreamVec<'scope, u64, Event>,
    tally: Rc<RefCell<Tally>>,
) -> ProbeHandle<u64> {
    let processed = match pipeline {
        Pipeline::Stateless => events
            .map_in_place(|e: &mut Event| e.value = e.value.wrapping_mul(3).wrapping_add(1))
            .filter(|e: &Event| e.seq % 16 != 15),
        Pipeline::Keyed => events.unary(Exchange::new(|e: &Event| e.key), "RunningSum", |_cap, _info| {
            // Count and sum per key.
            let mut state: FxHashMap<u64, (u64, u64)> = FxHashMap::default();
            move |input, output| {
                input.for_each(|cap, data| {
                    for e in data.iter_mut() {
                        let (count, sum) = state.entry(e.key).or_insert((0, 0));
                        *count += 1;
                        *sum = sum.wrapping_add(e.value);
                        e.value = *sum;
                    }
                    output.session(&cap).give_container(data);
                });
            }
        }),
    };
    let counted = processed.unary::<CapacityContainerBuilder<Vec<()>>, _, _, _>(Local, "CountSink", |_cap, _info| {
        move |input, _output| {
            // One clock reading per activation, as weir's sink reads it
            // once per scheduling turn.
            let mut now = None;
            let mut tally = tally.borrow_mut();
            input.for_each(|_cap, data| {
                let now = *now.get_or_insert_with(clock::now_ns);
                tally.write(data, now);
            });
        }
    });
    counted.probe().0
}

/// Whether a closed-loop feeder at `time` must wait for the probe.
#[inline]
fn held_back(probe: &ProbeHandle<u64>, open_loop: bool, time: u64, lag: u64) -> bool {
    !open_loop && probe.less_than(&time.saturating_sub(lag))
}

/// Runs worker `index`'s part of the job with a source operator.
fn run_source<F: FnMut(GenContext) -> Event + Send + 'static>(
    worker: &mut Worker,
    spec: &Spec,
    mut feed: Feed<F>,
    tally: Rc<RefCell<Tally>>,
) {
    let (grain, lag, open_loop) = (spec.time, spec.lag, spec.rate.is_some());
    let probe_cell: Rc<RefCell<Option<ProbeHandle<u64>>>> = Rc::new(RefCell::new(None));
    let probe_for_source = probe_cell.clone();
    worker.dataflow::<u64, _, _>(|scope: Scope<'_, u64>| {
        let events = source(scope, "Generator", move |cap, info| {
            let activator = scope.activator_for(info.address);
            let mut cap = Some(cap);
            let mut buf = Vec::with_capacity(feed.batch);
            move |output| {
                let Some(c) = cap.as_mut() else { return };
                let probe = probe_for_source.borrow();
                if probe.as_ref().is_some_and(|p| held_back(p, open_loop, *c.time(), lag)) {
                    activator.activate();
                    return;
                }
                feed.poll(&mut buf);
                if !buf.is_empty() {
                    let now_ms = clock::now_ns() / 1_000_000;
                    match grain {
                        TimeGrain::Record => {
                            for e in buf.drain(..) {
                                c.downgrade(&e.seq);
                                output.session(&*c).give(e);
                            }
                        }
                        _ => {
                            c.downgrade(&time_of(grain, feed.epoch, now_ms, &buf[0]));
                            output.session(&*c).give_container(&mut buf);
                            buf.clear();
                        }
                    }
                    feed.epoch += 1;
                }
                if feed.done {
                    cap = None;
                } else {
                    match feed.until_due() {
                        // Nothing due yet: ask to be scheduled when it is;
                        // the worker parks meanwhile (after timely's idle spin).
                        Some(wait) if buf.is_empty() && wait > Duration::ZERO => activator.activate_after(wait),
                        _ => activator.activate(),
                    }
                }
            }
        });
        *probe_cell.borrow_mut() = Some(build(spec.pipeline, events, tally));
    });
    while worker.step_or_park(None) {}
}

/// Runs worker `index`'s part of the job with an input handle fed from
/// this loop between steps.
fn run_handle<F: FnMut(GenContext) -> Event + Send + 'static>(
    worker: &mut Worker,
    spec: &Spec,
    mut feed: Feed<F>,
    tally: Rc<RefCell<Tally>>,
) {
    let (grain, lag, open_loop) = (spec.time, spec.lag, spec.rate.is_some());
    let mut input: InputHandle<u64, CapacityContainerBuilder<Vec<Event>>> = InputHandle::new();
    let probe = worker.dataflow::<u64, _, _>(|scope| build(spec.pipeline, scope.input_from(&mut input), tally));
    let mut input = Some(input);
    let mut buf = Vec::with_capacity(feed.batch);
    loop {
        let mut park = Some(Duration::ZERO);
        if let Some(handle) = input.as_mut() {
            let now_ms = clock::now_ns() / 1_000_000;
            if grain == TimeGrain::Millisecond && now_ms > *handle.time() {
                // The millisecond is over: close its epoch, as
                // `examples/openloop.rs` advances its input to the clock.
                handle.advance_to(now_ms);
            }
            if !held_back(&probe, open_loop, *handle.time(), lag) {
                feed.poll(&mut buf);
                if !buf.is_empty() {
                    // Every epoch but the clock's current millisecond is
                    // closed right after its records, as timely's examples
                    // `send` then `advance_to`: closing an epoch is what
                    // flushes the exchange's buffers.
                    match grain {
                        TimeGrain::Record => {
                            for e in buf.drain(..) {
                                handle.advance_to(e.seq);
                                handle.send(e);
                                handle.advance_to(e.seq + 1);
                            }
                        }
                        TimeGrain::Batch => {
                            handle.advance_to(feed.epoch);
                            handle.send_batch(&mut buf);
                            handle.advance_to(feed.epoch + 1);
                        }
                        TimeGrain::Millisecond => {
                            handle.advance_to(now_ms.max(*handle.time()));
                            handle.send_batch(&mut buf);
                        }
                    }
                    buf.clear();
                    feed.epoch += 1;
                } else if let Some(wait) = feed.until_due() {
                    park = Some(wait);
                }
            }
            if feed.done {
                input = None;
            }
        } else {
            park = None;
        }
        if !worker.step_or_park(park) {
            break;
        }
    }
}

/// Runs the job on `spec.workers` timely workers in this process and
/// checks that every record reached a sink.
pub fn run(spec: &Spec) -> Result<Report, String> {
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let spec_for_workers = spec.clone();
    // Every worker's share of the schedule starts at one origin, slightly
    // in the future, as `weir bench` sets it.
    let start_ns = clock::now_ns() + 5_000_000;
    let started = Instant::now();
    let guards = timely::execute(timely::Config::process(spec.workers), move |worker| {
        let spec = &spec_for_workers;
        let (index, peers) = (worker.index(), worker.peers());
        if spec.pin && !cores.is_empty() {
            core_affinity::set_for_current(cores[index % cores.len()]);
        }
        let tally = Rc::new(RefCell::new(Tally::new()));
        let feed = feed(spec, start_ns, index, peers);
        match spec.input {
            Input::Source => run_source(worker, spec, feed, tally.clone()),
            Input::Handle => run_handle(worker, spec, feed, tally.clone()),
        }
        let t = tally.borrow();
        (t.count, t.checksum, t.latency_ns.clone())
    })?;
    let mut count = 0;
    let mut latency = Tally::new().latency_ns;
    for result in guards.join() {
        let (c, _checksum, h) = result?;
        count += c;
        latency.add(&h).map_err(|e| format!("merging histograms: {e}"))?;
    }
    let seconds = started.elapsed().as_secs_f64();
    if count != spec.expected_output() {
        return Err(format!(
            "{count} records reached the sinks, expected {}",
            spec.expected_output()
        ));
    }
    Ok(Report {
        engine: "timely",
        timely_version: "0.32",
        pipeline: spec.pipeline,
        mode: "none",
        input: spec.input,
        time: spec.time,
        lag: spec.rate.is_none().then_some(spec.lag),
        workers: spec.workers,
        parallelism: spec.workers,
        pinned: spec.pin && !core_affinity::get_core_ids().unwrap_or_default().is_empty(),
        keys: spec.keys,
        rate: spec.rate,
        events: spec.events,
        warmup_records: spec.warmup_records(),
        sink_records: count,
        seconds,
        events_per_sec: spec.events as f64 / seconds,
        latency_us: Percentiles::from_ns(&latency),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The feeds of all workers together make weir's records: every
    /// sequence number once, its key weir's multiply-shift of SplitMix64.
    #[test]
    fn the_feeds_make_weir_s_records() {
        let spec = Spec {
            events: 10_007,
            keys: 1000,
            seed: 7,
            ..Spec::default()
        };
        for peers in [1, 2, 3] {
            let mut all = Vec::new();
            for index in 0..peers {
                let mut f = feed(&spec, 0, index, peers);
                while !f.done {
                    f.poll(&mut all);
                }
            }
            all.sort_by_key(|e| e.seq);
            assert_eq!(all.len() as u64, spec.events);
            let seed_mix = weir_io::generator::splitmix64(spec.seed);
            for (i, e) in all.iter().enumerate() {
                let random = weir_io::generator::splitmix64(i as u64 ^ seed_mix);
                assert_eq!(e.seq, i as u64);
                assert_eq!(e.value, i as u64);
                assert_eq!(e.key, ((u128::from(random) * 1000) >> 64) as u64);
            }
        }
    }

    /// Open loop: records carry their scheduled time; the warm-up's carry 0.
    #[test]
    fn open_loop_stamps_are_the_schedule() {
        let start = clock::now_ns();
        let spec = Spec {
            events: 100,
            rate: Some(1e6),
            warmup_ms: 0,
            ..Spec::default()
        };
        let mut f = feed(&spec, start, 1, 2);
        let mut out = Vec::new();
        while !f.done {
            f.poll(&mut out);
        }
        assert_eq!(out.len(), 50);
        for e in &out {
            assert_eq!(e.emitted_ns, start + e.seq * 1000);
        }
    }

    /// Every variant delivers every record, on one and two workers.
    #[test]
    fn every_variant_delivers_every_record() {
        for pipeline in [Pipeline::Keyed, Pipeline::Stateless] {
            for input in [Input::Source, Input::Handle] {
                for time in [TimeGrain::Batch, TimeGrain::Millisecond, TimeGrain::Record] {
                    for (workers, rate) in [(1, None), (2, None), (2, Some(2e6))] {
                        let spec = Spec {
                            pipeline,
                            events: 20_011,
                            rate,
                            workers,
                            input,
                            time,
                            lag: 4,
                            warmup_ms: 1,
                            pin: false,
                            ..Spec::default()
                        };
                        let r = run(&spec).unwrap_or_else(|e| panic!("{spec:?}: {e}"));
                        assert_eq!(r.sink_records, spec.expected_output(), "{spec:?}");
                    }
                }
            }
        }
    }
}
