//! What a worker does when none of its tasks can make progress.
//!
//! A worker first spins (cheapest wake-up, burns its own core only), then
//! yields its time slice (lets another thread on the core run), then parks
//! with a short timeout (gives the core away; wakes by timeout or when the
//! job is cancelled). Every phase is bounded, so an idle job costs little CPU
//! and a cancelled job stops within one park timeout.

use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;
use std::time::Duration;

/// Configurable back-off for idle workers and full rings.
///
/// ```
/// use std::time::Duration;
/// use weir_core::IdleStrategy;
/// // Lowest latency: spin long, never park for more than 50 µs.
/// let idle = IdleStrategy { spins: 10_000, yields: 10_000, park: Duration::from_micros(50) };
/// assert!(idle.validate().is_ok());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdleStrategy {
    /// Idle rounds spent busy-spinning (with a spin-loop hint) before yielding.
    pub spins: u32,
    /// Idle rounds spent in `thread::yield_now` before parking.
    pub yields: u32,
    /// How long one park lasts at most; also bounds how late a parked worker
    /// notices new input. Must be between 1 µs and 100 ms (cancel must stop
    /// every thread within 100 ms).
    pub park: Duration,
}

/// Upper bound of [`IdleStrategy::park`]: cancel promises to stop every
/// thread within 100 ms, and a parked worker only sees the flag on wake-up.
pub const MAX_PARK: Duration = Duration::from_millis(50);

impl Default for IdleStrategy {
    fn default() -> Self {
        // 200 spins ~ 1-2 µs; 2000 yields ~ 0.5-2 ms of yielding; then 1 ms parks.
        IdleStrategy {
            spins: 200,
            yields: 2_000,
            park: Duration::from_millis(1),
        }
    }
}

impl IdleStrategy {
    /// Checks the bounds documented on the fields.
    pub fn validate(&self) -> crate::Result<()> {
        if self.park.is_zero() || self.park > MAX_PARK {
            return Err(crate::Error::config(
                "idle.park",
                format!("{:?}", self.park),
                "must be between 1 ns and 50 ms so that cancel stops every thread within 100 ms",
            ));
        }
        Ok(())
    }
}

/// The running state of one idle phase sequence.
#[derive(Debug)]
pub(crate) struct Idler {
    strategy: IdleStrategy,
    rounds: u64,
}

impl Idler {
    pub(crate) fn new(strategy: IdleStrategy) -> Self {
        Idler { strategy, rounds: 0 }
    }

    /// Called after a round in which something progressed.
    #[inline]
    pub(crate) fn reset(&mut self) {
        self.rounds = 0;
    }

    /// Called after a round in which nothing progressed. Spins or yields,
    /// or returns true when it is time to park (the caller parks through
    /// its [`Parker`], so that producers can wake it).
    pub(crate) fn idle(&mut self) -> bool {
        let spins = u64::from(self.strategy.spins);
        let yields = spins + u64::from(self.strategy.yields);
        self.rounds = self.rounds.saturating_add(1);
        if self.rounds <= spins {
            std::hint::spin_loop();
            false
        } else if self.rounds <= yields {
            std::thread::yield_now();
            false
        } else {
            true
        }
    }

    /// How long one park lasts at most.
    pub(crate) fn park_timeout(&self) -> std::time::Duration {
        self.strategy.park
    }
}

/// How long a helper thread parks at most in [`Parker::park_unless`]: a
/// bound, not a latency (a peer's wake-up ends the park at once), so that
/// it also notices a stop it was not woken for. A minute in this crate's
/// tests, where a lost wake-up must show as a hang, not as a 100 ms delay.
pub(crate) const HELPER_IDLE_PARK: Duration = if cfg!(test) {
    Duration::from_secs(60)
} else {
    Duration::from_millis(100)
};

/// Lets a producer wake a parked consumer (and a consumer a parked,
/// backpressured producer) instead of leaving it asleep for a whole park
/// timeout.
///
/// Protocol (no lost wake-up beyond the timeout): the worker sets
/// `sleeping`, issues a SeqCst fence, polls its tasks once more and parks
/// only if that found nothing; a peer publishes its ring update, issues a
/// SeqCst fence, and unparks the worker if it sees `sleeping`. Either the
/// worker's last poll sees the update or the peer sees the flag. Costs a
/// fence and a load per ring transfer, never per record.
#[derive(Debug, Default)]
pub(crate) struct Parker {
    sleeping: AtomicBool,
    thread: OnceLock<Thread>,
}

