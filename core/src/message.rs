//! The format of what travels on a ring between two tasks.
//!
//! Data and control travel in one ordered stream: a barrier or a watermark
//! sits between two records exactly where its producer put it, and
//! end-of-stream is the last message a producer ever writes. Control
//! variants are small so that `Message<T>` costs one word more than `T` for
//! typical events (a 32-byte event makes a 40-byte message).

/// One element of an inter-task ring.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Message<T> {
    /// A user record.
    Data(T),
    /// A checkpoint barrier.
    Barrier(Barrier),
    /// An event-time watermark in milliseconds: no record with a smaller or
    /// equal timestamp follows on this channel (late records aside).
    /// [`crate::time::IDLE`] marks the channel idle until its next watermark.
    Watermark(i64),
    /// The producer will send nothing more.
    End,
}

/// A numbered checkpoint barrier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Barrier {
    /// The checkpoint this barrier belongs to; strictly increasing per channel.
    pub id: u64,
    /// Trigger time of the checkpoint, nanoseconds on [`crate::clock`].
    pub trigger_ns: u64,
    /// True once any task handled this checkpoint unaligned (its own mode,
    /// or an aligned checkpoint past its alignment timeout): downstream
    /// tasks then snapshot at the first barrier too.
    pub unaligned: bool,
    /// The last checkpoint of a bounded job: end-of-stream follows it.
    pub is_final: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_messages_stay_small() {
        // A 32-byte event plus the tag: the format must not bloat the ring.
        assert!(std::mem::size_of::<Message<[u64; 4]>>() <= 40);
        assert!(std::mem::size_of::<Message<u64>>() <= 24);
    }
}
