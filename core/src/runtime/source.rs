//! The contract of a source: emit batches of typed records, and (for a
//! replayable source) report and seek to an offset.
//!
//! The offset is opaque bytes owned by the source: a sequence number for a
//! generator, `(file, byte position)` for files. Checkpoints store the offset
//! taken between two batches, exactly where the barrier is injected, and
//! recovery seeks to it.

use crate::error::BoxError;
use crate::runtime::context::SourceContext;

/// What one call of [`Source::poll`] achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourcePoll {
    /// Records may have been appended; call again soon.
    Ready,
    /// Nothing to emit right now (a rate limit, no new input); the worker
    /// may back off before calling again.
    Idle,
    /// The source is exhausted: the records appended in this call are its
    /// last. End-of-stream then flows through the graph.
    Done,
}

/// A producer of records of type `T`, one instance per parallel subtask.
///
/// `poll` is called on a worker thread in a loop; it must not block for
/// long (a worker may run other tasks), and it appends at most `max`
/// records to `out` per call.
///
/// ```
/// use weir_core::{BoxError, Source, SourceContext, SourcePoll};
///
/// /// Emits 0..n, replayable: the offset is the next number.
/// struct Count { next: u64, n: u64 }
///
/// impl Source<u64> for Count {
///     fn poll(&mut self, out: &mut Vec<u64>, max: usize, _: &mut SourceContext<'_>)
///         -> Result<SourcePoll, BoxError> {
///         let end = self.n.min(self.next + max as u64);
///         out.extend(self.next..end);
///         self.next = end;
///         Ok(if end == self.n { SourcePoll::Done } else { SourcePoll::Ready })
///     }
///     fn offset(&self) -> Vec<u8> { self.next.to_le_bytes().to_vec() }
///     fn seek(&mut self, offset: &[u8]) -> Result<(), BoxError> {
///         self.next = u64::from_le_bytes(offset.try_into()?);
///         Ok(())
///     }
///     fn is_replayable(&self) -> bool { true }
/// }
/// ```
pub trait Source<T>: Send + 'static {
    /// Appends up to `max` records to `out` (which the runtime passes in empty).
    fn poll(&mut self, out: &mut Vec<T>, max: usize, ctx: &mut SourceContext<'_>) -> Result<SourcePoll, BoxError>;

    /// The position of the next record to emit, for a checkpoint.
    fn offset(&self) -> Vec<u8> {
        Vec::new()
    }

    /// Moves to a position returned earlier by [`Source::offset`].
    ///
    /// From the moment `seek` returns, [`Source::offset`] and
    /// [`Source::checkpoint_offset`] must return that position until a poll
    /// emits a record past it, even while the source is still connecting
    /// or setting up on another thread: a checkpoint can be taken before
    /// the first poll, and a restore from it must resume exactly here, not
    /// from wherever a fresh source would start.
    fn seek(&mut self, _offset: &[u8]) -> Result<(), BoxError> {
        Err("this source cannot seek: it is not replayable".into())
    }

    /// True if [`Source::seek`] can replay from any reported offset.
    /// Exactly-once jobs refuse sources that are not replayable.
    fn is_replayable(&self) -> bool {
        false
    }

    /// The offset stored in checkpoint `checkpoint`, taken between two
    /// polls where its barrier is injected. The default is
    /// [`Source::offset`]; a source that acts when a checkpoint completes
    /// (commits its position to an external system) keeps what it returned
    /// here under the id, for [`Source::checkpoint_complete`].
    fn checkpoint_offset(&mut self, checkpoint: u64) -> Vec<u8> {
        let _ = checkpoint;
        self.offset()
    }

    /// Checkpoint `checkpoint` is complete (its manifest is durable), and so
    /// is every earlier one; ids may be skipped. Called on the source's
    /// worker between polls, so it must not block: hand slow work to a
    /// thread (or an asynchronous client call). An error fails the task.
    fn checkpoint_complete(&mut self, checkpoint: u64) -> Result<(), BoxError> {
        let _ = checkpoint;
        Ok(())
    }

    /// What is left to read, if the source knows it cheaply: bytes to the
    /// end of a file, records behind the end of a partition. Shown as
    /// source lag in [`crate::TaskMetrics::backlog`] and on the metrics
    /// endpoint. Called once after every poll (a batch), never per record,
    /// so it must not block nor allocate. Default: unknown.
    fn backlog(&self) -> Option<u64> {
        None
    }
}

/// A bounded, replayable source over a shared vector: each subtask emits
/// the elements whose index modulo the parallelism is its own.
///
/// Meant for tests and examples; it clones each record once.
#[derive(Debug)]
pub struct VecSource<T> {
    items: std::sync::Arc<Vec<T>>,
    next: usize,
    stride: usize,
}

impl<T: Clone + Send + Sync + 'static> VecSource<T> {
    /// The source instance for `subtask` of `parallelism`.
    pub fn new(items: std::sync::Arc<Vec<T>>, subtask: usize, parallelism: usize) -> Self {
        assert!(subtask < parallelism, "subtask {subtask} out of range 0..{parallelism}");
        VecSource {
            items,
            next: subtask,
            stride: parallelism,
        }
    }
}

impl<T: Clone + Send + Sync + 'static> Source<T> for VecSource<T> {
    fn poll(&mut self, out: &mut Vec<T>, max: usize, _: &mut SourceContext<'_>) -> Result<SourcePoll, BoxError> {
        let mut n = 0;
        while n < max && self.next < self.items.len() {
            out.push(self.items[self.next].clone());
            self.next += self.stride;
            n += 1;
        }
        Ok(if self.next >= self.items.len() {
            SourcePoll::Done
        } else {
            SourcePoll::Ready
        })
    }

    fn offset(&self) -> Vec<u8> {
        (self.next as u64).to_le_bytes().to_vec()
    }

    fn seek(&mut self, offset: &[u8]) -> Result<(), BoxError> {
        let bytes: [u8; 8] = offset
            .try_into()
            .map_err(|_| format!("VecSource offset must be 8 bytes, got {}", offset.len()))?;
        self.next = u64::from_le_bytes(bytes) as usize;
        Ok(())
    }

    fn is_replayable(&self) -> bool {
        true
    }

    /// Records this subtask has left to emit.
    fn backlog(&self) -> Option<u64> {
        Some(self.items.len().saturating_sub(self.next).div_ceil(self.stride) as u64)
    }
}
