//! How much the machine itself delays a busy thread: a thread pinned to
//! each core spins reading the clock for 2 s and records every gap longer
//! than 50 µs (time it was not running: preemption, hypervisor steal).
//! Such gaps bound the tail latency any engine can reach here, so latency
//! figures in docs/benchmarks.md are read next to this one.
//!
//! `cargo bench -p weir-bench --bench jitter`

use std::time::{Duration, Instant};

fn main() {
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    println!("scheduling gaps of a spinning thread, 2 s per core (gaps > 50 µs)");
    let handles: Vec<_> = cores
        .into_iter()
        .map(|core| {
            std::thread::spawn(move || {
                core_affinity::set_for_current(core);
                let start = Instant::now();
                let mut last = Instant::now();
                let mut gaps: Vec<u128> = Vec::new();
                while start.elapsed() < Duration::from_secs(2) {
                    let now = Instant::now();
                    let gap = (now - last).as_micros();
                    if gap > 50 {
                        gaps.push(gap);
                    }
                    last = now;
                }
                gaps.sort_unstable();
                (core.id, gaps)
            })
        })
        .collect();
    for h in handles {
        let (core, gaps) = h.join().expect("spinner thread");
        let stolen: u128 = gaps.iter().sum();
        println!(
            "core {core}: {} gaps, {:.2}% of the time lost, median gap {} µs, max {} µs",
            gaps.len(),
            stolen as f64 / 2e6 * 100.0,
            gaps.get(gaps.len() / 2).copied().unwrap_or(0),
            gaps.last().copied().unwrap_or(0)
        );
    }
}
