//! What a sink's worker paid, every 100 ms, to publish its latency
//! histogram by merging it into the job's (the earlier design), against
//! what it pays now: a swap of two boxed histograms, the full one handed
//! over to be merged off the worker, so that no worker pauses for the
//! merge (docs/notebook/benchmarks-2026-12.md, "Latency histograms handed
//! over, not merged, on the worker").
//!
//! Each period records 20,000 samples (200,000 events/s for
//! `weir_core::LATENCY_PUBLISH_NS`) between 2 µs and 200 µs into a histogram
//! of weir's shape (1 ns to `LATENCY_MAX_NS`, 3 significant figures), then
//! times the old publish (`add` into the job's histogram, then `reset`) and
//! the new one (`mem::swap` of two boxes), 300 periods each.
//!
//! `cargo bench -p weir-bench --bench latency_publish`

use std::hint::black_box;
use std::time::Instant;

use hdrhistogram::Histogram;

const PERIODS: usize = 300;
const SAMPLES_PER_PERIOD: u64 = 20_000;

fn histogram() -> Box<Histogram<u64>> {
    Box::new(Histogram::new_with_bounds(1, weir_core::LATENCY_MAX_NS, 3).expect("valid bounds"))
}

fn fill(h: &mut Histogram<u64>, seed: &mut u64) {
    for _ in 0..SAMPLES_PER_PERIOD {
        // xorshift: a spread of values, no allocation.
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        h.record(2_000 + *seed % 198_000).expect("within bounds");
    }
}

fn report(name: &str, mut ns: Vec<u128>) {
    ns.sort_unstable();
    let at = |q: f64| ns[((ns.len() - 1) as f64 * q) as usize] as f64 / 1000.0;
    println!(
        "{name:<28} p50 {:>8.2} µs  p99 {:>8.2} µs  max {:>8.2} µs",
        at(0.5),
        at(0.99),
        at(1.0)
    );
}

fn main() {
    println!("publishing a sink's latency histogram ({SAMPLES_PER_PERIOD} samples a period, {PERIODS} periods)");
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut job = histogram();
    let mut local = histogram();
    let mut merged = Vec::with_capacity(PERIODS);
    for _ in 0..PERIODS {
        fill(&mut local, &mut seed);
        let t = Instant::now();
        job.add(&*local).expect("same bounds");
        local.reset();
        merged.push(t.elapsed().as_nanos());
    }
    black_box(&job);
    report("merge + reset (before)", merged);

    let mut spare = histogram();
    let mut swapped = Vec::with_capacity(PERIODS);
    for _ in 0..PERIODS {
        fill(&mut local, &mut seed);
        let t = Instant::now();
        std::mem::swap(&mut local, &mut spare);
        swapped.push(t.elapsed().as_nanos());
        black_box(&spare);
        spare.reset(); // the reader's part, off the timed path
    }
    report("hand-over swap (now)", swapped);
}
