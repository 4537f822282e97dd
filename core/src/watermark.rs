//! The watermark's values, shared by every layer: the runtime carries them
//! on the rings, checkpoints store them, operators compare against them.
//! The event-time API is [`crate::time`].

/// Event time before any watermark: every timestamp is still to come.
pub const MIN_WATERMARK: i64 = i64::MIN + 1;

/// The watermark of an input that ended: everything is complete.
pub const MAX_WATERMARK: i64 = i64::MAX;

/// On the wire only: "this channel is idle", sent in place of a watermark.
/// A channel is active again at its next watermark.
pub(crate) const IDLE: i64 = i64::MIN;
