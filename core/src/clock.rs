//! A process-wide monotonic clock in nanoseconds.
//!
//! Reading it costs what `Instant::now` costs (16-29 ns on these guests), so the
//! runtime reads it once per batch, never once per record. Timestamps are
//! `u64` nanoseconds since the first use of the clock in this process, which
//! fits in a record field and subtracts without overflow checks.

use std::sync::OnceLock;
use std::time::Instant;

fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// Nanoseconds since this process first read the clock.
///
/// A reading ordered after another thread's reading (by a release store
/// and an acquire load) is not smaller: a sink subtracts a stamp taken by a
/// source on another core. A raw read of the time-stamp counter breaks
/// this: the CPU may execute it before the load that orders it, and on this
/// guest such readings came out up to 300 ns before the other core's
/// (`readings_order_across_threads`; `cargo bench -p weir-bench --bench
/// clock_read`).
///
/// ```
/// let a = weir_core::clock::now_ns();
/// let b = weir_core::clock::now_ns();
/// assert!(b >= a);
/// ```
#[inline]
pub fn now_ns() -> u64 {
    origin().elapsed().as_nanos() as u64
}

/// CPU time the calling thread has consumed so far, in nanoseconds
/// (`CLOCK_THREAD_CPUTIME_ID`; 0 if the clock cannot be read). What the
/// metrics endpoint's threads meter their own cost with.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the whole call, and
    // CLOCK_THREAD_CPUTIME_ID is a clock every Linux since 2.6.12 has.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    #[test]
    fn monotonic() {
        let mut last = super::now_ns();
        for _ in 0..1000 {
            let now = super::now_ns();
            assert!(now >= last);
            last = now;
        }
    }

    /// The contract the sink's latency rests on: a reading taken after an
    /// acquire load of another core's reading is not smaller. One thread
    /// publishes readings without pause; the other loads the latest and
    /// reads the clock at once, so a clock read that the CPU may run ahead
    /// of the load (a bare `rdtsc`) comes out early.
    #[test]
    fn readings_order_across_threads() {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        use std::time::{Duration, Instant};
        const LOADS: usize = 2_000_000;
        // On one core the two threads take turns instead; the check holds
        // all the same.
        let cores = core_affinity::get_core_ids().unwrap_or_default();
        let (first, last) = match cores.as_slice() {
            [a, .., b] => (Some(*a), Some(*b)),
            _ => (None, None),
        };
        let (stamp, done) = (&AtomicU64::new(0), &AtomicBool::new(false));
        let worst = std::thread::scope(|s| {
            s.spawn(move || {
                if let Some(c) = first {
                    core_affinity::set_for_current(c);
                }
                while !done.load(Ordering::Relaxed) {
                    // +1: a first reading of 0 would read as "none yet".
                    stamp.store(super::now_ns() + 1, Ordering::Release);
                }
            });
            let reader = s.spawn(move || {
                if let Some(c) = last {
                    core_affinity::set_for_current(c);
                }
                // The writer may not have run yet on a busy machine: wait
                // for its first reading (bounded), so that every load
                // below compares two readings.
                let deadline = Instant::now() + Duration::from_secs(30);
                while stamp.load(Ordering::Acquire) == 0 && Instant::now() < deadline {
                    std::thread::yield_now();
                }
                let mut worst = i64::MAX;
                for _ in 0..LOADS {
                    let theirs = stamp.load(Ordering::Acquire);
                    let ours = super::now_ns() + 1;
                    if theirs != 0 {
                        worst = worst.min(ours as i64 - theirs as i64);
                    }
                }
                done.store(true, Ordering::Relaxed);
                worst
            });
            reader.join().expect("the reader does not panic")
        });
        assert!(worst != i64::MAX, "the other thread published no reading in 30 s");
        assert!(worst >= 0, "a reading {} ns before the other core's", -worst);
    }
}
