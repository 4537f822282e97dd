//! The platform probe: how late this machine runs a thread that wants to
//! run on time, measured in the same run and on the same cores as weir's
//! workers.
//!
//! A latency percentile of weir means little on its own on a virtual
//! machine: the hypervisor steals vCPUs (for long stretches while it
//! flushes a guest's disk writes), the host preempts, interrupts run. The
//! probe puts one thread on each core the workers use; each sleeps to
//! absolute ticks on a 200 µs grid under `SCHED_FIFO` and records how late
//! it woke. `SCHED_FIFO` preempts weir's own (`SCHED_OTHER`) threads, so
//! what the probe sees is the machine, not weir: reports print it beside
//! weir's percentiles, with weir's excess over it. The method and how to
//! read it are in docs/benchmarks.md ("How the figures are produced"), the
//! measurements behind them in docs/notebook/benchmarks-2026-12.md ("The
//! platform probe").
//!
//! What `SCHED_FIFO` hides, the time a worker waits behind other ordinary
//! threads on its core, is measured beside it by [`crate::lab::co_runners`],
//! which starts and stops with the probe.
//!
//! Nothing here runs per event: a probe thread wakes once per tick.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Once};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::lab::co_runners::{CoRunners, Sampler};
use crate::lab::cpu_time::{self, CpuTicks};

/// Time between two ticks of a probe thread, nanoseconds.
///
/// 200 µs gives about 5,000 samples per second per core (a p99.9 is known
/// after a fraction of a second). Each wake-up takes the core from its
/// worker for p50 6-8 µs, p99 17-28 µs: about 4% of the core, and
/// it raises weir's own p99 at 200,000 events/s
/// (docs/notebook/benchmarks-2026-12.md, "The platform probe", its
/// paragraph "What it costs the worker it measures"). A 1 ms grid
/// perturbed weir less but made the probe's own wake-ups slower, so the
/// excess fell for the wrong reason. A finer grid would cost the workers
/// more.
pub const TICK_NS: u64 = 200_000;

/// How long [`PlatformProbe::start`] waits for its threads to be in place.
pub const READY_TIMEOUT: Duration = Duration::from_secs(1);

/// Highest lateness the histograms distinguish: one hour, as weir's
/// latency histograms.
const MAX_NS: u64 = weir_core::LATENCY_MAX_NS;

/// The scheduling policy the probe threads ran under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// `SCHED_FIFO` priority 1: preempts every ordinary thread, so the
    /// figure holds only the machine's own delays.
    Fifo,
    /// `SCHED_OTHER` (FIFO was refused): the figure also holds waiting
    /// behind other threads of the core, weir's workers included.
    Other,
    /// Not this probe: a thread spinning alone on each worker core before
    /// the run ([`crate::lab::worker_gaps::spin_run`]).
    Spin,
}

impl Policy {
    /// The name in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Fifo => "fifo",
            Policy::Other => "other",
            Policy::Spin => "spin",
        }
    }
}

/// One probe thread's figures.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CoreFigures {
    /// The core it was pinned to (`None`: not pinned).
    pub core: Option<usize>,
    /// Its lateness p99, microseconds.
    pub p99_us: f64,
    /// Wake-ups it measured.
    pub samples: u64,
    /// Values in its histogram: the wake-ups plus the ticks it slept
    /// through (filled in by the correction).
    pub recorded: u64,
    /// Percentage of its core's time the hypervisor took while it ran
    /// (`None`: not pinned, or no `/proc/stat`); see [`crate::lab::cpu_time`].
    pub steal_pct: Option<f64>,
    /// Percentage of its core's time spent in interrupt handlers.
    pub irq_pct: Option<f64>,
}

/// What a probe measured between [`PlatformProbe::start`] and
/// [`PlatformProbe::stop`].
#[derive(Debug, Clone)]
pub struct PlatformResult {
    /// Lateness of every tick, nanoseconds, merged over the cores, with
    /// coordinated-omission correction (ticks slept through count as late
    /// as they were).
    pub latency_ns: Histogram<u64>,
    /// Per probe thread.
    pub per_core: Vec<CoreFigures>,
    /// `Fifo` if every thread got `SCHED_FIFO`, else `Other`.
    pub policy: Policy,
    /// The tick, microseconds.
    pub tick_us: u64,
    /// Wake-ups measured, summed over the cores (without the correction's
    /// filled-in values).
    pub samples: u64,
    /// Probe threads (one per core used by the workers).
    pub cores: usize,
    /// Wall-clock seconds from start to stop.
    pub seconds: f64,
    /// The probed cores' time over the probe's run, summed (`None`: no
    /// core was pinned, or no `/proc/stat`).
    pub cpu: Option<CpuTicks>,
    /// How long the workers waited behind other threads on their cores,
    /// which the probe itself cannot see (`None`: not measured); see
    /// [`crate::lab::co_runners`].
    pub co_runners: Option<CoRunners>,
}

