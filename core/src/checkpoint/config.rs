//! Checkpoint and restart settings, with their defaults and validation.
//!
//! Every setting is checked by [`CheckpointConfig::validate`] before a job
//! starts; a bad value is an [`crate::Error::InvalidConfig`] naming it.

use std::path::PathBuf;
use std::time::Duration;

use crate::{Error, Result};

/// How barriers are handled at tasks with several inputs, and so what the
/// job guarantees. Checkpointing off (no [`CheckpointConfig`]) is the fourth
/// choice: at-most-once, nothing is replayed after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CheckpointMode {
    /// Exactly-once: an input that delivered barrier `n` is not read again
    /// until barrier `n` arrived on every input; then the task snapshots.
    Aligned,
    /// Exactly-once without waiting: the first barrier `n` triggers the
    /// snapshot at once, overtaking queued records; the overtaken records
    /// are stored in the checkpoint (channel state) and replayed on recovery.
    Unaligned,
    /// At-least-once: inputs are never blocked; the task snapshots when
    /// barrier `n` arrived on every input. Records may be replayed twice.
    AtLeastOnce,
    /// Exactly-once by deduplication (MillWheel's way): inputs are never
    /// blocked, as at-least-once; each task records, per input channel, how
    /// many records it took past the barrier before its snapshot, and drops
    /// exactly those when its input is replayed. A task whose chain ends in
    /// a sink keeps the records it took since its last completed
    /// checkpoint (its upstream backup), so that when it fails it recovers
    /// alone: restored from that checkpoint, fed its backup again, while
    /// every other task runs on. See `docs/design/dedup.md`.
    Dedup,
}

impl CheckpointMode {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            CheckpointMode::Aligned => "aligned",
            CheckpointMode::Unaligned => "unaligned",
            CheckpointMode::AtLeastOnce => "at-least-once",
            CheckpointMode::Dedup => "dedup",
        }
    }

    /// True for the modes that promise exactly-once state.
    pub fn is_exactly_once(self) -> bool {
        !matches!(self, CheckpointMode::AtLeastOnce)
    }

    /// True when a task's snapshot holds its state exactly at the barrier
    /// (aligned, unaligned); false when its inputs went on past the barrier
    /// before it (at-least-once, dedup).
    pub fn snapshots_at_barrier(self) -> bool {
        matches!(self, CheckpointMode::Aligned | CheckpointMode::Unaligned)
    }
}

/// What to keep when a job is cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetainOnCancel {
    /// Keep the retained completed checkpoints, to resume later.
    Keep,
    /// Delete every checkpoint of the job.
    Delete,
}

/// Which checkpoint a starting job restores from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestoreFrom {
    /// The latest completed checkpoint in the directory, if any; a corrupt
    /// latest checkpoint is an error (never silently skipped).
    Latest,
    /// The latest completed checkpoint that verifies; older ones are used
    /// only when the user asks for it this way, because output committed
    /// from a newer checkpoint could then be produced again.
    LatestValid,
    /// Exactly this checkpoint.
    Id(u64),
    /// Start fresh, ignoring (but not deleting) existing checkpoints.
    Nothing,
}

