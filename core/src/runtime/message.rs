//! The format of what travels on a ring between two tasks.
//!
//! Data and control travel in one ordered stream: a barrier or a watermark
//! sits between two records exactly where its producer put it, and
//! end-of-stream is the last message a producer ever writes. Control
//! variants are small so that `Message<T>` costs one word more than `T` for
//! typical events (a 32-byte event makes a 40-byte message).

use std::mem::ManuallyDrop;

/// One element of an inter-task ring.
// A batch's vector is boxed so that its variant is one word (a
// `Message<u64>` stays 24 bytes); the boxes are pooled, not allocated per
// batch.
#[allow(clippy::box_collection)]
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Message<T> {
    /// A user record.
    Data(T),
    /// A checkpoint barrier.
    Barrier(Barrier),
    /// An event-time watermark in milliseconds: no record with a smaller or
    /// equal timestamp follows on this channel (late records aside).
    /// [`crate::watermark::IDLE`] marks the channel idle until its next watermark.
    Watermark(i64),
    /// The producer will send nothing more.
    End,
    /// A whole batch of records, handed over by reference between two
    /// tasks on the same worker: the records in order, as if each were a
    /// `Data` here. The box goes back to the producer empty, through the
    /// channel's pool ([`BatchPool`]), so that nothing is allocated per
    /// batch; boxed, so that the variant adds nothing to a message.
    ///
    /// `ManuallyDrop`, so that a message of a plain record type keeps no
    /// drop glue: rings drop every slot they free, and with glue that is a
    /// check per record (with a plain `Box` here the two-worker keyed job,
    /// whose rings carry no batches, measured markedly slower:
    /// docs/notebook/benchmarks-2026-12.md, "Batches handed over by
    /// reference on one worker"). The
    /// consumer takes the box out when it reads the message, and an input
    /// drains its ring when it is dropped ([`crate::runtime::task::Inbox`]), so a
    /// batch still in flight is freed too.
    Batch(ManuallyDrop<Box<Vec<T>>>),
}

impl<T> Message<T> {
    /// A batch message holding `records`.
    #[allow(clippy::box_collection)]
    pub(crate) fn batch(records: Box<Vec<T>>) -> Self {
        Message::Batch(ManuallyDrop::new(records))
    }
}

/// How many batches a same-worker channel has in flight at most: the
/// boxes that circulate between its producer and its consumer. Four
/// batches of records queue at most this way, beside the ring's slots.
pub(crate) const BATCHES_IN_FLIGHT: usize = 4;

/// The producer's end of a same-worker channel's pool: empty boxes coming
/// back from the consumer.
pub(crate) type BatchPool<T> = rtrb::Consumer<Box<Vec<T>>>;

/// The consumer's end of a same-worker channel's pool: where it returns
/// each batch's box, emptied.
pub(crate) type BatchReturn<T> = rtrb::Producer<Box<Vec<T>>>;

/// A same-worker channel's pool, both ends, holding
/// [`BATCHES_IN_FLIGHT`] empty boxes of `capacity` records each.
pub(crate) fn batch_pool<T>(capacity: usize) -> (BatchReturn<T>, BatchPool<T>) {
    let (mut back, pool) = rtrb::RingBuffer::new(BATCHES_IN_FLIGHT);
    for _ in 0..BATCHES_IN_FLIGHT {
        back.push(Box::new(Vec::with_capacity(capacity)))
            .expect("the pool's ring holds every box");
    }
    (back, pool)
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

    #[test]
    fn messages_of_plain_records_have_no_drop_glue() {
        // Rings drop every slot they free: glue would cost a check per
        // record ([`Message::Batch`]).
        assert!(!std::mem::needs_drop::<Message<[u64; 4]>>());
        assert!(std::mem::needs_drop::<Message<String>>());
    }
}
