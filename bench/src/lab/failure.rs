//! What one failure costs: `weir bench --fail-at-record N` makes the keyed
//! operator panic once, on the record with sequence number `N`, and the
//! restart strategy restart the job from its latest checkpoint (the
//! snapshot modes' whole-job recovery). This module measures, from inside
//! the job and without a thread of its own:
//!
//! - the failure: when the keyed function panicked;
//! - the restart: when the restarted attempt's tasks were built (the job
//!   stopped every worker, restored the checkpoint and built the tasks
//!   again), seen as the sink factory's first call after the failure;
//! - recovery: when the keyed function ran again in the restarted attempt
//!   (the failed path processing again);
//! - catching up: the first batch at a sink, after the failure, whose first
//!   record was less than [`CAUGHT_UP_NS`] late against its schedule (open
//!   loop: the backlog of the stall worked off);
//! - the output gap of each sink subtask: its longest time without a batch;
//! - the records each sink subtask received twice: what it had received
//!   since the last completed checkpoint when its attempt failed (the
//!   restarted job replays them from the checkpoint).
//!
//! The sinks keep their count in checkpoints (the count sink's state), so
//! the run's output check stays exact through the restart in the
//! exactly-once modes; at-least-once delivers the replayed records twice,
//! and the check counts them as duplicates.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_utils::CachePadded;
use weir_core::clock;

/// A batch whose first record is less late than this (against its
/// schedule) means the job has caught up after the failure.
pub const CAUGHT_UP_NS: u64 = 1_000_000;

/// Most sink subtasks a failure run tracks (the keyed job's parallelism is
/// at most this in practice on one machine).
pub const MAX_SUBTASKS: usize = 64;

/// What a failure run shares between the keyed function, the sinks and the
/// report. Written at most a few times per batch and once per failure.
#[derive(Debug)]
pub struct FailureProbe {
    /// The record whose processing panics (once).
    pub at_record: u64,
    fired: AtomicBool,
    failed_ns: AtomicU64,
    rebuilt_ns: AtomicU64,
    resumed_ns: AtomicU64,
    caught_up_ns: AtomicU64,
    gap_ns: [AtomicU64; MAX_SUBTASKS],
    /// Each sink subtask's last batch, across attempts (a restarted
    /// attempt's sink is a new instance): one cache line each, as the
    /// subtasks write them from their own workers.
    last_batch_ns: [CachePadded<AtomicU64>; MAX_SUBTASKS],
    redone: [AtomicU64; MAX_SUBTASKS],
}

impl FailureProbe {
    /// A probe for a failure at record `at_record`.
    pub fn new(at_record: u64) -> Arc<Self> {
        Arc::new(FailureProbe {
            at_record,
            fired: AtomicBool::new(false),
            failed_ns: AtomicU64::new(0),
            rebuilt_ns: AtomicU64::new(0),
            resumed_ns: AtomicU64::new(0),
            caught_up_ns: AtomicU64::new(0),
            gap_ns: std::array::from_fn(|_| AtomicU64::new(0)),
            last_batch_ns: std::array::from_fn(|_| CachePadded::new(AtomicU64::new(0))),
            redone: std::array::from_fn(|_| AtomicU64::new(0)),
        })
    }

    /// Called by the keyed function for every record: panics on the chosen
    /// one the first time, and notes the first record the restarted
    /// attempt processes. (Records the other subtasks process between the
    /// panic and the job's stop belong to the failed attempt.)
    #[inline]
    pub fn on_record(&self, seq: u64) {
        if self.fired.load(Ordering::Relaxed) {
            if self.resumed_ns.load(Ordering::Relaxed) == 0 && self.rebuilt_ns.load(Ordering::Acquire) != 0 {
                self.mark_resumed();
            }
            return;
        }
        if seq == self.at_record {
            self.fail();
        }
    }

    #[cold]
    fn mark_resumed(&self) {
        let _ = self
            .resumed_ns
            .compare_exchange(0, clock::now_ns(), Ordering::Relaxed, Ordering::Relaxed);
    }

    #[cold]
    fn fail(&self) {
        if !self.fired.swap(true, Ordering::AcqRel) {
            self.failed_ns.store(clock::now_ns(), Ordering::Release);
            panic!(
                "injected failure at record {} (weir bench --fail-at-record)",
                self.at_record
            );
        }
    }

    /// The sink factory made a sink: after the failure, that is the
    /// restarted attempt being built (the failed one has stopped by then).
    pub fn on_sink_built(&self) {
        if self.failed_ns.load(Ordering::Acquire) != 0 && self.rebuilt_ns.load(Ordering::Relaxed) == 0 {
            let _ = self
                .rebuilt_ns
                .compare_exchange(0, clock::now_ns(), Ordering::AcqRel, Ordering::Relaxed);
        }
    }