/// Checkpoint settings of a job.
///
/// ```
/// use std::time::Duration;
/// use weir_core::{CheckpointConfig, CheckpointMode};
/// let cfg = CheckpointConfig {
///     interval: Duration::from_millis(100),
///     ..CheckpointConfig::new(CheckpointMode::Aligned, "/tmp/weir-ckpt")
/// };
/// assert!(cfg.validate().is_ok());
/// ```
#[derive(Debug, Clone)]
pub struct CheckpointConfig {
    /// Barrier handling.
    pub mode: CheckpointMode,
    /// Where checkpoints are stored (created if missing).
    pub dir: PathBuf,
    /// Time between two checkpoint triggers. Default 1 s.
    pub interval: Duration,
    /// A checkpoint not complete after this long is aborted. Default 60 s.
    pub timeout: Duration,
    /// Least time between the end of one checkpoint and the next trigger.
    /// Default 0.
    pub min_pause: Duration,
    /// Most checkpoints in flight at once. Default 1.
    pub max_concurrent: usize,
    /// Consecutive failed checkpoints tolerated; one more fails the job.
    /// Default 3.
    pub tolerable_failures: u32,
    /// Completed checkpoints kept on disk (the newest ones). Default 2.
    pub retained: usize,
    /// What cancel leaves behind. Default: keep.
    pub retain_on_cancel: RetainOnCancel,
    /// Aligned mode only: when alignment of checkpoint `n` has lasted this
    /// long since its trigger, the checkpoint switches to unaligned at that
    /// task. Default: never.
    pub alignment_timeout: Option<Duration>,
    /// Which checkpoint to start from. Default: the latest.
    pub restore: RestoreFrom,
    /// A task's checkpoint state of at most this many bytes goes into the
    /// manifest instead of a file of its own: one durable write per
    /// checkpoint instead of one per task. Memory-mapped stores whose full
    /// snapshots together fit are snapshotted whole, packed, on the task's
    /// thread at the barrier (see
    /// `docs/design/state.md#the-snapshot-protocol`) instead of
    /// incrementally into files. `0` puts every task state in a file and
    /// every store snapshot in `shared/`. Default 1 MiB
    /// ([`DEFAULT_INLINE_STATE_MAX`]); at most 16 MiB ([`MAX_INLINE_STATE`]).
    /// Such states are framed on the task's own thread at the barrier, so
    /// this also bounds that pause.
    pub inline_state_max: usize,
    /// Dedup mode only: the most bytes of records each task keeps in its
    /// upstream backup (what it took since its last completed checkpoint,
    /// encoded), which lets it recover alone. Past them the backup lets go
    /// of everything until the task's next snapshot; a failure of the task
    /// meanwhile restarts the whole job (still exactly-once). Default
    /// 64 MiB ([`DEFAULT_DEDUP_BACKUP_LIMIT`]).
    pub dedup_backup_limit: usize,
    /// Dedup mode only: the job's operators are deterministic, so a task
    /// that feeds another exchange (a keyed stage before a `key_by`, a stage
    /// before `rebalance` or `union`) may recover alone too: its
    /// replacement replays its backup and its exchange drops, per output
    /// channel, as many records as its predecessor had sent. That is exact
    /// only if the replay emits the same records in the same order as the
    /// failed run: operators must not depend on processing time
    /// (processing-time timers), randomness, or the iteration order of
    /// unordered maps in what they emit. A replay found to emit fewer
    /// records restarts the whole job, but one that emits different records
    /// is not caught. Off (the default), such a task's failure restarts the
    /// whole job, which is exact whatever the operators do; a task that
    /// ends in a sink recovers alone either way
    /// (docs/design/dedup.md, "A failed producer: its exchange drops what
    /// was sent").
    pub dedup_deterministic: bool,
}

/// Shortest accepted checkpoint interval: below it, barriers would be
/// injected more often than a worker turn.
pub const MIN_INTERVAL: Duration = Duration::from_millis(1);
/// Most checkpoints in flight at once: bounds memory for pending state.
pub const MAX_CONCURRENT: usize = 16;
/// Most completed checkpoints retained.
pub const MAX_RETAINED: usize = 1000;
/// Default [`CheckpointConfig::inline_state_max`]: 1 MiB, which takes the
/// 10,000-key benchmark's memory-mapped state (264 KB of pages per task)
/// whole at the barrier, packed to about 85 KB in about 0.3 ms.
pub const DEFAULT_INLINE_STATE_MAX: usize = 1 << 20;
/// Largest accepted [`CheckpointConfig::inline_state_max`]: 16 MiB, so that
/// manifests, read whole for retention and garbage collection, stay small.
pub const MAX_INLINE_STATE: usize = 16 << 20;
/// Default [`CheckpointConfig::dedup_backup_limit`]: 64 MiB, ten seconds of
/// the benchmark's 200,000 records/s at 32 bytes each.
pub const DEFAULT_DEDUP_BACKUP_LIMIT: usize = 64 << 20;

