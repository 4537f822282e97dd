//! What an exchange's end keeps so that its task can recover alone in dedup
//! mode ([`crate::CheckpointMode::Dedup`]) although other tasks read its
//! output: a producer that reads rings (a keyed stage feeding another
//! `key_by`, a stage feeding `rebalance` or `union`).
//!
//! The failed producer's replacement is restored from the latest completed
//! checkpoint `c` and fed again what its predecessor took since its
//! snapshot `c`, in the same order ([`crate::runtime::task`]'s dedup
//! backup), so it emits the same records in the same order, given
//! deterministic operators. Its consumers already took part of that
//! output. So:
//!
//! - the exchange's outboxes (the rings' producer ends, and what is still
//!   staged) outlive the failed chain: its `Drop` leaves them in a keep slot
//!   ([`OutputKeep`], one per producer subtask, made per attempt), and the
//!   replacement's exchange is built on them;
//! - each outbox counts the records it took ([`Outbox::emitted`], per batch
//!   on the fast paths), and the ledger marks the counts (and a round-robin
//!   exchange's cursor) at each snapshot;
//! - the replacement drops, per outbox, the first `emitted - mark(c)`
//!   records it routes there: those its predecessor had emitted after its
//!   snapshot `c`. The consumers read one unbroken stream.
//!
//! A replay that ends (new input, a barrier, the end of input) while
//! records remain to drop means the operators did not emit again what they
//! had: not deterministic. The task fails with
//! [`TaskContext::restart_whole_job`] set, and the whole job restarts from
//! the checkpoint instead, which is exact whatever the operators do.
//! (Design: docs/design/dedup.md, "A failed producer: its exchange drops
//! what was sent".)

use std::sync::{Arc, Mutex};

use crate::error::BoxError;
use crate::runtime::collector::Notice;
use crate::runtime::context::TaskContext;
use crate::runtime::output::Outbox;

/// The counts at one snapshot: per outbox, the records taken, and the
/// round-robin cursor (0 for a hash exchange).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mark {
    checkpoint: u64,
    emitted: Vec<u64>,
    cursor: usize,
}

/// What a failed producer's exchange leaves for its replacement: its
/// outboxes, and its marks since the latest completed checkpoint.
pub(crate) struct KeptOutput<T> {
    outboxes: Vec<Outbox<T>>,
    marks: Vec<Mark>,
}

/// Where an exchange leaves its [`KeptOutput`] when it is dropped.
pub(crate) type OutputKeep<T> = Arc<Mutex<Option<KeptOutput<T>>>>;

/// An exchange end's dedup bookkeeping; see the module docs. Inert (no
/// keep slot, no marks) outside dedup mode.
pub(crate) struct Ledger<T> {
    keep: Option<OutputKeep<T>>,
    /// Marks since the latest completed checkpoint (and at the start:
    /// checkpoint 0, or the one restored from). Bounded by the checkpoints
    /// in flight: pruned at every completion and abort.
    marks: Vec<Mark>,
    /// A replacement: per outbox, the records still to drop.
    suppress: Vec<u64>,
    /// Any of `suppress` is not 0: the exchange routes record by record.
    pub(crate) suppressing: bool,
    /// A replacement's ledger: its outboxes hold what its predecessor
    /// staged, and it restores no output channel state into them.
    replacement: bool,
}

impl<T> Default for Ledger<T> {
    fn default() -> Self {
        Ledger {
            keep: None,
            marks: Vec::new(),
            suppress: Vec::new(),
            suppressing: false,
            replacement: false,
        }
    }
}

fn emitted<T>(outboxes: &[Outbox<T>]) -> Vec<u64> {
    outboxes.iter().map(Outbox::emitted).collect()
}

impl<T> Ledger<T> {
    /// Dedup mode: the exchange leaves its outboxes in `keep` when dropped
    /// ([`Self::leave`]), and marks its counts at each snapshot.
    pub(crate) fn keeping(keep: OutputKeep<T>, outboxes: usize, cursor: usize) -> Self {
        Ledger {
            keep: Some(keep),
            marks: vec![Mark {
                checkpoint: 0,
                emitted: vec![0; outboxes],
                cursor,
            }],
            ..Ledger::default()
        }
    }