    /// A batch arrived at sink subtask `subtask` at `now_ns`;
    /// `first_emitted_ns` is the schedule of its first record (0: unknown).
    #[inline]
    pub fn on_batch(&self, subtask: usize, now_ns: u64, first_emitted_ns: u64) {
        if subtask < MAX_SUBTASKS {
            let prev_ns = self.last_batch_ns[subtask].swap(now_ns, Ordering::Relaxed);
            if prev_ns != 0 {
                self.gap_ns[subtask].fetch_max(now_ns.saturating_sub(prev_ns), Ordering::Relaxed);
            }
        }
        let failed = self.failed_ns.load(Ordering::Relaxed);
        if failed != 0
            && first_emitted_ns != 0
            && now_ns > failed
            && self.caught_up_ns.load(Ordering::Relaxed) == 0
            && self.resumed_ns.load(Ordering::Relaxed) != 0
            && now_ns.saturating_sub(first_emitted_ns) < CAUGHT_UP_NS
        {
            let _ = self
                .caught_up_ns
                .compare_exchange(0, now_ns, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// A sink subtask's attempt ended without finishing, having received
    /// `records` since its last completed checkpoint.
    pub fn on_abandoned(&self, subtask: usize, records: u64) {
        if subtask < MAX_SUBTASKS {
            self.redone[subtask].fetch_add(records, Ordering::Relaxed);
        }
    }

    /// The figures, once the job has ended; `None` if the failure never
    /// happened (the record was never processed).
    pub fn report(&self, subtasks: usize) -> Option<FailureReport> {
        let failed = self.failed_ns.load(Ordering::Acquire);
        if failed == 0 {
            return None;
        }
        let since = |t: u64| (t > failed).then(|| (t - failed) as f64 / 1e6);
        let n = subtasks.min(MAX_SUBTASKS);
        Some(FailureReport {
            at_record: self.at_record,
            restarted_ms: since(self.rebuilt_ns.load(Ordering::Relaxed)),
            processing_again_ms: since(self.resumed_ns.load(Ordering::Relaxed)),
            caught_up_ms: since(self.caught_up_ns.load(Ordering::Relaxed)),
            longest_gap_ms: (0..n)
                .map(|i| self.gap_ns[i].load(Ordering::Relaxed) as f64 / 1e6)
                .collect(),
            reprocessed: (0..n).map(|i| self.redone[i].load(Ordering::Relaxed)).collect(),
        })
    }
}

/// What one failure cost, as `weir bench` prints it and writes in JSON.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FailureReport {
    /// The record whose processing panicked.
    pub at_record: u64,
    /// From the panic to the restarted attempt's tasks built (ms): the
    /// panic's unwinding (and its message), every worker stopped, the
    /// checkpoint restored.
    pub restarted_ms: Option<f64>,
    /// From the panic to the keyed function running again (ms).
    pub processing_again_ms: Option<f64>,
    /// From the panic to the first batch at a sink less than
    /// [`CAUGHT_UP_NS`] late (ms); `None` in closed loop (no schedule) or
    /// if the run ended first.
    pub caught_up_ms: Option<f64>,
    /// Per sink subtask: its longest time without a batch (ms).
    pub longest_gap_ms: Vec<f64>,
    /// Per sink subtask: records it received again after the restart
    /// (received since its last completed checkpoint when it failed).
    pub reprocessed: Vec<u64>,
}

impl FailureReport {
    /// One line for the text report.
    pub fn line(&self) -> String {
        let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1} ms"));
        let gaps: Vec<String> = self.longest_gap_ms.iter().map(|g| format!("{g:.1}")).collect();
        let redo: Vec<String> = self.reprocessed.iter().map(u64::to_string).collect();
        format!(
            "failure at record {}: restarted after {}, processing again after {}, caught up (< {} ms \
             late) after {}; longest output gap per sink subtask [{}] ms; records reprocessed per sink \
             subtask [{}]",
            self.at_record,
            ms(self.restarted_ms),
            ms(self.processing_again_ms),
            CAUGHT_UP_NS / 1_000_000,
            ms(self.caught_up_ms),
            gaps.join(", "),
            redo.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chosen_record_panics_once_and_the_next_one_marks_the_resume() {
        let p = FailureProbe::new(5);
        for seq in 0..5 {
            p.on_record(seq);
        }
        let panicked = std::panic::catch_unwind(|| p.on_record(5));
        assert!(panicked.is_err(), "record 5 panics");
        // Another subtask of the failed attempt goes on for a while: no resume.
        p.on_record(6);
        assert!(p.report(1).unwrap().processing_again_ms.is_none(), "not resumed yet");
        p.on_sink_built();
        // The replay passes record 5 again: no second panic.
        p.on_record(3);
        p.on_record(5);
        let r = p.report(1).unwrap();
        assert!(r.restarted_ms.is_some() && r.processing_again_ms.is_some());
    }

    #[test]
    fn gaps_and_catching_up_are_measured_per_subtask() {
        let p = FailureProbe::new(0);
        p.on_batch(0, 1_000, 900);
        p.on_batch(0, 3_000, 2_900);
        p.on_batch(1, 10, 5);
        p.on_batch(1, 5_010, 5_000);
        let _ = std::panic::catch_unwind(|| p.on_record(0));
        p.on_sink_built();
        p.on_record(1);
        let failed = p.failed_ns.load(Ordering::Relaxed);
        // Late by 2 ms: not caught up; then on time. Subtask 0's gap spans
        // the restart: from its batch at 3,000 ns to the next one.
        p.on_batch(0, failed + 10, failed + 10 - 2 * CAUGHT_UP_NS);
        p.on_batch(0, failed + 20, failed + 19);
        p.on_abandoned(1, 42);
        let r = p.report(2).unwrap();
        assert_eq!(r.caught_up_ms, Some(20.0 / 1e6));
        assert_eq!(r.reprocessed, vec![0, 42]);
        assert_eq!(r.longest_gap_ms[0], (failed + 10 - 3_000) as f64 / 1e6);
        assert_eq!(r.longest_gap_ms[1], 5_000.0 / 1e6);
    }

    #[test]
    fn no_report_without_a_failure() {
        let p = FailureProbe::new(7);
        p.on_record(1);
        assert_eq!(p.report(2), None);
    }
}