impl CheckpointConfig {
    /// Defaults for `mode`, storing into `dir`.
    pub fn new(mode: CheckpointMode, dir: impl Into<PathBuf>) -> Self {
        CheckpointConfig {
            mode,
            dir: dir.into(),
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(60),
            min_pause: Duration::ZERO,
            max_concurrent: 1,
            tolerable_failures: 3,
            retained: 2,
            retain_on_cancel: RetainOnCancel::Keep,
            alignment_timeout: None,
            restore: RestoreFrom::Latest,
            inline_state_max: DEFAULT_INLINE_STATE_MAX,
            dedup_backup_limit: DEFAULT_DEDUP_BACKUP_LIMIT,
            dedup_deterministic: false,
        }
    }

    /// Exactly-once checkpoints (aligned barriers) into `dir`, every other
    /// setting at its default: the usual choice, and the mode the sinks'
    /// exactly-once guarantee is written for.
    ///
    /// ```
    /// use weir_core::{CheckpointConfig, CheckpointMode};
    /// let c = CheckpointConfig::exactly_once("state/checkpoints");
    /// assert_eq!(c.mode, CheckpointMode::Aligned);
    /// ```
    pub fn exactly_once(dir: impl Into<PathBuf>) -> Self {
        Self::new(CheckpointMode::Aligned, dir)
    }

    /// Checks every setting.
    pub fn validate(&self) -> Result<()> {
        if self.interval < MIN_INTERVAL {
            return Err(Error::config(
                "checkpoint.interval",
                format!("{:?}", self.interval),
                "must be at least 1 ms",
            ));
        }
        if self.timeout < self.interval.min(Duration::from_millis(10)) {
            return Err(Error::config(
                "checkpoint.timeout",
                format!("{:?}", self.timeout),
                "must be at least 10 ms (or the interval, if smaller)",
            ));
        }
        if self.max_concurrent == 0 || self.max_concurrent > MAX_CONCURRENT {
            return Err(Error::config(
                "checkpoint.max_concurrent",
                self.max_concurrent,
                "must be between 1 and 16",
            ));
        }
        if self.retained == 0 || self.retained > MAX_RETAINED {
            return Err(Error::config(
                "checkpoint.retained",
                self.retained,
                "must be between 1 and 1000",
            ));
        }
        if self.inline_state_max > MAX_INLINE_STATE {
            return Err(Error::config(
                "checkpoint.inline_state_max",
                self.inline_state_max,
                "must be at most 16 MiB (16777216 bytes)",
            ));
        }
        if self.dedup_backup_limit < 4096 {
            return Err(Error::config(
                "checkpoint.dedup_backup_limit",
                self.dedup_backup_limit,
                "must be at least 4096 bytes",
            ));
        }
        if self.dir.as_os_str().is_empty() {
            return Err(Error::config("checkpoint.dir", "\"\"", "must name a directory"));
        }
        if let Some(t) = self.alignment_timeout {
            if t.is_zero() {
                return Err(Error::config(
                    "checkpoint.alignment_timeout",
                    "0",
                    "must be positive (use None for no timeout)",
                ));
            }
            if self.mode != CheckpointMode::Aligned {
                return Err(Error::config(
                    "checkpoint.alignment_timeout",
                    format!("{t:?}"),
                    "applies only to the aligned mode",
                ));
            }
        }
        Ok(())
    }
}

