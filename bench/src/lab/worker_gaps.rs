//! The platform figure without preempting a worker: a thread spinning
//! alone on each worker core, in its own time slot right before the run,
//! and the workers' own gaps during the run.
//!
//! The `SCHED_FIFO` probe ([`crate::lab::platform`]) wakes on the workers'
//! cores during the run and preempts them: on these guests it raised
//! weir's processing p99 at 200,000 records/s from about 10 µs to about
//! 22 µs, so the figure it was compared with was partly its own cost. It
//! stays available (`--platform-probe fifo`).
//!
//! **The spin run** (the default): before an open-loop run, one thread per
//! worker core, pinned as the worker will be, does what an engine that
//! costs nothing would do: spins on the clock. An interval between two of
//! its readings of at least [`weir_core::GAP_FLOOR_NS`] is time the
//! machine took from it (the hypervisor, interrupts, other threads). A
//! record arriving at a random instant waits what is left of the gap it
//! lands in ([`weir_core::WorkerDelays::wait_at_quantile`]); the figure is
//! that wait's distribution, the floor weir's processing latency is read
//! against. It shares no time with weir, so nothing of weir's is in it,
//! and its excess over the run's latency is all weir's.
//!
//! **The workers' own gaps** ([`weir_core::JobMetrics::worker_delays`]):
//! during the run, turns in which a worker found nothing to do but that
//! took at least a microsecond. They are mostly the machine's, but weir's
//! own helper threads on other cores can cause some (a futex wake-up or a
//! TLB shootdown interrupts the worker), so they are printed as what they
//! are, not as the platform.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;
use weir_core::{clock, WorkerDelays};

use crate::lab::cpu_time::{self, CpuTicks};
use crate::lab::platform::{CoreFigures, PlatformResult, Policy};

/// Default length of a spin run: 1 s (about 250 timer ticks per core).
pub const DEFAULT_SPIN: Duration = Duration::from_secs(1);

/// Resolution of [`wait_histogram`]'s spread of a gap: at least 100 ns
/// per value, at most this many values per gap.
const SPREAD_STEPS: u64 = 1_000;

/// Spins one thread on each of the first `cores` cores for `length` and
/// returns what they measured, as a platform result whose histogram is
/// the wait of a record arriving at a random instant ([`wait_histogram`]).
pub fn spin_run(cores: usize, length: Duration) -> PlatformResult {
    let ids = core_affinity::get_core_ids().unwrap_or_default();
    let cpu_start = cpu_time::read();
    let started = Instant::now();
    let go = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..cores.max(1))
        .filter_map(|i| {
            let core = ids.get(i).copied();
            let go = go.clone();
            std::thread::Builder::new()
                .name(format!("weir-platform-spin-{i}"))
                .spawn(move || {
                    if let Some(c) = core {
                        let _ = core_affinity::set_for_current(c);
                    }
                    while !go.load(Ordering::Acquire) {
                        std::hint::spin_loop();
                    }
                    (core.map(|c| c.id), spin(length))
                })
                .map_err(|e| eprintln!("weir: warning: cannot start platform spin thread {i}: {e}"))
                .ok()
        })
        .collect();
    go.store(true, Ordering::Release);
    let cpu_end_of = |core: Option<usize>, end: &Option<Vec<(usize, CpuTicks)>>| {
        let core = core?;
        Some(cpu_time::of(end.as_deref()?, core)?.since(&cpu_time::of(cpu_start.as_deref()?, core)?))
    };
    let mut merged = WorkerDelays::new();
    let mut per_core = Vec::new();
    let mut joined = Vec::new();
    for t in threads {
        match t.join() {
            Ok(r) => joined.push(r),
            Err(_) => eprintln!("weir: warning: a platform spin thread panicked; its figures are missing"),
        }
    }
    let cpu_end = cpu_time::read();
    let mut cpu: Option<CpuTicks> = None;
    for (core, d) in &joined {
        let ticks = cpu_end_of(*core, &cpu_end);
        if let Some(t) = ticks {
            cpu.get_or_insert_with(CpuTicks::default).add(&t);
        }
        per_core.push(CoreFigures {
            core: *core,
            p99_us: d.wait_at_quantile(0.99) as f64 / 1e3,
            samples: d.gaps(),
            recorded: d.gaps(),
            steal_pct: ticks.and_then(|t| t.steal_pct()),
            irq_pct: ticks.and_then(|t| t.irq_pct()),
        });
        merged.merge(d);
    }
    PlatformResult {
        latency_ns: wait_histogram(&merged),
        cores: per_core.len(),
        per_core,
        policy: Policy::Spin,
        tick_us: 0,
        samples: merged.gaps(),
        seconds: started.elapsed().as_secs_f64(),
        cpu,
        co_runners: None,
    }
}

/// One thread's spin: reads the clock until `length` has passed, recording
/// every interval of at least the floor as a gap.
fn spin(length: Duration) -> WorkerDelays {
    let mut d = WorkerDelays::new();
    let start = clock::now_ns();
    let end = start + length.as_nanos() as u64;
    let mut last = start;
    while last < end {
        let now = clock::now_ns();
        if now - last >= weir_core::GAP_FLOOR_NS {
            d.add_gap(now - last);
        }
        last = now;
        std::hint::spin_loop();
    }
    d.add_observed(last - start);
    d
}

