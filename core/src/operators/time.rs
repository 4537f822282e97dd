//! Event time: timestamps carried by the records themselves, and
//! watermarks, the runtime's statement that no record with a smaller or
//! equal timestamp will follow.
//!
//! Watermarks travel on the rings in order with data and barriers
//! ([`crate::runtime::message`]). A [`WatermarkStrategy`] placed after a source
//! ([`crate::Stream::assign_watermarks`]) generates them from the records'
//! timestamps with a bound on out-of-orderness. A task with several input
//! channels forwards the minimum over its channels, skipping the channels
//! marked idle and the ones that ended; end of a bounded input sends
//! [`MAX_WATERMARK`], so every window and timer fires before the final
//! checkpoint. `docs/guide/event-time.md` tells the whole story.
//!
//! Event time is part of checkpoints: a task with inputs stores the
//! watermark of each input at its snapshot (`InputEventTime`), unaligned
//! channel state keeps the watermarks between the in-flight records, and a
//! watermark generator stores its own progress. A restore
//! at the same parallelism therefore continues event time exactly where
//! the checkpoint left it: event-time operators get their watermark back
//! (`RestoreCtx::watermark`) without firing anything, and a record that
//! was late stays late. A chain restored at another parallelism, and
//! every task after an at-least-once checkpoint (its inputs went on past
//! the barrier, so their watermarks are not the barrier's), starts again
//! from [`MIN_WATERMARK`].

use serde::{Deserialize, Serialize};

use crate::checkpoint::snapshot::TaskSnapshot;
use crate::error::BoxError;
use crate::runtime::collector::{Collector, Notice, RestoreCtx};
use crate::runtime::context::TaskContext;
use crate::runtime::message::Barrier;

pub(crate) use crate::watermark::IDLE;
pub use crate::watermark::{MAX_WATERMARK, MIN_WATERMARK};

/// Upper bound on [`WatermarkStrategy::out_of_orderness_ms`]: one day.
pub const MAX_OUT_OF_ORDERNESS_MS: i64 = 86_400_000;

/// How a stream's timestamps and watermarks are made.
///
/// The watermark after records with largest timestamp `t` is
/// `t - out_of_orderness - 1`: records up to `out_of_orderness` ms older
/// than the newest one are still on time, and so are further records with
/// timestamp `t` itself.
///
/// ```
/// use weir_core::time::WatermarkStrategy;
/// // Records are (timestamp_ms, value); up to 50 ms out of order; a source
/// // that emits nothing for 2 s stops holding event time back.
/// let s = WatermarkStrategy::bounded(50, |r: &(i64, u64)| r.0).idle_after_ms(2_000);
/// assert_eq!(s.out_of_orderness_ms(), 50);
/// ```
#[derive(Clone)]
pub struct WatermarkStrategy<F> {
    timestamp: F,
    out_of_orderness_ms: i64,
    idle_after_ns: Option<u64>,
    period_ns: Option<u64>,
}

impl<F> WatermarkStrategy<F> {
    /// Timestamps by `timestamp` (epoch milliseconds), at most
    /// `out_of_orderness_ms` out of order; a watermark after every batch.
    pub fn bounded(out_of_orderness_ms: i64, timestamp: F) -> Self {
        WatermarkStrategy {
            timestamp,
            out_of_orderness_ms,
            idle_after_ns: None,
            period_ns: None,
        }
    }

    /// Timestamps that never decrease: [`WatermarkStrategy::bounded`] with 0.
    pub fn ascending(timestamp: F) -> Self {
        Self::bounded(0, timestamp)
    }

    /// Marks the source subtask idle once it emitted nothing for `ms`
    /// milliseconds: downstream tasks then compute their watermark without
    /// it, until it emits again.
    pub fn idle_after_ms(mut self, ms: u64) -> Self {
        self.idle_after_ns = Some(ms.saturating_mul(1_000_000));
        self
    }

    /// Emits watermarks at most every `ms` milliseconds instead of after
    /// every batch (fewer control messages at very high rates).
    pub fn periodic_ms(mut self, ms: u64) -> Self {
        self.period_ns = Some(ms.saturating_mul(1_000_000));
        self
    }

    /// The bound on out-of-orderness.
    pub fn out_of_orderness_ms(&self) -> i64 {
        self.out_of_orderness_ms
    }

    /// Checks the settings; the error says which one is wrong.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if !(0..=MAX_OUT_OF_ORDERNESS_MS).contains(&self.out_of_orderness_ms) {
            return Err(format!(
                "watermark strategy: out_of_orderness_ms = {} must be between 0 and {MAX_OUT_OF_ORDERNESS_MS}",
                self.out_of_orderness_ms
            ));
        }
        if self.idle_after_ns == Some(0) {
            return Err("watermark strategy: idle_after_ms must be at least 1".into());
        }
        if self.period_ns == Some(0) {
            return Err("watermark strategy: periodic_ms must be at least 1".into());
        }
        Ok(())
    }
}

/// The chained operator that generates watermarks.
pub(crate) struct WatermarkAssigner<F, T> {
    pub(crate) strategy: WatermarkStrategy<F>,
    pub(crate) max_ts: i64,
    pub(crate) emitted: i64,
    pub(crate) idle: bool,
    pub(crate) last_record_ns: u64,
    pub(crate) last_emit_ns: u64,
    pub(crate) next: Box<dyn Collector<T>>,
    pub(crate) op: usize,
}