/// What the job does when a task fails.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum RestartStrategy {
    /// Fail the job at the first task failure.
    #[default]
    None,
    /// Restart after a fixed delay, at most `attempts` times in total.
    FixedDelay {
        /// Restarts allowed.
        attempts: u32,
        /// Wait before each restart.
        delay: Duration,
    },
    /// Restart after a delay that grows by `multiplier` each time, from
    /// `initial` up to `max`, at most `attempts` times in total.
    ExponentialBackoff {
        /// Restarts allowed.
        attempts: u32,
        /// First delay.
        initial: Duration,
        /// Largest delay.
        max: Duration,
        /// Growth factor, at least 1.
        multiplier: f64,
    },
}

impl RestartStrategy {
    /// The delay before restart number `attempt` (1-based), or `None` when
    /// no more restarts are allowed.
    pub fn delay(&self, attempt: u32) -> Option<Duration> {
        match *self {
            RestartStrategy::None => None,
            RestartStrategy::FixedDelay { attempts, delay } => (attempt <= attempts).then_some(delay),
            RestartStrategy::ExponentialBackoff {
                attempts,
                initial,
                max,
                multiplier,
            } => (attempt <= attempts).then(|| {
                let f = multiplier.max(1.0).powi(attempt.saturating_sub(1).min(64) as i32);
                initial.mul_f64(f.min(1e9)).min(max)
            }),
        }
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<()> {
        if let RestartStrategy::ExponentialBackoff {
            multiplier,
            initial,
            max,
            ..
        } = *self
        {
            if !(multiplier.is_finite() && multiplier >= 1.0) {
                return Err(Error::config("restart.multiplier", multiplier, "must be a number >= 1"));
            }
            if initial > max {
                return Err(Error::config(
                    "restart.initial",
                    format!("{initial:?}"),
                    "must not exceed restart.max",
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_bad_values_are_named() {
        let ok = CheckpointConfig::new(CheckpointMode::Unaligned, "/tmp/x");
        ok.validate().unwrap();
        let cases = [
            (
                CheckpointConfig {
                    interval: Duration::ZERO,
                    ..ok.clone()
                },
                "checkpoint.interval",
            ),
            (
                CheckpointConfig {
                    max_concurrent: 0,
                    ..ok.clone()
                },
                "checkpoint.max_concurrent",
            ),
            (
                CheckpointConfig {
                    retained: 0,
                    ..ok.clone()
                },
                "checkpoint.retained",
            ),
            (
                CheckpointConfig {
                    dir: PathBuf::new(),
                    ..ok.clone()
                },
                "checkpoint.dir",
            ),
            (
                CheckpointConfig {
                    alignment_timeout: Some(Duration::from_millis(5)),
                    ..ok.clone()
                },
                "checkpoint.alignment_timeout",
            ),
            (
                CheckpointConfig {
                    inline_state_max: MAX_INLINE_STATE + 1,
                    ..ok.clone()
                },
                "checkpoint.inline_state_max",
            ),
        ];
        for (cfg, name) in cases {
            let msg = cfg.validate().unwrap_err().to_string();
            assert!(msg.contains(name), "{msg}");
        }
    }

    #[test]
    fn restart_delays() {
        let fixed = RestartStrategy::FixedDelay {
            attempts: 2,
            delay: Duration::from_millis(5),
        };
        assert_eq!(fixed.delay(1), Some(Duration::from_millis(5)));
        assert_eq!(fixed.delay(3), None);
        let exp = RestartStrategy::ExponentialBackoff {
            attempts: 10,
            initial: Duration::from_millis(10),
            max: Duration::from_millis(50),
            multiplier: 2.0,
        };
        let d: Vec<_> = (1..=5).map(|a| exp.delay(a).unwrap().as_millis()).collect();
        assert_eq!(d, vec![10, 20, 40, 50, 50]);
        assert_eq!(RestartStrategy::None.delay(1), None);
        let bad = RestartStrategy::ExponentialBackoff {
            attempts: 1,
            initial: Duration::from_millis(1),
            max: Duration::from_millis(2),
            multiplier: 0.5,
        };
        assert!(bad.validate().is_err());
    }
}
