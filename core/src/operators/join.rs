//! The two-input operator behind joins and co-process functions; its
//! builder and user documentation are in `crate::api::join`.

use std::collections::BTreeMap;
use std::hash::Hash;

use serde::{Deserialize, Serialize};

use crate::checkpoint::snapshot::TaskSnapshot;
use crate::data::Data;
use crate::error::BoxError;
use crate::operators::stores::{restore_options, Snapshottable, StoreLifecycle};
use crate::runtime::collector::{Collector, Notice, RestoreCtx};
use crate::runtime::context::TaskContext;
use crate::runtime::message::Barrier;
use crate::state::{MapStore, SerdeCodec, StateKey, StoreOptions};
use crate::watermark::IDLE;

/// A record of the first (`Left`) or the second (`Right`) of two
/// connected streams.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Either<A, B> {
    /// From the first stream.
    Left(A),
    /// From the second stream.
    Right(B),
}

/// How the join operator pairs records.
#[derive(Debug, Clone, Copy)]
pub(crate) enum JoinKind {
    /// Every pair, forever.
    Inner,
    /// `a.ts + lower <= b.ts <= a.ts + upper`.
    Interval { lower: i64, upper: i64 },
}

/// A record kept by the join: its side's store holds it under `(ts, seq)`.
type Slot = (i64, u64);

/// A pending removal from a side's store once the watermark passes.
type Expiry<K> = (K, bool, Slot);

pub(crate) struct JoinOperator<A, B, K, O, KF, TA, TB, F> {
    pub(crate) kind: JoinKind,
    pub(crate) key_fn: KF,
    pub(crate) ts_a: TA,
    pub(crate) ts_b: TB,
    pub(crate) f: F,
    pub(crate) left: MapStore<K, Slot, A, SerdeCodec>,
    pub(crate) right: MapStore<K, Slot, B, SerdeCodec>,
    pub(crate) opts: [StoreOptions; 2],
    pub(crate) seq: u64,
    pub(crate) expiry: BTreeMap<i64, Vec<Expiry<K>>>,
    pub(crate) watermark: i64,
    pub(crate) lifecycle: StoreLifecycle,
    pub(crate) matches: Vec<Slot>,
    pub(crate) out: Vec<O>,
    pub(crate) next: Box<dyn Collector<O>>,
    pub(crate) op: usize,
}

impl<A, B, K, O, KF, TA, TB, F> JoinOperator<A, B, K, O, KF, TA, TB, F>
where
    A: Data,
    B: Data,
    K: StateKey,
    TA: Fn(&A) -> i64,
    TB: Fn(&B) -> i64,
    F: FnMut(&A, &B) -> O,
{
    /// A step of the paced state copy (`StoreLifecycle::advance`).
    #[cold]
    fn copy_step(&mut self) {
        let mut stores: [&mut dyn Snapshottable; 2] = [&mut self.left, &mut self.right];
        self.lifecycle.advance(&mut stores);
    }

    /// When a kept record can no longer match anything: `None` for never.
    fn expires(&self, is_left: bool, ts: i64) -> Option<i64> {
        match self.kind {
            JoinKind::Inner => None,
            // A future `b` has b.ts > watermark; `a` matches only b.ts <= a.ts + upper.
            JoinKind::Interval { upper, .. } if is_left => Some(ts.saturating_add(upper)),
            // A future `a` has a.ts > watermark; `b` matches only a.ts <= b.ts - lower.
            JoinKind::Interval { lower, .. } => Some(ts.saturating_sub(lower)),
        }
    }

    fn add(&mut self, key: K, record: Either<A, B>) -> Result<(), BoxError> {
        self.seq += 1;
        let seq = self.seq;
        let is_left = matches!(record, Either::Left(_));
        let ts = match &record {
            Either::Left(a) => (self.ts_a)(a),
            Either::Right(b) => (self.ts_b)(b),
        };
        // Match against the other side first.
        self.matches.clear();
        let matches = &mut self.matches;
        let kind = self.kind;
        let range = |other_ts| match kind {
            JoinKind::Inner => true,
            JoinKind::Interval { lower, upper } => {
                let (a, b) = if is_left { (ts, other_ts) } else { (other_ts, ts) };
                a.saturating_add(lower) <= b && b <= a.saturating_add(upper)
            }
        };
        if is_left {
            self.right.user_keys_in(&key, |&(t, s)| {
                if range(t) {
                    matches.push((t, s));
                }
            });
        } else {
            self.left.user_keys_in(&key, |&(t, s)| {
                if range(t) {
                    matches.push((t, s));
                }
            });
        }
        // Arrival order of the kept side: deterministic output order.
        self.matches.sort_unstable_by_key(|&(_, s)| s);
        match &record {
            Either::Left(a) => {
                for slot in &self.matches {
                    if let Some(b) = self.right.get(&key, slot) {
                        self.out.push((self.f)(a, &b));
                    }
                }
            }
            Either::Right(b) => {
                for slot in &self.matches {
                    if let Some(a) = self.left.get(&key, slot) {
                        self.out.push((self.f)(&a, b));
                    }
                }
            }
        }
        // Keep the record unless it can match nothing in the future.
        let expires = self.expires(is_left, ts);
        if expires.is_some_and(|e| e <= self.watermark) {
            return Ok(());
        }
        match record {
            Either::Left(a) => self.left.put(&key, &(ts, seq), &a),
            Either::Right(b) => self.right.put(&key, &(ts, seq), &b),
        }
        .map_err(|e| format!("{e} (raise the join's KeyedStream::max_record_bytes)"))?;
        if let Some(e) = expires {
            self.expiry.entry(e).or_default().push((key, is_left, (ts, seq)));
        }
        Ok(())
    }

    fn advance(&mut self, wm: i64) {
        self.watermark = wm;
        while let Some(entry) = self.expiry.first_entry() {
            if *entry.key() > wm {
                break;
            }
            for (key, is_left, slot) in entry.remove() {
                if is_left {
                    self.left.remove(&key, &slot);
                } else {
                    self.right.remove(&key, &slot);
                }
            }
        }
    }
}