impl PlatformResult {
    /// Adds `other`'s figures into this one (several runs, one row).
    pub fn merge(&mut self, other: &PlatformResult) {
        // Same bounds on both sides: the addition cannot fail.
        let _ = self.latency_ns.add(&other.latency_ns);
        self.per_core.extend(other.per_core.iter().cloned());
        if other.policy != self.policy && other.policy != Policy::Fifo {
            self.policy = other.policy;
        }
        self.samples += other.samples;
        self.cores = self.cores.max(other.cores);
        self.seconds += other.seconds;
        self.cpu = match (self.cpu, other.cpu) {
            (Some(mut a), Some(b)) => {
                a.add(&b);
                Some(a)
            }
            (a, b) => a.or(b),
        };
        self.co_runners = match (self.co_runners, other.co_runners) {
            (Some(mut a), Some(b)) => {
                a.merge(&b);
                Some(a)
            }
            (a, b) => a.or(b),
        };
    }
}

/// A running probe: one thread per core; see the module docs.
pub struct PlatformProbe {
    started: Instant,
    /// Every CPU's counters as the probe started measuring.
    cpu_start: Option<Vec<(usize, CpuTicks)>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<ThreadResult>>,
    co_runners: Option<Sampler>,
}

struct ThreadResult {
    core: Option<usize>,
    fifo: bool,
    latency_ns: Histogram<u64>,
    samples: u64,
}

impl PlatformProbe {
    /// Starts one probe thread on each of the first `cores` cores (those
    /// of workers 0..cores: worker `w` runs on core `w`). Without core ids
    /// (an unsupported platform) the threads run unpinned.
    /// Returns once every thread runs on its core under its policy (at
    /// most [`READY_TIMEOUT`] later), so that the probe covers what
    /// follows.
    pub fn start(cores: usize) -> PlatformProbe {
        let ids = core_affinity::get_core_ids().unwrap_or_default();
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready) = mpsc::channel::<(usize, i32)>();
        let mut threads = Vec::with_capacity(cores);
        for i in 0..cores.max(1) {
            let core = ids.get(i).copied();
            let (stop, ready_tx) = (stop.clone(), ready_tx.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("weir-platform-probe-{i}"))
                .spawn(move || probe_thread(i, core, &stop, &ready_tx));
            match spawned {
                Ok(t) => threads.push(t),
                // The run goes on; the result says on how many cores it measured.
                Err(e) => eprintln!("weir: warning: cannot start platform probe thread {i}: {e}"),
            }
        }
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut probes = Vec::with_capacity(threads.len());
        for _ in 0..threads.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            match ready.recv_timeout(left) {
                Ok(probe) => probes.push(probe),
                // Still starting (a very busy machine): it measures from when it runs.
                Err(_) => break,
            }
        }
        // The sampler on a core the workers do not use, if there is one.
        let spare = ids.get(cores.max(1)..).and_then(|s| s.last()).copied();
        PlatformProbe {
            started: Instant::now(),
            cpu_start: cpu_time::read(),
            stop,
            threads,
            co_runners: Sampler::start(probes, spare),
        }
    }

    /// Stops the threads (within a tick) and merges their figures.
    pub fn stop(self) -> PlatformResult {
        self.stop.store(true, Ordering::Relaxed);
        let co_runners = self.co_runners.and_then(Sampler::stop);
        let cpu_end = cpu_time::read();
        let core_time = |core: Option<usize>| {
            let core = core?;
            let end = cpu_time::of(cpu_end.as_deref()?, core)?;
            Some(end.since(&cpu_time::of(self.cpu_start.as_deref()?, core)?))
        };
        let mut cpu: Option<CpuTicks> = None;
        let mut latency_ns = new_histogram();
        let mut per_core = Vec::new();
        let mut samples = 0;
        let mut fifo = true;
        for t in self.threads {
            let Ok(r) = t.join() else {
                eprintln!("weir: warning: a platform probe thread panicked; its samples are missing");
                continue;
            };
            let _ = latency_ns.add(&r.latency_ns);
            let ticks = core_time(r.core);
            if let Some(t) = ticks {
                cpu.get_or_insert_with(CpuTicks::default).add(&t);
            }
            per_core.push(CoreFigures {
                core: r.core,
                p99_us: r.latency_ns.value_at_quantile(0.99) as f64 / 1e3,
                samples: r.samples,
                recorded: r.latency_ns.len(),
                steal_pct: ticks.and_then(|t| t.steal_pct()),
                irq_pct: ticks.and_then(|t| t.irq_pct()),
            });
            samples += r.samples;
            fifo &= r.fifo;
        }
        let policy = if fifo { Policy::Fifo } else { Policy::Other };
        if policy == Policy::Other {
            static WARN: Once = Once::new();
            WARN.call_once(|| {
                eprintln!(
                    "weir: warning: SCHED_FIFO refused for the platform probe (needs root or CAP_SYS_NICE); \
                     its figure includes waiting behind other threads of its core, weir's included"
                );
            });
        }
        PlatformResult {
            latency_ns,
            cores: per_core.len(),
            per_core,
            policy,
            tick_us: TICK_NS / 1000,
            samples,
            seconds: self.started.elapsed().as_secs_f64(),
            cpu,
            co_runners,
        }
    }
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_NS, 3).expect("static histogram bounds are valid")
}

