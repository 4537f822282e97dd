//! The end of a chain that feeds rings: hash-partitioned (`key_by`) or
//! round-robin (`rebalance`) exchange to the next operator's subtasks.
//!
//! Records are first staged per target ring, then moved into each ring
//! with one chunked write (`write_chunk_uninit`), so a handoff costs a
//! memcpy and two atomic index updates per chunk, not per record. When a
//! ring is full, what did not fit stays staged; the task reports pending
//! output and reads no new input until it is flushed (backpressure). The
//! staging buffers are bounded by one input batch times the chain's fan-out.

use std::hash::Hash;

use rtrb::Producer;

use crate::collector::Collector;
use crate::context::TaskContext;
use crate::error::BoxError;
use crate::keyed::{key_group, stable_hash, subtask_for_key_group};
use crate::message::Message;

/// One outgoing ring and the records staged for it.
pub(crate) struct Outbox<T> {
    staged: Vec<Message<T>>,
    ring: Producer<Message<T>>,
}

impl<T> Outbox<T> {
    pub(crate) fn new(ring: Producer<Message<T>>, batch_size: usize) -> Self {
        Outbox {
            staged: Vec::with_capacity(batch_size),
            ring,
        }
    }

    #[inline]
    pub(crate) fn stage(&mut self, m: Message<T>) {
        self.staged.push(m);
    }

    /// Moves as much staged output as fits into the ring; true if all did.
    #[inline]
    pub(crate) fn flush(&mut self) -> bool {
        if self.staged.is_empty() {
            return true;
        }
        let n = self.ring.slots().min(self.staged.len());
        if n == 0 {
            return false;
        }
        let chunk = self
            .ring
            .write_chunk_uninit(n)
            .expect("slots() promised n free slots and only this producer writes");
        let written = chunk.fill_from_iter(self.staged.drain(..n));
        debug_assert_eq!(written, n);
        self.staged.is_empty()
    }
}

/// Flushes every outbox; true if nothing remains staged.
fn flush_all<T>(outboxes: &mut [Outbox<T>]) -> bool {
    let mut all = true;
    for o in outboxes {
        all &= o.flush();
    }
    all
}

/// Hash-partitioned exchange (`key_by`).
pub(crate) struct HashOutput<T, K, KF> {
    pub(crate) outboxes: Vec<Outbox<T>>,
    pub(crate) key_fn: KF,
    pub(crate) max_parallelism: usize,
    pub(crate) _k: std::marker::PhantomData<fn() -> K>,
}

impl<T: Send, K: Hash, KF: Fn(&T) -> K + Send> Collector<T> for HashOutput<T, K, KF> {
    #[inline]
    fn collect(&mut self, batch: &mut Vec<T>, ctx: &mut TaskContext) -> Result<(), BoxError> {
        ctx.records_out += batch.len() as u64;
        let q = self.outboxes.len();
        let maxp = self.max_parallelism;
        for record in batch.drain(..) {
            let kg = key_group(stable_hash(&(self.key_fn)(&record)), maxp);
            self.outboxes[subtask_for_key_group(kg, maxp, q)].stage(Message::Data(record));
        }
        flush_all(&mut self.outboxes);
        Ok(())
    }
    fn flush(&mut self, _ctx: &mut TaskContext) -> Result<bool, BoxError> {
        Ok(flush_all(&mut self.outboxes))
    }
    fn finish(&mut self, _ctx: &mut TaskContext) -> Result<(), BoxError> {
        self.outboxes.iter_mut().for_each(|o| o.stage(Message::End));
        flush_all(&mut self.outboxes);
        Ok(())
    }
}

/// Round-robin exchange (`rebalance`, `union`): record `i` of this subtask
/// goes to target `(start + i) mod q`, where `start` differs per subtask so
/// that small inputs still spread.
pub(crate) struct RebalanceOutput<T> {
    pub(crate) outboxes: Vec<Outbox<T>>,
    pub(crate) next: usize,
}

impl<T: Send> Collector<T> for RebalanceOutput<T> {
    #[inline]
    fn collect(&mut self, batch: &mut Vec<T>, ctx: &mut TaskContext) -> Result<(), BoxError> {
        ctx.records_out += batch.len() as u64;
        let q = self.outboxes.len();
        for record in batch.drain(..) {
            self.outboxes[self.next].stage(Message::Data(record));
            self.next += 1;
            if self.next == q {
                self.next = 0;
            }
        }
        flush_all(&mut self.outboxes);
        Ok(())
    }
    fn flush(&mut self, _ctx: &mut TaskContext) -> Result<bool, BoxError> {
        Ok(flush_all(&mut self.outboxes))
    }
    fn finish(&mut self, _ctx: &mut TaskContext) -> Result<(), BoxError> {
        self.outboxes.iter_mut().for_each(|o| o.stage(Message::End));
        flush_all(&mut self.outboxes);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outbox_keeps_what_does_not_fit_in_order() {
        let (p, mut c) = rtrb::RingBuffer::new(4);
        let mut o = Outbox::new(p, 8);
        for i in 0..6 {
            o.stage(Message::Data(i));
        }
        assert!(!o.flush(), "only 4 of 6 fit");
        let got: Vec<_> = (0..4).map(|_| c.pop().unwrap()).collect();
        assert_eq!(got, (0..4).map(Message::Data).collect::<Vec<_>>());
        assert!(o.flush());
        assert_eq!(c.pop().unwrap(), Message::Data(4));
        assert_eq!(c.pop().unwrap(), Message::Data(5));
        assert!(c.pop().is_err());
    }
}
