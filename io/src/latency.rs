//! Visibility latency: from a record's emission at the source to the moment
//! a reader of the target can see it.
//!
//! Every sink records two latencies per record: the processing latency
//! when the record arrives at the sink ([`SinkContext::record_latency`]),
//! and the visibility latency when a reader of the target can see it
//! ([`SinkContext::record_visible_latency`]). A direct sink makes records
//! visible as it writes them. A transactional sink makes them visible at
//! commit, and [`weir_core::Sink::commit`] gets no [`SinkContext`] to
//! record into. So transactional sinks keep the emission stamps of
//! uncommitted records in `StampRuns`, compressed, turn them into
//! latencies at commit (`Visible::add`), and hand those to the runtime
//! at the next `write` or `finish` (`Visible::flush`).
//!
//! A sink whose I/O runs on a thread of its own learns when records became
//! visible (or, for the two-phase sink, whose target reads the stamps
//! there, when they arrived) from that thread's replies: the thread turns
//! stamps into `(latency, count)` runs, and the sink hands them to the
//! runtime at its next call with a context (`Visible::extend`,
//! `Arrived`), shifted so that the runtime records the latency measured
//! on the thread, not the time the reply waited.
//!
//! Bounded memory and bounded work: sources stamp whole batches with one
//! clock reading, so equal stamps come in runs and one run costs one entry.
//! When an epoch holds more than `MAX_RUNS` (4 Ki) runs (a rated source
//! stamps every record differently), runs closer than a resolution are
//! merged and the resolution doubles: the error of a latency is at most
//! that resolution, about the epoch's length / 2,048 (250-500 µs of a
//! one-second epoch, whose records wait up to a second to be visible).
//! Every run is one histogram update on the worker at commit, so fewer
//! runs is less work there. A stamp of 0 means "unknown" and is not
//! recorded.

use weir_core::SinkContext;

/// Most runs kept per epoch: 4 Ki runs of 16 bytes, 64 KiB, and as many
/// histogram updates at commit (64 Ki were 1 MiB and over a millisecond of
/// the worker's time per commit of a one-second epoch).
pub(crate) const MAX_RUNS: usize = 1 << 12;

/// The first resolution used when an epoch overflows [`MAX_RUNS`]: 1 µs.
const FIRST_RESOLUTION_NS: u64 = 1_000;

/// Emission stamps of one epoch, as runs `(stamp, count)`.
#[derive(Debug, Default)]
pub(crate) struct StampRuns {
    /// Runs in arrival order; a run's stamp is its first record's.
    runs: Vec<(u64, u64)>,
    /// Stamps within this many ns of a run's stamp join the run (0: equal only).
    resolution: u64,
}

impl StampRuns {
    /// Notes one record emitted at `stamp`.
    #[inline]
    pub(crate) fn push(&mut self, stamp: u64) {
        if stamp == 0 {
            return;
        }
        if let Some(last) = self.runs.last_mut() {
            if stamp.abs_diff(last.0) <= self.resolution {
                last.1 += 1;
                return;
            }
        }
        if self.runs.len() >= MAX_RUNS {
            self.coarsen();
        }
        self.runs.push((stamp, 1));
    }

    /// Notes `count` records emitted at `stamp` (a run of equal stamps).
    #[inline]
    pub(crate) fn push_n(&mut self, stamp: u64, count: u64) {
        if stamp == 0 || count == 0 {
            return;
        }
        if let Some(last) = self.runs.last_mut() {
            if stamp.abs_diff(last.0) <= self.resolution {
                last.1 += count;
                return;
            }
        }
        if self.runs.len() >= MAX_RUNS {
            self.coarsen();
        }
        self.runs.push((stamp, count));
    }

    /// Appends the latencies `(at_ns - stamp, count)` of these records,
    /// seen at `at_ns` (visible, for a transactional sink's thread).
    pub(crate) fn latencies_at(&self, at_ns: u64, out: &mut Vec<(u64, u64)>) {
        out.extend(self.runs.iter().map(|&(stamp, n)| (at_ns.saturating_sub(stamp), n)));
    }

    /// Doubles the resolution and merges runs that are now close enough.
    #[cold]
    fn coarsen(&mut self) {
        self.resolution = (self.resolution * 2).max(FIRST_RESOLUTION_NS);
        let mut kept = 0;
        for i in 0..self.runs.len() {
            let (stamp, count) = self.runs[i];
            if kept > 0 && stamp.abs_diff(self.runs[kept - 1].0) <= self.resolution {
                self.runs[kept - 1].1 += count;
            } else {
                self.runs[kept] = (stamp, count);
                kept += 1;
            }
        }
        self.runs.truncate(kept);
    }

    /// Records counted so far.
    #[cfg(test)]
    pub(crate) fn count(&self) -> u64 {
        self.runs.iter().map(|r| r.1).sum()
    }

    /// Forgets every stamp, keeping the allocation.
    pub(crate) fn clear(&mut self) {
        self.runs.clear();
        self.resolution = 0;
    }
}

