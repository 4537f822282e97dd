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
//!   restarted job replays them from the checkpoint);
//! - with a real sink, visible output (through the sink's
//!   [`weir_core::SinkContext::tap_visible`]): each sink subtask's time
//!   without newly visible output across the failure, and when visible
//!   latency was back within its largest of the [`VISIBLE_LEVEL_MS`]
//!   before the failure.
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

/// The timeline's resolution: records per sink subtask per millisecond.
pub const BUCKET_NS: u64 = 1_000_000;

/// Most milliseconds the timeline covers (from the probe's creation): ten
/// minutes, 8 bytes per subtask and millisecond.
pub const MAX_TIMELINE_MS: usize = 600_000;

/// The window on each side of the failure over which each sink subtask's
/// rate is compared (after / before).
pub const RATE_WINDOW_MS: u64 = 20;

/// The window before the failure whose largest visible latency is the
/// level that visible output must be back within.
pub const VISIBLE_LEVEL_MS: u64 = 200;

/// The margin over that level within which visible latency counts as
/// back: a tenth of the level, at least 1 ms (an exactly-once sink's
/// visible latency is the checkpoint's, the same few ms at every commit
/// give or take its fsyncs' jitter: without a margin, "back" would be
/// decided by tenths of a millisecond).
pub fn visible_margin_ns(level_ns: u64) -> u64 {
    (level_ns / 10).max(1_000_000)
}

/// How long visible latency must stay within that level for visible
/// output to count as back.
pub const VISIBLE_STEADY_MS: u64 = 100;

/// How long after the failure visible output may take to be back before
/// the run reports that it was not.
pub const VISIBLE_HORIZON_MS: u64 = 1_000;

/// What a failure run shares between the keyed function, the sinks and the
/// report. Written at most a few times per batch and once per failure.
#[derive(Debug)]
pub struct FailureProbe {
    /// The record whose processing panics (once).
    pub at_record: u64,
    /// The keyed stage whose function panics (1: the first; a job with
    /// fewer stages fails in its last).
    pub stage: usize,
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
    /// Start of the timeline (clock ns).
    start_ns: u64,
    /// Per sink subtask, records received per millisecond since `start_ns`.
    timeline: Vec<Box<[AtomicU64]>>,
    /// Records made visible per millisecond since `start_ns`, all subtasks.
    visible: Box<[AtomicU64]>,
    /// The largest visible latency (ns) of the records made visible in
    /// each millisecond.
    visible_max_ns: Box<[AtomicU64]>,
    /// Each sink subtask's last visibility (clock ns, 0: none yet).
    last_visible_ns: [CachePadded<AtomicU64>; MAX_SUBTASKS],
    /// Each sink subtask's time without visible output across the failure
    /// (ns, 0: not measured yet).
    visible_gap_ns: [AtomicU64; MAX_SUBTASKS],
    /// Each sink subtask's first visibility after the failure (clock ns,
    /// 0: none yet).
    visible_again_ns: [AtomicU64; MAX_SUBTASKS],
}

impl FailureProbe {
    /// A probe for a failure at record `at_record` in the first keyed
    /// stage, with a timeline of `subtasks` sink subtasks over `ms`
    /// milliseconds (both capped).
    pub fn new(at_record: u64, subtasks: usize, ms: usize) -> Arc<Self> {
        Self::in_stage(at_record, 1, subtasks, ms)
    }