/// The distribution of the wait of a record that arrives at a uniformly
/// random instant of the observed time, as a histogram (values in ns):
/// each gap of `g` spread evenly over `[0, g)` in proportion to its
/// length, the rest of the time at 0. Its percentiles are those of
/// [`WorkerDelays::wait_at_quantile`] (to the spread's resolution), and it
/// merges and plots like any latency histogram.
pub fn wait_histogram(d: &WorkerDelays) -> Histogram<u64> {
    let mut h = Histogram::new_with_bounds(1, weir_core::LATENCY_MAX_NS, 3).expect("valid histogram bounds");
    // One count per `UNIT` ns of observed time.
    const UNIT: u64 = 100;
    let mut lost_units = 0u64;
    for v in d.gaps_ns().iter_recorded() {
        // The bucket's middle, as `WorkerDelays::wait_at_quantile` takes it.
        let g = d.gaps_ns().median_equivalent(v.value_iterated_to());
        let step = (g / SPREAD_STEPS).max(UNIT);
        let mut at = 0;
        while at < g {
            // Rounded to the nearest unit: a piece under half a unit counts
            // for nothing, so the counts add up to the observed time.
            let units = (step.min(g - at) + UNIT / 2) / UNIT * v.count_at_value();
            h.saturating_record_n((at + step / 2).clamp(1, weir_core::LATENCY_MAX_NS), units);
            lost_units += units;
            at += step;
        }
    }
    let zero = (d.observed_ns() / UNIT).saturating_sub(lost_units);
    // Waits under the floor: counted at the histogram's lowest value.
    h.saturating_record_n(1, zero);
    h
}

/// The workers' gaps during a run, as printed beside it.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Gaps {
    /// Worker runs observed (one per worker per attempt).
    pub workers: u64,
    /// Worker time observed, summed over the workers, seconds.
    pub observed_s: f64,
    /// Idle turns of at least `floor_us`.
    pub gaps: u64,
    /// Their sum, milliseconds.
    pub lost_ms: f64,
    /// The longest, microseconds.
    pub longest_us: f64,
    /// Shorter turns are not recorded, microseconds.
    pub floor_us: f64,
}

impl Gaps {
    /// From a run's [`WorkerDelays`].
    pub fn of(d: &WorkerDelays) -> Self {
        Gaps {
            workers: d.workers(),
            observed_s: d.observed_ns() as f64 / 1e9,
            gaps: d.gaps(),
            lost_ms: d.lost_ns() as f64 / 1e6,
            longest_us: d.longest_ns() as f64 / 1e3,
            floor_us: weir_core::GAP_FLOOR_NS as f64 / 1e3,
        }
    }

    /// `workers' idle turns of 1 µs or more: 12 over 4.5 s, 0.31 ms in
    /// all, the longest 150 µs`.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "workers' idle turns of {} µs or more: {} over {:.1} s, {:.2} ms in all",
            self.floor_us, self.gaps, self.observed_s, self.lost_ms
        );
        if self.gaps > 0 {
            s += &format!(", the longest {:.0} µs", self.longest_us);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_histogram_has_the_waits_percentiles() {
        let mut d = WorkerDelays::new();
        for _ in 0..10_000 {
            d.add_gap(10_000);
        }
        d.add_gap(1_000_000);
        d.add_observed(1_000_000_000);
        let h = wait_histogram(&d);
        for q in [0.5, 0.99, 0.999, 0.9995] {
            let (a, b) = (h.value_at_quantile(q) as f64, d.wait_at_quantile(q) as f64);
            assert!(
                (a - b).abs() <= 0.05 * b.max(2_000.0),
                "q {q}: histogram {a}, exact {b}"
            );
        }
    }

    #[test]
    fn a_spin_run_observes_its_length_on_each_core() {
        let r = spin_run(1, Duration::from_millis(20));
        assert_eq!(r.policy, Policy::Spin);
        assert_eq!(r.cores, 1);
        // At least the 20 ms asked for (more if the last reading came late).
        assert!(r.latency_ns.len() >= 199_000, "{}", r.latency_ns.len());
        // One count per 100 ns observed, whatever the machine took from it.
        let d = spin(Duration::from_millis(20));
        assert!(d.observed_ns() >= 20_000_000);
        let (n, want) = (wait_histogram(&d).len(), d.observed_ns() / 100);
        assert!(n.abs_diff(want) <= want / 100, "{n} counts for {want} units");
    }

    #[test]
    fn the_description_names_what_was_lost() {
        let mut d = WorkerDelays::new();
        d.add_gap(150_000);
        d.add_gap(160_000);
        d.add_observed(4_500_000_000);
        let text = Gaps::of(&d).describe();
        assert!(
            text.contains("2 over 4.5 s, 0.31 ms in all, the longest 160 µs"),
            "{text}"
        );
    }
}