/// Latency entries `(latency ns, count)` handed to the runtime per call of
/// a queue's `flush`: 128 histogram updates, 2-3 µs. A commit of a long
/// epoch brings tens of thousands of runs at once (a rated source stamps
/// every record differently); recording them all in one call stalled the
/// worker for a millisecond and more, so a queue drains over several turns.
/// Each call is a stall of the records that arrive meanwhile: with 1,024
/// per call (~20 µs), a two-phase sink at a 10 ms interval and 200,000
/// records/s took several such stalls per checkpoint, as its thread's
/// replies brought each epoch's ~2,000 arrival and visibility runs. The
/// worker asks a sink [`weir_core::Sink::ready`] every turn, so a queue
/// of a few thousand runs still drains within a few dozen turns.
pub(crate) const FLUSH_BUDGET: usize = 128;

/// Latencies measured away from a [`SinkContext`] (at a commit, on a
/// sink's own thread), waiting to be recorded; see [`FLUSH_BUDGET`].
#[derive(Debug, Default)]
struct Queue {
    /// `(latency ns, count)`; those before `next` are recorded.
    entries: Vec<(u64, u64)>,
    next: usize,
}

impl Queue {
    fn extend(&mut self, latencies: impl IntoIterator<Item = (u64, u64)>) {
        self.entries.extend(latencies);
    }

    fn is_empty(&self) -> bool {
        self.next == self.entries.len()
    }

    /// Hands at most `budget` entries to `record(shifted stamp, count)`:
    /// the runtime measures `now - emitted`, so the stamp is shifted to make
    /// that difference the measured latency.
    fn flush(
        &mut self,
        ctx: &mut SinkContext<'_>,
        budget: usize,
        mut record: impl FnMut(&mut SinkContext<'_>, u64, u64),
    ) {
        if self.is_empty() {
            return;
        }
        let now = ctx.now_ns();
        let end = self.entries.len().min(self.next.saturating_add(budget));
        for &(latency, n) in &self.entries[self.next..end] {
            record(ctx, now.saturating_sub(latency), n);
        }
        self.next = end;
        if self.is_empty() {
            self.entries.clear();
            self.next = 0;
        }
    }
}

/// Latencies of records that became visible, waiting for a [`SinkContext`].
#[derive(Debug, Default)]
pub(crate) struct Visible {
    queue: Queue,
}

impl Visible {
    /// The records of `runs` became visible at `visible_ns`.
    pub(crate) fn add(&mut self, runs: &StampRuns, visible_ns: u64) {
        self.queue.extend(
            runs.runs
                .iter()
                .map(|&(stamp, n)| (visible_ns.saturating_sub(stamp), n)),
        );
    }

    /// Latencies `(latency ns, count)` measured elsewhere (on a sink's own
    /// thread, when the records became visible).
    pub(crate) fn extend(&mut self, latencies: &[(u64, u64)]) {
        self.queue.extend(latencies.iter().copied());
    }

    /// Hands up to [`FLUSH_BUDGET`] pending latencies to the runtime, as
    /// visibility latency (all of them with `all`, at the end).
    pub(crate) fn flush(&mut self, ctx: &mut SinkContext<'_>) {
        self.queue.flush(ctx, FLUSH_BUDGET, |ctx, stamp, n| {
            ctx.record_visible_latency_n(stamp, n)
        });
    }

    /// Hands every pending latency to the runtime (at the end of input).
    pub(crate) fn flush_all(&mut self, ctx: &mut SinkContext<'_>) {
        self.queue
            .flush(ctx, usize::MAX, |ctx, stamp, n| ctx.record_visible_latency_n(stamp, n));
    }
}

/// Processing latencies measured off the worker, waiting for a
/// [`SinkContext`]: a sink whose emission stamps are read on its own thread
/// (the two-phase sink's target knows them) gets `(arrival - emission,
/// count)` runs back with the thread's reply and records them here, with
/// the same shift as [`Visible`].
#[derive(Debug, Default)]
pub(crate) struct Arrived {
    queue: Queue,
}

impl Arrived {
    /// Latencies `(latency ns, count)` measured at the records' arrival.
    pub(crate) fn extend(&mut self, latencies: &[(u64, u64)]) {
        self.queue.extend(latencies.iter().copied());
    }

    /// Hands up to [`FLUSH_BUDGET`] pending latencies to the runtime, as
    /// processing latency.
    pub(crate) fn flush(&mut self, ctx: &mut SinkContext<'_>) {
        self.queue
            .flush(ctx, FLUSH_BUDGET, |ctx, stamp, n| ctx.record_latency_n(stamp, n));
    }

