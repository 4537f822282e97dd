//! What a worker does when none of its tasks can make progress.
//!
//! A worker first spins (cheapest wake-up, burns its own core only), then
//! yields its time slice (lets another thread on the core run), then parks
//! with a short timeout (gives the core away; wakes by timeout or when the
//! job is cancelled). Every phase is bounded, so an idle job costs little CPU
//! and a cancelled job stops within one park timeout.

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

    /// Called after a round in which nothing progressed.
    pub(crate) fn idle(&mut self) {
        let spins = u64::from(self.strategy.spins);
        let yields = spins + u64::from(self.strategy.yields);
        if self.rounds < spins {
            std::hint::spin_loop();
        } else if self.rounds < yields {
            std::thread::yield_now();
        } else {
            std::thread::park_timeout(self.strategy.park);
        }
        self.rounds = self.rounds.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        for _ in 0..10 {
            idler.idle();
        }
        assert_eq!(idler.rounds, 10);
        idler.reset();
        assert_eq!(idler.rounds, 0);
    }
}