/// CLOCK_MONOTONIC now, nanoseconds: the clock `clock_nanosleep` sleeps on.
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the
    // call; CLOCK_MONOTONIC is always supported on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Sleeps until CLOCK_MONOTONIC reads `deadline_ns`.
pub(crate) fn sleep_until(deadline_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
    };
    loop {
        // SAFETY: `ts` is a valid timespec; the remainder pointer may be
        // null with TIMER_ABSTIME.
        let rc =
            unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, libc::TIMER_ABSTIME, &ts, std::ptr::null_mut()) };
        // Interrupted by a signal: sleep again to the same deadline.
        if rc != libc::EINTR {
            return;
        }
    }
}

/// Asks for SCHED_FIFO, pins, says it is ready (with its index and thread
/// id, for [`crate::lab::co_runners`]), then wakes on the grid until `stop`.
fn probe_thread(
    index: usize,
    core: Option<core_affinity::CoreId>,
    stop: &AtomicBool,
    ready: &mpsc::Sender<(usize, i32)>,
) -> ThreadResult {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: `param` is a valid sched_param that outlives the call; pid 0
    // is the calling thread. First, so that the move to a core where a
    // worker spins does not wait for that worker's time slice.
    let fifo = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } == 0;
    if let Some(c) = core {
        // Best effort, as the workers' pinning.
        let _ = core_affinity::set_for_current(c);
    }
    // SAFETY: PR_SET_TIMERSLACK takes its value by value and reads no
    // memory; it only affects this thread. A failure leaves the default
    // 50 µs slack, which the figure would then include.
    unsafe {
        libc::prctl(
            libc::PR_SET_TIMERSLACK,
            1 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    // SAFETY: gettid takes no arguments and cannot fail.
    let tid = unsafe { libc::gettid() };
    // The receiver may have stopped waiting: nothing to do then.
    let _ = ready.send((index, tid));
    let mut latency_ns = new_histogram();
    let mut samples = 0u64;
    let mut tick = monotonic_ns() + TICK_NS;
    while !stop.load(Ordering::Relaxed) {
        sleep_until(tick);
        let now = monotonic_ns();
        let late = now.saturating_sub(tick).clamp(1, MAX_NS);
        // Within the bounds (clamped above): cannot fail.
        let _ = latency_ns.record_correct(late, TICK_NS);
        samples += 1;
        // The next tick on the grid after now: ticks slept through are
        // accounted for by the correction above.
        tick += TICK_NS * (now.saturating_sub(tick) / TICK_NS + 1);
    }
    ThreadResult {
        core: core.map(|c| c.id),
        fifo,
        latency_ns,
        samples,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_records_samples_and_stops_promptly() {
        let cores = weir_core::available_cores().min(2);
        let probe = PlatformProbe::start(cores);
        std::thread::sleep(Duration::from_millis(100));
        let stopping = Instant::now();
        let r = probe.stop();
        let took = stopping.elapsed();
        assert!(took < Duration::from_secs(1), "stop took {took:?}");
        assert_eq!(r.cores, cores);
        assert_eq!(r.tick_us, TICK_NS / 1000);
        // ~500 ticks per core in 100 ms; a loaded machine wakes it less often.
        assert!(r.samples >= 10 * cores as u64, "{} samples", r.samples);
        assert_eq!(r.per_core.iter().map(|c| c.samples).sum::<u64>(), r.samples);
        // The merged histogram holds every core's values: each wake-up plus
        // the correction's filled-in ticks.
        assert_eq!(r.per_core.iter().map(|c| c.recorded).sum::<u64>(), r.latency_ns.len());
        assert!(r.per_core.iter().all(|c| c.recorded >= c.samples));
        assert!(r.latency_ns.value_at_quantile(0.5) <= r.latency_ns.max());
        assert!(r
            .per_core
            .iter()
            .all(|c| c.p99_us * 1e3 <= r.latency_ns.max() as f64 * 1.01));

        // Pinned (Linux): each core's time over the run was read.
        if cfg!(target_os = "linux") && r.per_core.iter().all(|c| c.core.is_some()) {
            let cpu = r.cpu.expect("the probed cores' time");
            assert!(cpu.total > 0 && cpu.steal <= cpu.total);
            assert!(r
                .per_core
                .iter()
                .all(|c| c.steal_pct.is_some_and(|s| (0.0..=100.0).contains(&s))));
        }

        // The co-runner sampler ran beside the probe (it follows whatever
        // worker threads other tests of this binary run meanwhile).
        if cfg!(target_os = "linux") {
            let c = r.co_runners.expect("the co-runner sampler's result");
            assert!(c.worst_us <= c.total_ms * 1e3 + 1e-6, "{c:?}");
            assert!(c.windows == 0 || c.workers > 0, "{c:?}");
        }

        let mut merged = r.clone();
        merged.merge(&r);
        assert_eq!(merged.cpu.map(|c| c.total), r.cpu.map(|c| 2 * c.total));
        assert_eq!(merged.latency_ns.len(), 2 * r.latency_ns.len());
        assert_eq!(merged.samples, 2 * r.samples);
    }
}