impl<F, T> WatermarkAssigner<F, T> {
    pub(crate) fn new(strategy: WatermarkStrategy<F>, next: Box<dyn Collector<T>>, op: usize) -> Self {
        WatermarkAssigner {
            strategy,
            max_ts: i64::MIN,
            emitted: MIN_WATERMARK,
            idle: false,
            last_record_ns: 0,
            last_emit_ns: 0,
            next,
            op,
        }
    }

    fn current(&self) -> i64 {
        if self.max_ts == i64::MIN {
            return MIN_WATERMARK;
        }
        self.max_ts
            .saturating_sub(self.strategy.out_of_orderness_ms)
            .saturating_sub(1)
            .max(MIN_WATERMARK)
    }
}

impl<F, T> Collector<T> for WatermarkAssigner<F, T>
where
    F: Fn(&T) -> i64 + Send,
    T: Send,
{
    #[inline]
    fn collect(&mut self, batch: &mut Vec<T>, ctx: &mut TaskContext) -> Result<(), BoxError> {
        if batch.is_empty() {
            return Ok(());
        }
        ctx.current_op = self.op;
        let ts = &self.strategy.timestamp;
        let max = batch.iter().map(ts).fold(self.max_ts, i64::max);
        self.max_ts = max;
        let watch_time = self.strategy.idle_after_ns.is_some() || self.strategy.period_ns.is_some();
        let now = if watch_time { ctx.now_ns() } else { 0 };
        self.last_record_ns = now;
        let was_idle = std::mem::replace(&mut self.idle, false);
        if was_idle {
            // Active again: say so before these records, with the current
            // watermark (which may not have advanced).
            self.next.watermark(self.emitted, ctx)?;
        }
        self.next.collect(batch, ctx)?;
        let wm = self.current();
        let due = self
            .strategy
            .period_ns
            .is_none_or(|p| now.saturating_sub(self.last_emit_ns) >= p);
        if wm > self.emitted && due {
            self.emitted = wm;
            self.last_emit_ns = now;
            self.next.watermark(wm, ctx)?;
        }
        Ok(())
    }

    crate::runtime::collector::forward_flow!();
    fn barrier(&mut self, barrier: Barrier, snap: &mut TaskSnapshot, ctx: &mut TaskContext) -> Result<(), BoxError> {
        // Its progress, so that a restore goes on with the same watermarks
        // (and says "active again" first if it was idle).
        let state = GeneratorState {
            max_ts: self.max_ts,
            emitted: self.emitted,
            idle: self.idle,
        };
        snap.put_operator(self.op, postcard::to_stdvec(&state)?);
        self.next.barrier(barrier, snap, ctx)
    }
    fn notify(&mut self, notice: Notice, ctx: &mut TaskContext) -> Result<(), BoxError> {
        self.next.notify(notice, ctx)
    }
    fn restore(&mut self, r: &RestoreCtx<'_>, ctx: &mut TaskContext) -> Result<(), BoxError> {
        // Own state only: at another parallelism (or from a checkpoint
        // before generators stored theirs) it starts from the beginning.
        if let Some(bytes) = r.own.and_then(|s| s.operator(self.op)) {
            ctx.current_op = self.op;
            let state: GeneratorState = postcard::from_bytes(bytes).map_err(|e| {
                format!(
                    "checkpoint {}: watermark generator state does not decode: {e}",
                    r.checkpoint
                )
            })?;
            self.max_ts = state.max_ts;
            self.emitted = state.emitted;
            self.idle = state.idle;
        }
        // Downstream of a generator, event time is the generator's.
        self.next.restore(&r.with_watermark(self.emitted), ctx)
    }

    fn watermark(&mut self, wm: i64, ctx: &mut TaskContext) -> Result<(), BoxError> {
        // This operator owns event time from here on: upstream watermarks
        // are replaced by its own, except end-of-input.
        if wm == MAX_WATERMARK && self.emitted != MAX_WATERMARK {
            self.emitted = MAX_WATERMARK;
            self.idle = false;
            self.next.watermark(MAX_WATERMARK, ctx)?;
        }
        Ok(())
    }

    fn tick(&mut self, ctx: &mut TaskContext) -> Result<(), BoxError> {
        let now = ctx.now_ns();
        if let Some(p) = self.strategy.period_ns {
            let wm = self.current();
            if wm > self.emitted && now.saturating_sub(self.last_emit_ns) >= p {
                self.emitted = wm;
                self.last_emit_ns = now;
                self.next.watermark(wm, ctx)?;
            }
        }
        if let Some(idle_after) = self.strategy.idle_after_ns {
            if !self.idle && self.emitted != MAX_WATERMARK && now.saturating_sub(self.last_record_ns) >= idle_after {
                self.idle = true;
                self.next.watermark(IDLE, ctx)?;
            }
        }
        self.next.tick(ctx)
    }
}

/// What a watermark generator stores in a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct GeneratorState {
    max_ts: i64,
    emitted: i64,
    idle: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategy_validation_names_the_setting() {
        let f = |x: &i64| *x;
        assert!(WatermarkStrategy::bounded(-1, f)
            .validate()
            .unwrap_err()
            .contains("out_of_orderness_ms"));
        assert!(WatermarkStrategy::bounded(0, f)
            .idle_after_ms(0)
            .validate()
            .unwrap_err()
            .contains("idle_after_ms"));
        assert!(WatermarkStrategy::bounded(0, f)
            .periodic_ms(0)
            .validate()
            .unwrap_err()
            .contains("periodic_ms"));
        assert!(WatermarkStrategy::bounded(10, f).validate().is_ok());
    }
}