impl<A, B, K, O, KF, TA, TB, F> Collector<Either<A, B>> for JoinOperator<A, B, K, O, KF, TA, TB, F>
where
    A: Data,
    B: Data,
    K: StateKey,
    O: Send,
    KF: Fn(&Either<A, B>) -> K + Send,
    TA: Fn(&A) -> i64 + Send,
    TB: Fn(&B) -> i64 + Send,
    F: FnMut(&A, &B) -> O + Send,
{
    fn collect(&mut self, batch: &mut Vec<Either<A, B>>, ctx: &mut TaskContext) -> Result<(), BoxError> {
        ctx.current_op = self.op;
        for record in batch.drain(..) {
            let key = (self.key_fn)(&record);
            self.add(key, record)?;
        }
        self.next.collect(&mut self.out, ctx)
    }
    crate::operators::stores::paced_flow!();
    fn barrier(&mut self, barrier: Barrier, snap: &mut TaskSnapshot, ctx: &mut TaskContext) -> Result<(), BoxError> {
        ctx.current_op = self.op;
        let mut stores: [&mut dyn Snapshottable; 2] = [&mut self.left, &mut self.right];
        self.lifecycle
            .barrier(&mut stores, barrier.id, barrier.is_final, self.op, snap);
        self.next.barrier(barrier, snap, ctx)
    }
    fn notify(&mut self, notice: Notice, ctx: &mut TaskContext) -> Result<(), BoxError> {
        let mut stores: [&mut dyn Snapshottable; 2] = [&mut self.left, &mut self.right];
        self.lifecycle.notify(&mut stores, notice);
        self.next.notify(notice, ctx)
    }
    fn restore(&mut self, r: &RestoreCtx<'_>, ctx: &mut TaskContext) -> Result<(), BoxError> {
        ctx.current_op = self.op;
        let root = crate::operators::stores::checkpoint_root(ctx, "join state")?;
        let handles = StoreLifecycle::handles(r, self.op, 2)?;
        self.left = MapStore::restore(restore_options(&self.opts[0], r), &root, &handles[0])?;
        self.right = MapStore::restore(restore_options(&self.opts[1], r), &root, &handles[1])?;
        // Sequence numbers go on after the largest restored; expiries are
        // derived from the kept records.
        let mut seq = 0;
        let mut kept = Vec::new();
        self.left.for_each(|k, &(ts, s), _| {
            seq = seq.max(s);
            kept.push((k.clone(), true, (ts, s)));
        });
        self.right.for_each(|k, &(ts, s), _| {
            seq = seq.max(s);
            kept.push((k.clone(), false, (ts, s)));
        });
        self.seq = seq;
        // Event time as at the checkpoint: what it expired is gone already.
        self.watermark = r.watermark;
        self.expiry.clear();
        for (k, is_left, slot) in kept {
            if let Some(e) = self.expires(is_left, slot.0) {
                self.expiry.entry(e).or_default().push((k, is_left, slot));
            }
        }
        self.next.restore(r, ctx)
    }
    fn watermark(&mut self, wm: i64, ctx: &mut TaskContext) -> Result<(), BoxError> {
        if wm != IDLE && wm > self.watermark {
            self.advance(wm);
        }
        self.next.watermark(wm, ctx)
    }
    fn tick(&mut self, ctx: &mut TaskContext) -> Result<(), BoxError> {
        if self.lifecycle.copying() {
            self.copy_step();
        }
        self.next.tick(ctx)
    }
}

/// Default room for one encoded record kept by a join.
pub const DEFAULT_MAX_RECORD_BYTES: usize = 128;
