//! A task's view of event time on its input channels: each channel's
//! watermark and idleness, combined into the one watermark the task hands
//! its chain (the minimum over active channels; ended channels count as
//! complete). Stored at a snapshot as [`InputEventTime`].

use crate::checkpoint::snapshot::InputEventTime;
use crate::watermark::{IDLE, MAX_WATERMARK, MIN_WATERMARK};

/// The combined watermark of a task's input channels.
///
/// Each channel has its own watermark (the largest received) and may be
/// idle or ended. The task's watermark is the minimum over active
/// channels; ended channels count as [`MAX_WATERMARK`]; when every open
/// channel is idle, the task is idle itself. It only ever advances.
#[derive(Debug, Clone)]
pub(crate) struct InputWatermarks {
    channels: Vec<(i64, bool)>,
    ended: Vec<bool>,
    emitted: i64,
    emitted_idle: bool,
}

/// What a task forwards after a change of its inputs' watermarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WatermarkUpdate {
    None,
    Advance(i64),
    Idle,
    /// Active again after idle, at the (unchanged) watermark.
    Active(i64),
}

impl InputWatermarks {
    pub(crate) fn new(n: usize) -> Self {
        InputWatermarks {
            channels: vec![(MIN_WATERMARK, false); n],
            ended: vec![false; n],
            emitted: MIN_WATERMARK,
            emitted_idle: false,
        }
    }

    /// The state to store in a checkpoint. No channel has ended at a
    /// snapshot (end-of-stream follows the final checkpoint).
    pub(crate) fn checkpoint(&self) -> InputEventTime {
        InputEventTime {
            channels: self.channels.clone(),
            emitted: self.emitted,
            emitted_idle: self.emitted_idle,
        }
    }

    /// Continues from a checkpoint's state; false (and nothing changed) if
    /// it was taken with another number of input channels.
    pub(crate) fn restore(&mut self, state: &InputEventTime) -> bool {
        if state.channels.len() != self.channels.len() {
            return false;
        }
        self.channels.clone_from(&state.channels);
        self.emitted = state.emitted;
        self.emitted_idle = state.emitted_idle;
        true
    }

    /// Channel `i` delivered watermark (or [`IDLE`] marker) `wm`.
    pub(crate) fn on_watermark(&mut self, i: usize, wm: i64) -> WatermarkUpdate {
        let c = &mut self.channels[i];
        if wm == IDLE {
            c.1 = true;
        } else {
            c.1 = false;
            c.0 = c.0.max(wm);
        }
        self.update()
    }

    /// Whether channel `i` ended.
    pub(crate) fn has_ended(&self, i: usize) -> bool {
        self.ended[i]
    }

    /// Channel `i` ended.
    pub(crate) fn on_end(&mut self, i: usize) -> WatermarkUpdate {
        self.ended[i] = true;
        self.update()
    }

    fn update(&mut self) -> WatermarkUpdate {
        let mut min = MAX_WATERMARK;
        let mut active = false;
        let mut open = false;
        for (&(wm, idle), &ended) in self.channels.iter().zip(&self.ended) {
            if ended {
                continue;
            }
            open = true;
            if !idle {
                active = true;
                min = min.min(wm);
            }
        }
        if open && !active {
            if self.emitted_idle {
                return WatermarkUpdate::None;
            }
            self.emitted_idle = true;
            return WatermarkUpdate::Idle;
        }
        let was_idle = std::mem::replace(&mut self.emitted_idle, false);
        if min > self.emitted {
            self.emitted = min;
            WatermarkUpdate::Advance(min)
        } else if was_idle {
            WatermarkUpdate::Active(self.emitted)
        } else {
            WatermarkUpdate::None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combined_watermark_is_the_minimum_of_active_channels() {
        let mut w = InputWatermarks::new(3);
        assert_eq!(w.on_watermark(0, 10), WatermarkUpdate::None);
        assert_eq!(w.on_watermark(1, 20), WatermarkUpdate::None);
        assert_eq!(w.on_watermark(2, 5), WatermarkUpdate::Advance(5));
        assert_eq!(w.on_watermark(2, 30), WatermarkUpdate::Advance(10));
        // An older watermark on a channel never moves it back.
        assert_eq!(w.on_watermark(0, 3), WatermarkUpdate::None);
        // Idle channel 0 no longer holds event time back.
        assert_eq!(w.on_watermark(0, IDLE), WatermarkUpdate::Advance(20));
        assert_eq!(w.on_watermark(1, IDLE), WatermarkUpdate::Advance(30));
        assert_eq!(w.on_watermark(2, IDLE), WatermarkUpdate::Idle);
        assert_eq!(w.on_watermark(2, IDLE), WatermarkUpdate::None);
        // Active again without advancing: downstream must learn it.
        assert_eq!(w.on_watermark(1, 25), WatermarkUpdate::Active(30));
        assert_eq!(w.on_watermark(1, 40), WatermarkUpdate::Advance(40));
        // Channel 0 comes back behind: no regression.
        assert_eq!(w.on_watermark(0, 35), WatermarkUpdate::None);
        assert_eq!(w.on_end(1), WatermarkUpdate::None);
        assert_eq!(w.on_end(0), WatermarkUpdate::Idle);
        assert_eq!(w.on_end(2), WatermarkUpdate::Advance(MAX_WATERMARK));
    }

    #[test]
    fn ended_channels_count_as_complete() {
        let mut w = InputWatermarks::new(2);
        assert_eq!(w.on_end(0), WatermarkUpdate::None);
        assert_eq!(w.on_watermark(1, 7), WatermarkUpdate::Advance(7));
        assert_eq!(w.on_end(1), WatermarkUpdate::Advance(MAX_WATERMARK));
    }
}
