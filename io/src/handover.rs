//! The hand-over of a sink whose output is visible as soon as its own
//! thread wrote it (the direct file sink, the SQLite upsert sink): what
//! the worker keeps between the records' arrival and the thread's reply.
//!
//! Records (encoded bytes, or the records themselves) collect in a pending
//! buffer with their emission stamps. The buffer goes to the sink's thread
//! whole, when no hand-over is in flight and the flush interval has passed
//! since the last one (or enough is pending), or at once at a barrier or the
//! end: a slow target gets larger writes instead of more of them, and the
//! thread wakes a bounded number of times a second however small the
//! batches are. The thread's reply brings the buffer back (cleared, for
//! reuse) with the moment its contents became visible, which turns the
//! stamps into visibility latencies.

use crate::latency::{StampRuns, Visible};

/// What a hand-over carries: bytes or records.
pub(crate) trait Buffer: Default {
    /// Units (bytes, records) in it.
    fn units(&self) -> usize;
    /// Empties it, keeping its allocation.
    fn clear(&mut self);
}

impl<T> Buffer for Vec<T> {
    fn units(&self) -> usize {
        self.len()
    }
    fn clear(&mut self) {
        Vec::clear(self);
    }
}

/// Buffers back from the thread kept for reuse: one being written while
/// the next fills.
const SPARE: usize = 2;

/// The worker's side of the hand-over; see the module docs.
#[derive(Debug)]
pub(crate) struct Handover<B> {
    /// What the next hand-over takes, and its records' emission stamps.
    pub(crate) pending: B,
    pub(crate) pending_stamps: StampRuns,
    spare: Vec<(B, StampRuns)>,
    /// Hand-overs not yet replied to (one, or more after a barrier), and
    /// their units.
    in_flight: usize,
    units_in_flight: usize,
    last_ns: u64,
    interval_ns: u64,
    /// Units pending that are handed over without waiting for the interval.
    flush_units: usize,
    /// Latencies of what became visible, for the runtime.
    pub(crate) visible: Visible,
}

impl<B: Buffer> Handover<B> {
    /// A hand-over at most every `interval_ns` unless `flush_units` wait.
    pub(crate) fn new(interval_ns: u64, flush_units: usize) -> Self {
        Handover {
            pending: B::default(),
            pending_stamps: StampRuns::default(),
            spare: Vec::new(),
            in_flight: 0,
            units_in_flight: 0,
            last_ns: 0,
            interval_ns,
            flush_units,
            visible: Visible::default(),
        }
    }

    /// Sets the least time between two hand-overs.
    pub(crate) fn set_interval_ns(&mut self, interval_ns: u64) {
        self.interval_ns = interval_ns;
    }

    /// How long after a hand-over the sink's thread naps, once it handled
    /// it, before it parks (`IoThread::set_nap`): the flush interval and a
    /// tenth more (50 µs at the default 500 µs), at most
    /// [`weir_core::io_thread::MAX_NAP`]. The worker hands over the next
    /// batch an interval after the last one, so under a steady stream it
    /// comes while the thread naps, costs the worker no wake-up, and waits
    /// at most the tenth for the thread. Under the direct sink this spares
    /// the worker nearly all of its `futex` calls (those left are the
    /// barriers' hand-overs, off the cadence) for a small rise in
    /// visibility latency; a larger margin costs more latency and spares no
    /// more calls (docs/notebook/benchmarks-2026-12.md, "The direct sink's
    /// thread naps between hand-overs"). An idle sink's thread naps once,
    /// then parks.
    pub(crate) fn thread_nap(&self) -> std::time::Duration {
        let nap = std::time::Duration::from_nanos(self.interval_ns.saturating_add(self.interval_ns / 10));
        nap.min(weir_core::io_thread::MAX_NAP)
    }

    /// The pending buffer and its stamps, if they are to go now: at
    /// `Some(now)` if nothing is in flight and the interval passed (or
    /// enough is pending), at `None` (a barrier, the end) whenever anything
    /// is pending. The caller hands them to its thread.
    pub(crate) fn take(&mut self, now: Option<u64>) -> Option<(B, StampRuns)> {
        let units = self.pending.units();
        if units == 0 {
            return None;
        }
        let now = match now {
            Some(now) => {
                let due = now.saturating_sub(self.last_ns) >= self.interval_ns || units >= self.flush_units;
                if self.in_flight > 0 || !due {
                    return None;
                }
                now
            }
            None => weir_core::clock::now_ns(),
        };
        let (next, next_stamps) = self.spare.pop().unwrap_or_default();
        let buf = std::mem::replace(&mut self.pending, next);
        let stamps = std::mem::replace(&mut self.pending_stamps, next_stamps);
        self.in_flight += 1;
        self.units_in_flight += units;
        self.last_ns = now;
        Some((buf, stamps))
    }

    /// A hand-over of `units` came back, emptied, its contents visible
    /// since `visible_ns`.
    pub(crate) fn returned(&mut self, mut buf: B, mut stamps: StampRuns, visible_ns: u64, units: usize) {
        debug_assert!(self.in_flight > 0 && self.units_in_flight >= units);
        self.in_flight -= 1;
        self.units_in_flight -= units;
        self.visible.add(&stamps, visible_ns);
        stamps.clear();
        // The thread empties it; whatever is left must not be handed over twice.
        buf.clear();
        if self.spare.len() < SPARE {
            self.spare.push((buf, stamps));
        }
    }

    /// Units pending or in flight.
    pub(crate) fn buffered(&self) -> usize {
        self.pending.units() + self.units_in_flight
    }

    /// Nothing pending, nothing in flight.
    pub(crate) fn idle(&self) -> bool {
        self.pending.units() == 0 && self.in_flight == 0
    }

    /// Forgets everything pending and in flight (a restore starts over).
    pub(crate) fn reset(&mut self) {
        self.pending = B::default();
        self.pending_stamps.clear();
        self.in_flight = 0;
        self.units_in_flight = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hands_over_when_due_one_at_a_time_and_at_once_when_forced() {
        let mut h: Handover<Vec<u8>> = Handover::new(500, 100);
        assert!(h.take(Some(1_000)).is_none(), "nothing pending");
        h.pending.extend_from_slice(b"abc");
        h.pending_stamps.push(10);
        let (buf, stamps) = h.take(Some(1_000)).expect("due: the interval passed since 0");
        assert_eq!((buf.as_slice(), stamps.count()), (&b"abc"[..], 1));
        h.pending.extend_from_slice(b"de");
        assert!(h.take(Some(2_000)).is_none(), "one hand-over in flight at a time");
        assert_eq!(h.buffered(), 5);
        h.returned(buf, stamps, 50, 3);
        assert!(h.take(Some(1_200)).is_none(), "the interval has not passed");
        h.pending.extend(std::iter::repeat_n(b'x', 100));
        assert!(h.take(Some(1_200)).is_some(), "enough pending goes at once");
        h.pending.push(b'y');
        assert!(h.take(None).is_some(), "forced, even with one in flight");
        assert!(!h.idle());
        assert_eq!(h.buffered(), 103);
        h.reset();
        assert!(h.idle() && h.buffered() == 0);
    }
}