    /// [`Self::new`], the failure in keyed stage `stage` (from 1).
    pub fn in_stage(at_record: u64, stage: usize, subtasks: usize, ms: usize) -> Arc<Self> {
        let ms = ms.min(MAX_TIMELINE_MS);
        Arc::new(FailureProbe {
            stage: stage.max(1),
            start_ns: clock::now_ns(),
            timeline: (0..subtasks.min(MAX_SUBTASKS))
                .map(|_| (0..ms).map(|_| AtomicU64::new(0)).collect())
                .collect(),
            visible: (0..ms).map(|_| AtomicU64::new(0)).collect(),
            visible_max_ns: (0..ms).map(|_| AtomicU64::new(0)).collect(),
            last_visible_ns: std::array::from_fn(|_| CachePadded::new(AtomicU64::new(0))),
            visible_gap_ns: std::array::from_fn(|_| AtomicU64::new(0)),
            visible_again_ns: std::array::from_fn(|_| AtomicU64::new(0)),
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

    /// The millisecond bucket of clock time `ns` (since the probe's start).
    fn bucket(&self, ns: u64) -> usize {
        (ns.saturating_sub(self.start_ns) / BUCKET_NS) as usize
    }

    /// The buckets of a timeline of `len` around the failure at
    /// `failed_ns`, from 50 ms before to 150 ms after (those that exist),
    /// with their offset from the failure's in ms.
    fn around(&self, failed_ns: u64, len: usize) -> impl Iterator<Item = (i64, usize)> {
        let at = self.bucket(failed_ns) as i64;
        (at - 50..at + 150)
            .filter(move |&b| b >= 0 && (b as usize) < len)
            .map(move |b| (b - at, b as usize))
    }

    /// Called by the keyed function for every record: panics on the chosen
    /// one the first time, and notes the first record processed after the
    /// rebuild (by any subtask: [`FailingFn`] tells a rebuilt subtask's
    /// records from those of the subtasks that kept running).
    #[cfg(test)]
    pub fn on_record(&self, seq: u64) {
        self.on_record_from(seq, self.rebuilt_ns.load(Ordering::Acquire) != 0);
    }

    /// [`Self::on_record`] from an instance that was (`rebuilt`) or was not
    /// built after the failure.
    #[inline]
    fn on_record_from(&self, seq: u64, rebuilt: bool) {
        if self.fired.load(Ordering::Relaxed) {
            if rebuilt && self.resumed_ns.load(Ordering::Relaxed) == 0 {
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

    /// The failing stage's function was cloned for a subtask being built:
    /// after the failure, that is the failed subtask's replacement (dedup)
    /// or the restarted attempt; true then.
    fn on_stage_built(&self) -> bool {
        if self.failed_ns.load(Ordering::Acquire) == 0 {
            return false;
        }
        self.on_sink_built();
        true
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

    /// A batch of `records` arrived at sink subtask `subtask` at `now_ns`;
    /// `first_emitted_ns` is the schedule of its first record (0: unknown).
    #[inline]
    pub fn on_batch(&self, subtask: usize, now_ns: u64, first_emitted_ns: u64, records: u64) {
        if let Some(line) = self.timeline.get(subtask) {
            let bucket = self.bucket(now_ns);
            if let Some(b) = line.get(bucket) {
                b.fetch_add(records, Ordering::Relaxed);
            }
        }
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

    /// `records` stamped `emitted_ns` became visible at sink subtask
    /// `subtask` at `now_ns` (the sink's [`weir_core::SinkContext::tap_visible`]).
    #[inline]
    pub fn on_visible(&self, subtask: usize, now_ns: u64, emitted_ns: u64, records: u64) {
        if emitted_ns == 0 {
            // The warm-up: not measured.
            return;
        }
        let bucket = self.bucket(now_ns);
        if let (Some(n), Some(max)) = (self.visible.get(bucket), self.visible_max_ns.get(bucket)) {
            n.fetch_add(records, Ordering::Relaxed);
            max.fetch_max(now_ns.saturating_sub(emitted_ns), Ordering::Relaxed);
        }
        if subtask < MAX_SUBTASKS {
            let prev = self.last_visible_ns[subtask].swap(now_ns, Ordering::Relaxed);
            let failed = self.failed_ns.load(Ordering::Relaxed);
            // The first visibility after the failure closes the gap that
            // spans it.
            if failed != 0 && prev != 0 && prev <= failed && now_ns > failed {
                self.visible_gap_ns[subtask].store(now_ns - prev, Ordering::Relaxed);
                self.visible_again_ns[subtask].store(now_ns, Ordering::Relaxed);
            }
        }
    }

    /// The visible-output figures around the failure at `failed_ns`: the
    /// level (the largest visible latency in the [`VISIBLE_LEVEL_MS`]
    /// before it, ns) and the time from the failure until visible latency
    /// was back within it and its [`visible_margin_ns`] (ns): the start of the first
    /// [`VISIBLE_STEADY_MS`] window, after the first visibility after the
    /// failure, in which no record became visible later than the level.
    /// (A later spike, after such a window, is the machine's, not the
    /// recovery's.) The time is `None` if no such window starts within
    /// [`VISIBLE_HORIZON_MS`]; both are `None` without visible output
    /// before and after.
    fn visible_back(&self, failed_ns: u64, subtasks: usize) -> Option<(u64, Option<u64>)> {
        let at = self.bucket(failed_ns);
        let max = |b: usize| self.visible_max_ns.get(b).map_or(0, |m| m.load(Ordering::Relaxed));
        let level = (at.saturating_sub(VISIBLE_LEVEL_MS as usize)..at)
            .map(max)
            .max()
            .filter(|&l| l > 0)?;
        let first_after = (0..subtasks.min(MAX_SUBTASKS))
            .map(|i| self.visible_again_ns[i].load(Ordering::Relaxed))
            .filter(|&t| t != 0)
            .min()?;
        let from = self.bucket(first_after);
        let steady = VISIBLE_STEADY_MS as usize;
        let within = level + visible_margin_ns(level);
        let back = (from..at + VISIBLE_HORIZON_MS as usize)
            .take_while(|&b| b + steady <= self.visible_max_ns.len())
            .find(|&b| (b..b + steady).all(|w| max(w) <= within))
            .map(|b| (self.start_ns + b as u64 * BUCKET_NS).max(first_after) - failed_ns);
        Some((level, back))
    }

    /// Marks the failure as happening now (tests of what reads the probe).
    #[cfg(test)]
    pub(crate) fn fail_now_for_test(&self) {
        self.failed_ns.store(clock::now_ns(), Ordering::Release);
    }

    /// Every record made visible within the timeline (tests).
    #[cfg(test)]
    pub(crate) fn visible_total_for_test(&self) -> u64 {
        self.visible.iter().map(|n| n.load(Ordering::Relaxed)).sum()
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
            rate_after_before: (0..n).map(|i| self.rate_ratio(i, failed)).collect(),
            timeline: self.timeline_around(failed),
            visible: self.visible_report(failed, n),
            output: None,
        })
    }

    /// The visible-output figures, if any record became visible.
    fn visible_report(&self, failed_ns: u64, subtasks: usize) -> Option<VisibleReport> {
        if self.visible.iter().all(|n| n.load(Ordering::Relaxed) == 0) {
            return None;
        }
        let ms = |ns: u64| ns as f64 / 1e6;
        let back = self.visible_back(failed_ns, subtasks);
        Some(VisibleReport {
            gap_ms: (0..subtasks)
                .map(|i| {
                    let g = self.visible_gap_ns[i].load(Ordering::Relaxed);
                    (g != 0).then(|| ms(g))
                })
                .collect(),
            level_ms: back.map(|(level, _)| ms(level)),
            back_ms: back.and_then(|(_, t)| t.map(ms)),
            timeline: self
                .around(failed_ns, self.visible.len())
                .map(|(d, i)| {
                    (
                        d,
                        self.visible[i].load(Ordering::Relaxed),
                        ms(self.visible_max_ns[i].load(Ordering::Relaxed)),
                    )
                })
                .collect(),
        })
    }

    /// Sink subtask `i`'s records in the [`RATE_WINDOW_MS`] after the
    /// failure over those in the window before it; `None` without a
    /// timeline or without records before.
    fn rate_ratio(&self, i: usize, failed_ns: u64) -> Option<f64> {
        let line = self.timeline.get(i)?;
        let at = self.bucket(failed_ns);
        let w = RATE_WINDOW_MS as usize;
        let sum = |from: usize, to: usize| -> u64 {
            line.get(from..to.min(line.len()))
                .map_or(0, |s| s.iter().map(|b| b.load(Ordering::Relaxed)).sum())
        };
        let before = sum(at.checked_sub(w)?, at);
        (before > 0).then(|| sum(at, at + w) as f64 / before as f64)
    }

    /// Records per sink subtask per millisecond, from 50 ms before the
    /// failure to 150 ms after it (`[ms from the failure, per subtask...]`).
    fn timeline_around(&self, failed_ns: u64) -> Vec<(i64, Vec<u64>)> {
        let Some(len) = self.timeline.first().map(|l| l.len()) else {
            return Vec::new();
        };
        self.around(failed_ns, len)
            .map(|(d, b)| (d, self.timeline.iter().map(|l| l[b].load(Ordering::Relaxed)).collect()))
            .collect()
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
    /// Per sink subtask: records received in the [`RATE_WINDOW_MS`] after
    /// the failure over those in the window before it (1.0: undisturbed).
    pub rate_after_before: Vec<Option<f64>>,
    /// Records per sink subtask per millisecond around the failure:
    /// `(ms from the failure, [records per subtask])`.
    pub timeline: Vec<(i64, Vec<u64>)>,
    /// Visible output through the failure; `None` with the counting sink
    /// (nothing becomes visible).
    pub visible: Option<VisibleReport>,
    /// What the sinks' files hold, when checked (`weir compare`'s failure
    /// runs).
    pub output: Option<OutputCheck>,
}

/// Visible output through a failure (a sink that makes records visible:
/// the file, WAL, two-phase and Kafka sinks).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct VisibleReport {
    /// Per sink subtask: from its last visibility before the failure to its
    /// first after it (ms); `None` if it had none on one side.
    pub gap_ms: Vec<Option<f64>>,
    /// The largest visible latency in the [`VISIBLE_LEVEL_MS`] before the
    /// failure (ms).
    pub level_ms: Option<f64>,
    /// From the failure until visible latency was back within that level
    /// for [`VISIBLE_STEADY_MS`] (ms; `None`: not within
    /// [`VISIBLE_HORIZON_MS`]).
    pub back_ms: Option<f64>,
    /// Around the failure, per millisecond: `(ms from the failure, records
    /// made visible, the largest visible latency among them in ms)`.
    pub timeline: Vec<(i64, u64, f64)>,
}

impl VisibleReport {
    /// The gaps per sink subtask, joined by `sep`.
    pub fn gaps(&self, sep: &str) -> String {
        self.gap_ms
            .iter()
            .map(|g| g.map_or("-".to_string(), |g| format!("{g:.1}")))
            .collect::<Vec<_>>()
            .join(sep)
    }
}

/// What a failure run's sinks left in their files: every line's record
/// sequence number (the third field of `key,value,seq`), against the
/// records the run made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct OutputCheck {
    /// Lines in the files.
    pub lines: u64,
    /// Records made but in no line.
    pub missing: u64,
    /// Lines whose record an earlier line already holds.
    pub duplicated: u64,
}

impl OutputCheck {
    /// Reads every committed file in `dir` (the sinks' target folder:
    /// `part-*` files of `key,value,seq` lines) against records `0..events`. An
    /// unreadable file, a line without a sequence number or one of no
    /// record made is an error naming the file and the line.
    pub fn of_files(dir: &std::path::Path, events: u64) -> Result<OutputCheck, String> {
        let mut seen = vec![0u64; events.div_ceil(64) as usize];
        let (mut lines, mut duplicated) = (0u64, 0u64);
        // Hidden files are a sink's work in progress, not its output.
        let files = weir_io::committed_files(dir).map_err(|e| e.to_string())?;
        for path in files {
            let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            for (n, line) in text.lines().enumerate() {
                let seq = line
                    .rsplit(',')
                    .next()
                    .and_then(|f| f.parse::<u64>().ok())
                    .filter(|&s| s < events)
                    .ok_or_else(|| {
                        format!(
                            "{} line {}: {line:?} holds no record of the run's {events}",
                            path.display(),
                            n + 1
                        )
                    })?;
                let (word, bit) = ((seq / 64) as usize, 1u64 << (seq % 64));
                if seen[word] & bit != 0 {
                    duplicated += 1;
                }
                seen[word] |= bit;
                lines += 1;
            }
        }
        let present: u64 = seen.iter().map(|w| u64::from(w.count_ones())).sum();
        Ok(OutputCheck {
            lines,
            missing: events - present,
            duplicated,
        })
    }
}

/// A duration in ms for the failure figures, `-` when unknown.
pub fn ms_text(v: Option<f64>) -> String {
    v.map_or("-".to_string(), |v| format!("{v:.1} ms"))
}

/// A rate ratio as a percentage, `-` when unknown.
pub fn rate_text(r: Option<f64>) -> String {
    r.map_or("-".to_string(), |r| format!("{:.0}%", r * 100.0))
}

impl FailureReport {
    /// The per-sink-subtask figures, each list joined by `sep`: longest
    /// gaps (ms), records reprocessed, rates after/before.
    pub fn per_subtask(&self, sep: &str) -> [String; 3] {
        let join = |v: Vec<String>| v.join(sep);
        [
            join(self.longest_gap_ms.iter().map(|g| format!("{g:.1}")).collect()),
            join(self.reprocessed.iter().map(u64::to_string).collect()),
            join(self.rate_after_before.iter().copied().map(rate_text).collect()),
        ]
    }

    /// One line for the text report.
    pub fn line(&self) -> String {
        let [gaps, redo, rates] = self.per_subtask(", ");
        let visible = self.visible.as_ref().map_or(String::new(), |v| {
            format!(
                "; no newly visible output per sink subtask for [{}] ms across the failure; visible latency \
                 back within {} (its largest in the {} ms before, give or take 10%, at least 1 ms) for {} ms \
                 from {} after the failure",
                v.gaps(", "),
                ms_text(v.level_ms),
                VISIBLE_LEVEL_MS,
                VISIBLE_STEADY_MS,
                ms_text(v.back_ms)
            )
        });
        let line = format!(
            "failure at record {}: restarted after {}, processing again after {}, caught up (< {} ms \
             late) after {}; longest output gap per sink subtask [{}] ms; records reprocessed per sink \
             subtask [{}]; rate in the {} ms after the failure against the {} ms before, per sink subtask [{}]",
            self.at_record,
            ms_text(self.restarted_ms),
            ms_text(self.processing_again_ms),
            CAUGHT_UP_NS / 1_000_000,
            ms_text(self.caught_up_ms),
            gaps,
            redo,
            RATE_WINDOW_MS,
            RATE_WINDOW_MS,
            rates
        );
        let output = self.output.map_or(String::new(), |o| {
            format!(
                "; the sink's files hold {} lines: {} records missing, {} written twice",
                o.lines, o.missing, o.duplicated
            )
        });
        line + &visible + &output
    }
}

/// One instance of the failing keyed function's hold on the probe.
///
/// The runtime clones a keyed function for every subtask it builds, at
/// every build: a clone made after the failure belongs to a rebuilt
/// subtask (the failed one's replacement under dedup, every subtask of the
/// restarted job in the snapshot modes), and its first record marks the
/// failed path processing again. Under dedup the subtasks that kept
/// running never mark it: they were built before the failure.
#[derive(Debug)]
pub struct FailingFn {
    probe: Arc<FailureProbe>,
    rebuilt: bool,
}

impl FailingFn {
    /// The handle the job's function is built with (before any failure).
    pub fn new(probe: Arc<FailureProbe>) -> Self {
        FailingFn { probe, rebuilt: false }
    }

    /// Called by the keyed function for every record (see
    /// [`FailureProbe::on_record`]).
    #[inline]
    pub fn on_record(&self, seq: u64) {
        self.probe.on_record_from(seq, self.rebuilt);
    }
}

impl Clone for FailingFn {
    fn clone(&self) -> Self {
        FailingFn {
            probe: self.probe.clone(),
            rebuilt: self.probe.on_stage_built(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Under dedup only the failed subtask is built again: records of the
    /// subtasks that kept running (instances made before the failure) do
    /// not count as the failed path processing again; the replacement's
    /// first does, and its building marks the restart.
    #[test]
    fn only_an_instance_built_after_the_failure_marks_the_resume() {
        let p = FailureProbe::new(5, 2, 10);
        let plan = FailingFn::new(p.clone());
        let healthy = plan.clone();
        let failing = plan.clone();
        assert!(!healthy.rebuilt && !failing.rebuilt);
        let panicked = std::panic::catch_unwind(|| failing.on_record(5));
        assert!(panicked.is_err(), "record 5 panics");
        healthy.on_record(6);
        assert!(p.report(2).unwrap().restarted_ms.is_none(), "nothing rebuilt yet");
        assert!(
            p.report(2).unwrap().processing_again_ms.is_none(),
            "the healthy subtask is not the failed path"
        );
        let replacement = plan.clone();
        assert!(replacement.rebuilt);
        healthy.on_record(7);
        assert!(p.report(2).unwrap().processing_again_ms.is_none());
        replacement.on_record(3);
        let r = p.report(2).unwrap();
        assert!(r.restarted_ms.is_some() && r.processing_again_ms.is_some());
    }

    #[test]
    fn the_chosen_record_panics_once_and_the_next_one_marks_the_resume() {
        let p = FailureProbe::new(5, 1, 10);
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
        let p = FailureProbe::new(0, 2, 10);
        p.on_batch(0, 1_000, 900, 1);
        p.on_batch(0, 3_000, 2_900, 1);
        p.on_batch(1, 10, 5, 1);
        p.on_batch(1, 5_010, 5_000, 1);
        let _ = std::panic::catch_unwind(|| p.on_record(0));
        p.on_sink_built();
        p.on_record(1);
        let failed = p.failed_ns.load(Ordering::Relaxed);
        // Late by 2 ms: not caught up; then on time. Subtask 0's gap spans
        // the restart: from its batch at 3,000 ns to the next one. (The
        // clock may count from the process's start: within 2 ms of it the
        // first batch's schedule is unknown, 0, and does not count either.)
        p.on_batch(0, failed + 10, (failed + 10).saturating_sub(2 * CAUGHT_UP_NS), 1);
        p.on_batch(0, failed + 20, failed + 19, 1);
        p.on_abandoned(1, 42);
        let r = p.report(2).unwrap();
        assert_eq!(r.caught_up_ms, Some(20.0 / 1e6));
        assert_eq!(r.reprocessed, vec![0, 42]);
        assert_eq!(r.longest_gap_ms[0], (failed + 10 - 3_000) as f64 / 1e6);
        assert_eq!(r.longest_gap_ms[1], 5_000.0 / 1e6);
    }

    #[test]
    fn each_subtask_s_rate_after_the_failure_is_compared_with_before() {
        let p = FailureProbe::new(u64::MAX, 2, 100);
        let t0 = p.start_ns;
        // Subtask 0: 10 records per ms throughout; subtask 1: 10 per ms
        // before the failure at 50 ms, 5 per ms after.
        for ms in 0..90u64 {
            p.on_batch(0, t0 + ms * BUCKET_NS, 0, 10);
            p.on_batch(1, t0 + ms * BUCKET_NS, 0, if ms < 50 { 10 } else { 5 });
        }
        p.failed_ns.store(t0 + 50 * BUCKET_NS, Ordering::Relaxed);
        let r = p.report(2).unwrap();
        assert_eq!(r.rate_after_before, vec![Some(1.0), Some(0.5)]);
        assert_eq!(r.timeline.first().unwrap(), &(-50, vec![10, 10]));
        assert_eq!(r.timeline.iter().find(|(ms, _)| *ms == 0).unwrap().1, vec![10, 5]);
    }

    #[test]
    fn visible_output_s_gap_and_return_to_its_level_are_measured() {
        let p = FailureProbe::new(u64::MAX, 2, 1_000);
        let t0 = p.start_ns;
        let ms = |m: u64| t0 + m * BUCKET_NS;
        // Before the failure at 300 ms: subtask 0 visible every ms at 2 ms
        // late, subtask 1 at 5 ms late until 290 ms. Stamp 0 (warm-up)
        // records count for nothing.
        for m in 0..300 {
            p.on_visible(0, ms(m), ms(m) - 2 * BUCKET_NS, 1);
            if m < 290 {
                p.on_visible(1, ms(m), ms(m) - 5 * BUCKET_NS, 1);
            }
        }
        p.on_visible(0, ms(299), 0, 1_000);
        p.failed_ns.store(ms(300), Ordering::Relaxed);
        // After: subtask 0 again at 340 ms, 40 ms late, then late 8 ms
        // until 400 ms, then 3 ms late; subtask 1 again at 350 ms.
        for m in 340..700 {
            let late = if m < 400 { 8 } else { 3 };
            p.on_visible(0, ms(m), ms(m) - late * BUCKET_NS, 1);
        }
        // 5.9 ms late at 450 ms: over the level, within its margin (1 ms).
        p.on_visible(0, ms(450), ms(450) - 5_900_000, 1);
        p.on_visible(1, ms(350), ms(350) - 4 * BUCKET_NS, 1);
        // A spike after 100 steady ms is the machine's, not the recovery's.
        p.on_visible(1, ms(600), ms(600) - 9 * BUCKET_NS, 1);
        let v = p.report(2).unwrap().visible.unwrap();
        assert_eq!(v.gap_ms, vec![Some(41.0), Some(61.0)]);
        assert_eq!(v.level_ms, Some(5.0));
        // From 400 ms on, 100 ms within 5 ms and its 1 ms margin.
        assert_eq!(v.back_ms, Some(100.0));
        assert_eq!(v.gaps("/"), "41.0/61.0");
        let at = |d: i64| v.timeline.iter().find(|(m, _, _)| *m == d).unwrap();
        assert_eq!(at(-1), &(-1, 1, 2.0), "the warm-up's records are not counted");
        assert_eq!(at(0), &(0, 0, 0.0));
        assert_eq!(at(40), &(40, 1, 8.0));
        assert!(p
            .report(2)
            .unwrap()
            .line()
            .contains("visible latency back within 5.0 ms"));
    }

    #[test]
    fn visible_output_needs_output_on_both_sides_of_the_failure() {
        let p = FailureProbe::new(u64::MAX, 1, 100);
        let t0 = p.start_ns;
        p.on_visible(0, t0 + 10 * BUCKET_NS, t0 + 9 * BUCKET_NS, 1);
        p.failed_ns.store(t0 + 20 * BUCKET_NS, Ordering::Relaxed);
        let v = p.report(1).unwrap().visible.unwrap();
        assert_eq!(v.gap_ms, vec![None]);
        assert_eq!((v.level_ms, v.back_ms), (None, None));
        assert!(p.report(1).unwrap().line().ends_with("from - after the failure"));
    }

    #[test]
    fn the_output_check_counts_missing_and_twice_written_records() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("part-0"), "1,10,0\n2,20,1\n3,30,3\n").unwrap();
        std::fs::write(dir.path().join("part-1"), "1,10,3\n5,50,4\n").unwrap();
        // A sink's work in progress is not output.
        std::fs::write(dir.path().join(".pending-2"), "9,9,2\n").unwrap();
        let c = OutputCheck::of_files(dir.path(), 6).unwrap();
        assert_eq!(
            c,
            OutputCheck {
                lines: 5,
                missing: 2,
                duplicated: 1
            }
        );
        // A line of no record the run made is named with its file and line.
        std::fs::write(dir.path().join("part-2"), "1,1,2\n7,70,6\n").unwrap();
        let e = OutputCheck::of_files(dir.path(), 6).unwrap_err();
        assert!(e.contains("part-2 line 2") && e.contains("7,70,6"), "{e}");
        std::fs::write(dir.path().join("part-2"), "garbage\n").unwrap();
        assert!(OutputCheck::of_files(dir.path(), 6)
            .unwrap_err()
            .contains("part-2 line 1"));
    }

    #[test]
    fn no_report_without_a_failure() {
        let p = FailureProbe::new(7, 2, 10);
        p.on_record(1);
        assert_eq!(p.report(2), None);
    }
}