    /// Hands every pending latency to the runtime (at the end of input).
    pub(crate) fn flush_all(&mut self, ctx: &mut SinkContext<'_>) {
        self.queue
            .flush(ctx, usize::MAX, |ctx, stamp, n| ctx.record_latency_n(stamp, n));
    }
}

/// Calls `each(stamp, count)` for every run of equal, known (non-zero)
/// emission stamps in `batch`: one histogram update per run, since sources
/// stamp whole batches with one clock reading.
#[inline]
pub(crate) fn runs<T>(batch: &[T], emitted_ns: impl Fn(&T) -> u64, mut each: impl FnMut(u64, u64)) {
    let mut run = (0u64, 0u64);
    for r in batch {
        let stamp = emitted_ns(r);
        if stamp != run.0 {
            if run.0 != 0 {
                each(run.0, run.1);
            }
            run = (stamp, 0);
        }
        run.1 += 1;
    }
    if run.0 != 0 {
        each(run.0, run.1);
    }
}

/// Records the processing latency of `batch`: emission to arrival at the
/// sink, now.
#[inline]
pub(crate) fn record_arrival<T>(ctx: &mut SinkContext<'_>, batch: &[T], emitted_ns: impl Fn(&T) -> u64) {
    runs(batch, emitted_ns, |stamp, n| ctx.record_latency_n(stamp, n));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_stamps_make_one_run_and_zero_is_ignored() {
        let mut s = StampRuns::default();
        for _ in 0..1000 {
            s.push(5);
        }
        s.push(0);
        s.push(7);
        assert_eq!(s.runs, vec![(5, 1000), (7, 1)]);
        assert_eq!(s.count(), 1001);
        let mut v = Visible::default();
        v.add(&s, 100);
        assert_eq!(v.queue.entries, vec![(95, 1000), (93, 1)]);
    }

    #[test]
    fn latencies_measured_elsewhere_are_shifted_into_the_histograms() {
        let mut s = StampRuns::default();
        s.push_n(5, 3);
        s.push_n(5, 2);
        s.push_n(0, 9);
        s.push_n(8, 1);
        assert_eq!(s.runs, vec![(5, 5), (8, 1)]);
        let mut out = Vec::new();
        s.latencies_at(20, &mut out);
        assert_eq!(out, vec![(15, 5), (12, 1)]);
        // A sink that hands them to the runtime at its next call.
        #[derive(Default)]
        struct Flush(Arrived, Visible);
        impl weir_core::Sink<u8> for Flush {
            fn write(&mut self, batch: &mut Vec<u8>, ctx: &mut SinkContext<'_>) -> Result<(), weir_core::BoxError> {
                batch.clear();
                self.0.flush(ctx);
                self.1.flush(ctx);
                Ok(())
            }
        }
        // The clock counts from its first reading: a latency can never
        // exceed the time since, so let 1 ms pass first.
        let _ = weir_core::clock::now_ns();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let mut sink = Flush::default();
        sink.0.extend(&[(1_000_000, 4)]);
        sink.1.extend(&out);
        let mut h = weir_core::harness::Harness::new(0, 1);
        h.write_sink(&mut sink, &mut vec![1]).unwrap();
        h.finish_sink(&mut sink).unwrap();
        let (arrival, visible) = (h.latency_ns(), h.visible_latency_ns());
        assert_eq!(arrival.len(), 4);
        assert!(arrival.equivalent(arrival.value_at_quantile(0.5), 1_000_000));
        assert_eq!(visible.len(), 6);
        assert!(
            visible.max() <= 15 && visible.min() >= 12,
            "{}..{}",
            visible.min(),
            visible.max()
        );
        assert!(sink.0.queue.is_empty() && sink.1.queue.is_empty());
    }

    /// A queue hands the runtime at most `FLUSH_BUDGET` entries per call (a
    /// bounded stall of the worker per turn), and calls drain it with
    /// nothing lost.
    #[test]
    fn a_flush_records_at_most_its_budget_and_turns_drain_the_queue() {
        struct Once(Arrived);
        impl weir_core::Sink<u8> for Once {
            fn write(&mut self, batch: &mut Vec<u8>, ctx: &mut SinkContext<'_>) -> Result<(), weir_core::BoxError> {
                batch.clear();
                self.0.flush(ctx);
                Ok(())
            }
        }
        let _ = weir_core::clock::now_ns();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let entries = 5 * FLUSH_BUDGET + 3;
        let mut sink = Once(Arrived::default());
        sink.0.extend(&vec![(1_000, 2); entries]);
        let mut h = weir_core::harness::Harness::new(0, 1);
        let mut turns = 0;
        while !sink.0.queue.is_empty() {
            let before = sink.0.queue.next;
            h.write_sink(&mut sink, &mut vec![1]).unwrap();
            assert!(sink.0.queue.is_empty() || sink.0.queue.next - before == FLUSH_BUDGET);
            turns += 1;
            assert!(turns <= entries, "the queue never drained");
        }
        assert_eq!(turns, entries.div_ceil(FLUSH_BUDGET));
        h.finish_sink(&mut sink).unwrap();
        assert_eq!(h.latency_ns().len(), 2 * entries as u64);
    }

    #[test]
    fn distinct_stamps_stay_bounded_and_counted() {
        let mut s = StampRuns::default();
        let n = 5 * MAX_RUNS as u64;
        for i in 0..n {
            s.push(1_000_000 + i * 100);
        }
        assert!(s.runs.len() <= MAX_RUNS, "{} runs", s.runs.len());
        assert_eq!(s.count(), n, "no record lost by merging");
        assert!(s.resolution <= 1_000 * 8, "resolution {} grew too far", s.resolution);
        s.clear();
        assert_eq!(s.count(), 0);
    }
}
