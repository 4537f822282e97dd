//! What the endpoint itself costs: the CPU time its threads spend.
//!
//! Serving metrics must cost the job nothing it can measure, and that
//! needs a measure of its own. Wall-clock throughput on a shared 2-core
//! guest moves by several percent from run to run, so a 1% difference
//! cannot be seen in it; the CPU time of the endpoint's own threads can:
//! each thread adds the CPU time of every unit of work it does (a sample,
//! an accepted connection, a request) to one counter. It is served as
//! `weir_metrics_endpoint_cpu_seconds_total` and reported by
//! [`crate::JobHandle::join`] in [`crate::JobResult::metrics_endpoint_cpu`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub(crate) use crate::clock::thread_cpu_ns;

/// A shared total of CPU time spent by the threads that [`CpuMeter::track`]
/// their work.
#[derive(Clone, Debug, Default)]
pub(crate) struct CpuMeter {
    total_ns: Arc<AtomicU64>,
}

impl CpuMeter {
    /// Runs `work` and adds the CPU time it took on this thread.
    pub(crate) fn track<R>(&self, work: impl FnOnce() -> R) -> R {
        let t0 = thread_cpu_ns();
        let r = work();
        self.add(thread_cpu_ns().saturating_sub(t0));
        r
    }

    /// Adds `ns` of CPU time measured by the caller.
    pub(crate) fn add(&self, ns: u64) {
        self.total_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// CPU time tracked so far, in nanoseconds.
    pub(crate) fn total_ns(&self) -> u64 {
        self.total_ns.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracks_the_work_of_this_thread_only() {
        let m = CpuMeter::default();
        let before = thread_cpu_ns();
        // Busy for a few milliseconds of CPU.
        let x = m.track(|| {
            let t = thread_cpu_ns();
            let mut x = 0u64;
            while thread_cpu_ns() - t < 3_000_000 {
                x = x.wrapping_add(std::hint::black_box(1));
            }
            x
        });
        assert!(x > 0);
        let tracked = m.total_ns();
        assert!(tracked >= 3_000_000, "{tracked}");
        assert!(tracked <= thread_cpu_ns() - before, "{tracked}");
        // Sleeping is not CPU time.
        let m2 = m.clone();
        let slept = std::thread::spawn(move || m2.track(|| std::thread::sleep(std::time::Duration::from_millis(30))));
        slept.join().unwrap();
        assert!(m.total_ns() - tracked < 10_000_000, "{}", m.total_ns() - tracked);
    }
}