    /// A replacement's ledger, restored from `checkpoint`: the predecessor's
    /// outboxes (taken from `keep`), its cursor at its snapshot
    /// `checkpoint`, and the records to drop. An error when nothing was
    /// kept (the failed chain's drop did not finish) or no snapshot of
    /// `checkpoint` was marked: the task cannot recover alone then.
    pub(crate) fn resume(keep: OutputKeep<T>, checkpoint: u64) -> Result<(Vec<Outbox<T>>, usize, Self), String> {
        let kept = keep
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or("the failed task's exchange left no outboxes")?;
        let Some(mark) = kept.marks.iter().find(|m| m.checkpoint == checkpoint).cloned() else {
            return Err(format!(
                "the failed task's exchange marked no snapshot for checkpoint {checkpoint} (it marked {:?})",
                kept.marks.iter().map(|m| m.checkpoint).collect::<Vec<_>>()
            ));
        };
        let suppress: Vec<u64> = kept
            .outboxes
            .iter()
            .zip(&mark.emitted)
            .map(|(o, at)| o.emitted() - at)
            .collect();
        let cursor = mark.cursor;
        let ledger = Ledger {
            keep: Some(keep),
            marks: vec![mark],
            suppressing: suppress.iter().any(|&n| n > 0),
            suppress,
            replacement: true,
        };
        Ok((kept.outboxes, cursor, ledger))
    }

    /// The exchange is being dropped: in dedup mode, its outboxes and marks
    /// go to the keep slot (for a replacement; an attempt that ends drops
    /// them with the slot).
    pub(crate) fn leave(&mut self, outboxes: &mut Vec<Outbox<T>>) {
        if let Some(keep) = self.keep.take() {
            let kept = KeptOutput {
                outboxes: std::mem::take(outboxes),
                marks: std::mem::take(&mut self.marks),
            };
            *keep.lock().unwrap_or_else(|p| p.into_inner()) = Some(kept);
        }
    }

