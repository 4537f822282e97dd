//! How long one core takes to see a write of the other, measured in the
//! same run as a scaling sweep: the per-chunk cost of the scaling model
//! (`scaling_model`, docs/design/scaling.md) comes from it.
//!
//! Two threads pinned to cores 0 and 1 (the first two workers' cores)
//! bounce a counter on a cache line of its own: core 0 writes an odd
//! value and spins until it reads the next even one, which core 1 writes
//! on seeing the odd one. A round trip is two handoffs, each a cache line
//! moving from the writer's core to the reader's, which is what a ring's
//! consumer pays to read the producer's new tail index and the producer
//! to read the consumer's new head.
//!
//! The figure is the median over [`WINDOWS`] windows of [`ROUND_TRIPS`]
//! round trips of each window's mean one-way time: a window in which a
//! thread lost its core says little, the median leaves it out, and the
//! mean within a window still counts every round trip. Every wait is
//! bounded ([`DEADLINE`]): a probe that cannot finish (a thread that
//! never gets a core) reports nothing rather than hang the run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use crate::lab::copy_probe::pin_to_core;

/// Windows measured; odd, so the median is one of them.
pub const WINDOWS: usize = 11;
/// Round trips per window.
pub const ROUND_TRIPS: u64 = 2_000;
/// The whole probe's time limit.
pub const DEADLINE: Duration = Duration::from_secs(2);

/// The value core 0 writes to tell core 1 to stop.
const STOP: u64 = u64::MAX;

/// One-way handoff latency between cores 0 and 1, nanoseconds: the median
/// window's mean; `None` with fewer than two cores or past [`DEADLINE`].
pub fn one_way_ns() -> Option<f64> {
    if weir_core::available_cores() < 2 {
        return None;
    }
    let line = CachePadded::new(AtomicU64::new(0));
    let start = Instant::now();
    let windows = std::thread::scope(|s| {
        let line = &line;
        s.spawn(move || {
            pin_to_core(1);
            let mut seen = 0u64;
            loop {
                let v = line.load(Ordering::Acquire);
                if v == STOP {
                    return;
                }
                if v != seen && v % 2 == 1 {
                    seen = v;
                    line.store(v + 1, Ordering::Release);
                    continue;
                }
                if start.elapsed() > DEADLINE {
                    return;
                }
                std::hint::spin_loop();
            }
        });
        let ping = s.spawn(move || {
            pin_to_core(0);
            let windows = bounce(line, start);
            line.store(STOP, Ordering::Release);
            windows
        });
        ping.join().ok().flatten()
    })?;
    Some(median(windows))
}

/// Core 0's side: [`WINDOWS`] windows of [`ROUND_TRIPS`]; each window's
/// mean one-way time, or `None` past the deadline.
fn bounce(line: &AtomicU64, start: Instant) -> Option<Vec<f64>> {
    let mut next = 1u64;
    let mut windows = Vec::with_capacity(WINDOWS);
    for _ in 0..WINDOWS {
        let t0 = Instant::now();
        for _ in 0..ROUND_TRIPS {
            line.store(next, Ordering::Release);
            let mut spins = 0u32;
            while line.load(Ordering::Acquire) != next + 1 {
                std::hint::spin_loop();
                spins = spins.wrapping_add(1);
                // The clock only now and then: it costs more than a spin.
                if spins.is_multiple_of(1024) && start.elapsed() > DEADLINE {
                    return None;
                }
            }
            next += 2;
        }
        windows.push(t0.elapsed().as_nanos() as f64 / (2 * ROUND_TRIPS) as f64);
    }
    Some(windows)
}

/// The median of a non-empty list (the upper middle of an even one).
fn median(mut v: Vec<f64>) -> f64 {
    assert!(!v.is_empty(), "no windows");
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The probe returns within its deadline (every wait is bounded, even
    /// when a thread gets no core), and a figure it gives is a positive
    /// time; with fewer than two cores it gives none.
    #[test]
    fn measures_a_handoff_within_its_deadline() {
        let t = Instant::now();
        let r = one_way_ns();
        assert!(t.elapsed() < DEADLINE + Duration::from_secs(3), "{:?}", t.elapsed());
        if weir_core::available_cores() < 2 {
            assert_eq!(r, None);
        }
        if let Some(ns) = r {
            assert!(ns > 0.0 && ns.is_finite(), "{ns}");
        }
    }

    #[test]
    fn the_median_is_the_middle_window() {
        assert_eq!(median(vec![5.0, 1.0, 900.0]), 5.0);
        assert_eq!(median(vec![2.0]), 2.0);
    }
}