impl Parker {
    /// Worker: record which thread to unpark.
    pub(crate) fn register(&self) {
        let _ = self.thread.set(std::thread::current());
    }

    /// Worker: about to park; poll once more after this.
    pub(crate) fn prepare_park(&self) {
        self.sleeping.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// Whether the thread said it is about to park (tests).
    #[cfg(test)]
    pub(crate) fn is_sleeping(&self) -> bool {
        self.sleeping.load(Ordering::SeqCst)
    }

    /// A helper thread with nothing to do (an I/O thread, the snapshot
    /// spawner): parks until a peer's [`Parker::wake`], or at most
    /// [`HELPER_IDLE_PARK`], unless `has_work` finds work after the flag
    /// is set (so a peer's update is either seen here or sees the flag).
    pub(crate) fn park_unless(&self, has_work: impl Fn() -> bool) {
        self.prepare_park();
        if !has_work() {
            std::thread::park_timeout(HELPER_IDLE_PARK);
        }
        self.awake();
    }

    /// Worker: awake again.
    pub(crate) fn awake(&self) {
        self.sleeping.store(false, Ordering::Relaxed);
    }

    /// Peer: call after publishing a ring update.
    #[inline]
    pub(crate) fn wake(&self) {
        if self.wants_wake() {
            self.unpark();
        }
    }

    /// Peer, after publishing an update: whether the thread said it is
    /// about to park (then it must be woken, by [`Parker::unpark`] or
    /// through a [`crate::threads::relay::WakeRelay`]).
    #[inline]
    pub(crate) fn wants_wake(&self) -> bool {
        fence(Ordering::SeqCst);
        self.sleeping.load(Ordering::Relaxed)
    }

    /// Unparks the thread (a `futex` call if it sleeps).
    pub(crate) fn unpark(&self) {
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }
}

/// Wakes the worker of a sink if it parked: for the sink's own threads
/// (an [`crate::threads::io_thread::IoThread`]), after they freed room or finished
/// something the sink waits for, so that the worker looks again at once
/// instead of at its next park timeout. Cheap when the worker is awake (a
/// fence and a load). Get it from [`crate::SinkContext::waker`].
#[derive(Debug, Clone, Default)]
pub struct Waker {
    parker: Option<Arc<Parker>>,
}

impl Waker {
    pub(crate) fn new(parker: Option<Arc<Parker>>) -> Self {
        Waker { parker }
    }

    /// A waker that wakes nothing (a sink driven by hand, outside a job).
    pub fn noop() -> Self {
        Waker::default()
    }

    /// Wakes the worker if it parked.
    #[inline]
    pub fn wake(&self) {
        if let Some(p) = &self.parker {
            p.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wake_unparks_a_sleeping_worker() {
        let parker = std::sync::Arc::new(Parker::default());
        let p = parker.clone();
        let t = std::thread::spawn(move || {
            p.register();
            p.prepare_park();
            let start = std::time::Instant::now();
            // Without a wake this would sleep the full 10 s.
            std::thread::park_timeout(Duration::from_secs(10));
            p.awake();
            start.elapsed()
        });
        while !parker.sleeping.load(Ordering::Relaxed) || parker.thread.get().is_none() {
            std::thread::yield_now();
        }
        parker.wake();
        assert!(t.join().unwrap() < Duration::from_secs(5));
    }

    #[test]
    fn rejects_long_parks() {
        let s = IdleStrategy {
            park: Duration::from_secs(1),
            ..IdleStrategy::default()
        };
        let err = s.validate().unwrap_err().to_string();
        assert!(err.contains("idle.park"), "{err}");
        assert!(IdleStrategy::default().validate().is_ok());
    }

    #[test]
    fn phases_progress_to_park() {
        let mut idler = Idler::new(IdleStrategy {
            spins: 2,
            yields: 2,
            park: Duration::from_micros(10),
        });
        let parks: Vec<bool> = (0..6).map(|_| idler.idle()).collect();
        assert_eq!(
            parks,
            vec![false, false, false, false, true, true],
            "spin 2, yield 2, then park"
        );
        assert_eq!(idler.rounds, 6);
        idler.reset();
        assert_eq!(idler.rounds, 0);
    }
}