    /// Whether the next record routed to outbox `k` is one the predecessor
    /// emitted (and is dropped): counts it off.
    #[inline]
    pub(crate) fn drops(&mut self, k: usize) -> bool {
        match self.suppress.get_mut(k) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        }
    }

    /// After a suppressed batch: still suppressing? A batch that is not
    /// part of the replay while records remain to drop is an error (see
    /// [`Self::diverged`]).
    pub(crate) fn check_replaying(&mut self, ctx: &mut TaskContext) -> Result<(), BoxError> {
        if !ctx.replaying_backup {
            return Err(self.diverged("new input came after the replay", ctx));
        }
        Ok(())
    }

    /// Recomputes [`Self::suppressing`] after records were dropped.
    pub(crate) fn settle(&mut self) {
        self.suppressing = self.suppress.iter().any(|&n| n > 0);
    }

    /// The error of a replacement that did not emit again everything its
    /// predecessor had (`when`: what came instead); the whole job restarts.
    fn diverged(&self, when: &str, ctx: &mut TaskContext) -> BoxError {
        ctx.restart_whole_job = true;
        format!(
            "{when}, but the recovered task had yet to emit {:?} records on its output channels that its \
             failed predecessor had emitted from the same input: its operators are not deterministic \
             (processing time, randomness, iteration order), so dedup cannot recover it alone; the whole \
             job restarts",
            self.suppress
        )
        .into()
    }

    /// A barrier reaches the exchange (the task's snapshot): marks the
    /// counts. An error if records remain to drop (the replay is over).
    pub(crate) fn on_barrier(
        &mut self,
        id: u64,
        outboxes: &[Outbox<T>],
        cursor: usize,
        ctx: &mut TaskContext,
    ) -> Result<(), BoxError> {
        if self.suppressing {
            return Err(self.diverged(&format!("checkpoint {id}'s barrier came"), ctx));
        }
        if self.keep.is_some() {
            self.marks.push(Mark {
                checkpoint: id,
                emitted: emitted(outboxes),
                cursor,
            });
        }
        Ok(())
    }

    /// The end of input reaches the exchange: an error if records remain
    /// to drop.
    pub(crate) fn on_finish(&mut self, ctx: &mut TaskContext) -> Result<(), BoxError> {
        if self.suppressing {
            return Err(self.diverged("the input ended", ctx));
        }
        Ok(())
    }

    /// A checkpoint completed or was aborted: keeps the marks a
    /// replacement may be restored from (the latest completed one's, and
    /// later ones).
    pub(crate) fn on_notice(&mut self, notice: Notice) {
        match notice {
            Notice::Complete(n) => self.marks.retain(|m| m.checkpoint >= n),
            Notice::Abort(n) => self.marks.retain(|m| m.checkpoint != n),
        }
    }

    /// A replacement's exchange: restored with its task, it takes no output
    /// channel state (its outboxes are its predecessor's, with what it
    /// staged) and keeps its mark.
    pub(crate) fn is_replacement(&self) -> bool {
        self.replacement
    }

    /// The task was restored from `checkpoint` (a whole-job restore), with
    /// any output channel state staged: this attempt starts there.
    pub(crate) fn on_restore(&mut self, checkpoint: u64, outboxes: &[Outbox<T>], cursor: usize) {
        if self.keep.is_some() {
            self.marks = vec![Mark {
                checkpoint,
                emitted: emitted(outboxes),
                cursor,
            }];
        }
    }

    /// Whether watermark `wm` goes on outbox `o`: a replacement replaying
    /// sends no idle marker its predecessor sent already (while it still
    /// drops records), and no exchange sends a watermark older than one it
    /// sent.
    #[inline]
    pub(crate) fn sends_watermark(&self, wm: i64, o: &Outbox<T>) -> bool {
        if wm == crate::watermark::IDLE {
            !self.suppressing
        } else {
            wm >= o.wm_sent()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::snapshot::TaskSnapshot;
    use crate::runtime::collector::Collector;
    use crate::runtime::message::{Barrier, Message};
    use crate::runtime::output::{HashOutput, RebalanceOutput};

    fn barrier(id: u64) -> Barrier {
        Barrier {
            id,
            trigger_ns: 0,
            unaligned: false,
            is_final: false,
        }
    }

    fn data(c: &mut rtrb::Consumer<Message<u64>>) -> Vec<u64> {
        std::iter::from_fn(|| c.pop().ok())
            .filter_map(|m| match m {
                Message::Data(r) => Some(r),
                _ => None,
            })
            .collect()
    }

    /// A hash exchange keeps its outboxes when dropped; its replacement,
    /// replaying from the snapshot of checkpoint 1, sends only what comes
    /// after what its predecessor sent, and a barrier while records remain
    /// to drop is an error that restarts the whole job.
    #[test]
    fn a_replacement_sends_only_what_its_predecessor_did_not() {
        let (mut ctx, _) = TaskContext::for_test("x", 0, 0);
        let (p0, mut c0) = rtrb::RingBuffer::new(64);
        let (p1, mut c1) = rtrb::RingBuffer::new(64);
        let keep = OutputKeep::default();
        let key = |r: &u64| *r;
        let mut out = HashOutput::new(vec![Outbox::new(p0, 8), Outbox::new(p1, 8)], key, 128, 0).keeping(keep.clone());
        out.collect(&mut (0..10).collect(), &mut ctx).unwrap();
        let mut snap = TaskSnapshot::new(1, 0, 0, 1, 1 << 20);
        out.barrier(barrier(1), &mut snap, &mut ctx).unwrap();
        out.collect(&mut (10..16).collect(), &mut ctx).unwrap();
        drop(out);
        let mut sent: Vec<u64> = data(&mut c0).into_iter().chain(data(&mut c1)).collect();
        sent.sort();
        assert_eq!(sent, (0..16).collect::<Vec<_>>());

        let mut again = HashOutput::resumed(keep.clone(), 1, key, 128, 0).unwrap();
        ctx.replaying_backup = true;
        // The replay: 10..16 again, then a new record.
        again.collect(&mut (10..13).collect(), &mut ctx).unwrap();
        again.collect(&mut (13..16).collect(), &mut ctx).unwrap();
        ctx.replaying_backup = false;
        again.collect(&mut vec![16], &mut ctx).unwrap();
        let mut new: Vec<u64> = data(&mut c0).into_iter().chain(data(&mut c1)).collect();
        new.sort();
        assert_eq!(new, vec![16], "only what the predecessor had not sent");

        // A replacement whose replay falls short: the barrier after it fails.
        drop(again);
        let mut short = HashOutput::resumed(keep, 1, key, 128, 0).unwrap();
        ctx.replaying_backup = true;
        short.collect(&mut (10..12).collect(), &mut ctx).unwrap();
        ctx.replaying_backup = false;
        let e = short.barrier(barrier(2), &mut snap, &mut ctx).unwrap_err().to_string();
        assert!(e.contains("not deterministic") && ctx.restart_whole_job, "{e}");
    }

    /// Marks are pruned at completions and aborts; a replacement asked for
    /// a checkpoint never marked cannot resume.
    #[test]
    fn marks_are_bounded_by_the_checkpoints_in_flight() {
        let (mut ctx, _) = TaskContext::for_test("x", 0, 0);
        let (p, _c) = rtrb::RingBuffer::new(64);
        let keep = OutputKeep::default();
        let mut out = RebalanceOutput::new(vec![Outbox::new(p, 8)], 0).keeping(keep.clone());
        let mut snap = TaskSnapshot::new(1, 0, 0, 1, 1 << 20);
        for id in 1..=5 {
            out.collect(&mut vec![id], &mut ctx).unwrap();
            out.barrier(barrier(id), &mut snap, &mut ctx).unwrap();
        }
        out.notify(Notice::Complete(3), &mut ctx).unwrap();
        out.notify(Notice::Abort(5), &mut ctx).unwrap();
        drop(out);
        let marked: Vec<u64> = keep
            .lock()
            .unwrap()
            .as_ref()
            .unwrap()
            .marks
            .iter()
            .map(|m| m.checkpoint)
            .collect();
        assert_eq!(marked, vec![3, 4]);
        assert!(
            RebalanceOutput::resumed(keep, 2).is_err(),
            "checkpoint 2's mark is gone"
        );
    }

    /// A round-robin replacement starts from its predecessor's cursor at
    /// the snapshot, so its replay lands where the predecessor's records
    /// did and is dropped there.
    #[test]
    fn a_round_robin_replacement_routes_its_replay_as_before() {
        let (mut ctx, _) = TaskContext::for_test("x", 0, 0);
        let (p0, mut c0) = rtrb::RingBuffer::new(64);
        let (p1, mut c1) = rtrb::RingBuffer::new(64);
        let (p2, mut c2) = rtrb::RingBuffer::new(64);
        let keep = OutputKeep::default();
        let outboxes = vec![Outbox::new(p0, 8), Outbox::new(p1, 8), Outbox::new(p2, 8)];
        let mut out = RebalanceOutput::new(outboxes, 1).keeping(keep.clone());
        out.collect(&mut (0..4).collect(), &mut ctx).unwrap();
        let mut snap = TaskSnapshot::new(1, 0, 0, 1, 1 << 20);
        out.barrier(barrier(1), &mut snap, &mut ctx).unwrap();
        out.collect(&mut (4..9).collect(), &mut ctx).unwrap();
        drop(out);
        let before = [data(&mut c0), data(&mut c1), data(&mut c2)];
        let mut again = RebalanceOutput::resumed(keep, 1).unwrap();
        ctx.replaying_backup = true;
        again.collect(&mut (4..9).collect(), &mut ctx).unwrap();
        ctx.replaying_backup = false;
        again.collect(&mut (9..12).collect(), &mut ctx).unwrap();
        let after = [data(&mut c0), data(&mut c1), data(&mut c2)];
        // Without a failure: record i on outbox (1 + i) mod 3.
        for (k, (b, a)) in before.iter().zip(&after).enumerate() {
            let all: Vec<u64> = b.iter().chain(a).copied().collect();
            let expected: Vec<u64> = (0..12).filter(|i| (1 + i) as usize % 3 == k).collect();
            assert_eq!(all, expected, "outbox {k}");
        }
    }

    /// Watermarks: never older than one sent; no idle marker while records
    /// remain to drop.
    #[test]
    fn a_replacement_sends_no_watermark_its_predecessor_sent() {
        let (mut ctx, _) = TaskContext::for_test("x", 0, 0);
        let (p, mut c) = rtrb::RingBuffer::new(64);
        let keep = OutputKeep::default();
        let mut out = RebalanceOutput::new(vec![Outbox::new(p, 8)], 0).keeping(keep.clone());
        let mut snap = TaskSnapshot::new(1, 0, 0, 1, 1 << 20);
        out.barrier(barrier(1), &mut snap, &mut ctx).unwrap();
        out.collect(&mut vec![1], &mut ctx).unwrap();
        out.watermark(20, &mut ctx).unwrap();
        out.collect(&mut vec![2], &mut ctx).unwrap();
        drop(out);
        while c.pop().is_ok() {}
        let mut again = RebalanceOutput::resumed(keep, 1).unwrap();
        ctx.replaying_backup = true;
        again.collect(&mut vec![1], &mut ctx).unwrap();
        again.watermark(crate::watermark::IDLE, &mut ctx).unwrap();
        again.watermark(10, &mut ctx).unwrap();
        again.watermark(20, &mut ctx).unwrap();
        again.collect(&mut vec![2], &mut ctx).unwrap();
        ctx.replaying_backup = false;
        again.watermark(30, &mut ctx).unwrap();
        let got: Vec<Message<u64>> = std::iter::from_fn(|| c.pop().ok()).collect();
        assert_eq!(got, vec![Message::Watermark(20), Message::Watermark(30)]);
    }
}
