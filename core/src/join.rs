//! Two-input operators: two streams partitioned by the same key into one
//! keyed operator.
//!
//! [`Stream::connect`] pairs a stream of `A` with a stream of `B`;
//! [`ConnectedStreams::key_by`] partitions both by a key of the same type
//! into one operator whose input is [`Either<A, B>`]. Both inputs are
//! channels of the same task, so checkpoint barriers are aligned across
//! them (or overtake, unaligned) exactly as for any multi-input task, and
//! the task's watermark is the minimum of both sides. On such a keyed pair:
//! - [`KeyedStream::process_function`]: a co-process function with state
//!   and timers (match on `Either`);
//! - [`KeyedStream::inner_join`]: every pair `(a, b)` of equal key, in any
//!   order of arrival, without time bounds (both sides kept forever);
//! - [`KeyedStream::interval_join`]: pairs with `a.ts + lower <= b.ts <=
//!   a.ts + upper`; records leave the state once the watermark makes a
//!   match impossible;
//! - [`KeyedStream::window_join`]: pairs in the same event-time window.
//!
//! Join state lives in [`MapStore`]s of the memory-mapped backend, one per
//! side, checkpointed incrementally.

use std::collections::BTreeMap;
use std::hash::Hash;

use serde::{Deserialize, Serialize};

use crate::checkpoint::snapshot::TaskSnapshot;
use crate::collector::{Collector, Notice, RestoreCtx};
use crate::context::TaskContext;
use crate::data::Data;
use crate::error::BoxError;
use crate::message::Barrier;
use crate::pipeline::{ChainFn, KeyedStream, Stream};
use crate::process::store_options;
use crate::state::{MapStore, SerdeCodec, StateKey, StoreOptions};
use crate::stores::{restore_options, Snapshottable, StoreLifecycle};
use crate::task::{InputTask, Task};
use crate::time::{IDLE, MIN_WATERMARK};
use crate::window::{Window, Windowed, Windows};

/// A record of the first (`Left`) or the second (`Right`) of two
/// connected streams.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Either<A, B> {
    /// From the first stream.
    Left(A),
    /// From the second stream.
    Right(B),
}

/// Two streams to be partitioned by the same key into one operator.
pub struct ConnectedStreams<A, B> {
    left: Stream<A>,
    right: Stream<B>,
}

impl<A: Data> Stream<A> {
    /// Pairs this stream with `other` for a two-input keyed operator.
    ///
    /// ```
    /// use weir_core::join::Either;
    /// # use std::sync::{Arc, Mutex};
    /// # let p = weir_core::Pipeline::new("doc");
    /// let people = p.source("people", 1, |i, n| {
    ///     weir_core::VecSource::new(Arc::new(vec![(1u64, "ann".to_string())]), i, n)
    /// });
    /// let orders = p.source("orders", 1, |i, n| {
    ///     weir_core::VecSource::new(Arc::new(vec![(1u64, 250u64), (1, 100)]), i, n)
    /// });
    /// # let out = Arc::new(Mutex::new(Vec::new()));
    /// # let sink_out = out.clone();
    /// people
    ///     .connect(orders)
    ///     .key_by(|p: &(u64, String)| p.0, |o: &(u64, u64)| o.0)
    ///     .inner_join(|p: &(u64, String), o: &(u64, u64)| (p.1.clone(), o.1))
    ///     .sink("collect", move |_| weir_core::CollectSink::new(sink_out.clone()));
    /// p.run(weir_core::RuntimeConfig::default()).unwrap().join().unwrap();
    /// let mut got = out.lock().unwrap().clone();
    /// got.sort();
    /// assert_eq!(got, vec![("ann".to_string(), 100), ("ann".to_string(), 250)]);
    /// ```
    pub fn connect<B: Data>(self, other: Stream<B>) -> ConnectedStreams<A, B> {
        ConnectedStreams {
            left: self,
            right: other,
        }
    }
}

impl<A: Data, B: Data> ConnectedStreams<A, B> {
    /// Partitions both streams by key: `left_key` for records of the first,
    /// `right_key` for the second. The keyed operator's parallelism is the
    /// first stream's unless set with [`KeyedStream::parallelism`].
    #[allow(clippy::type_complexity)]
    pub fn key_by<K, KA, KB>(
        self,
        left_key: KA,
        right_key: KB,
    ) -> KeyedStream<Either<A, B>, K, impl Fn(&Either<A, B>) -> K + Clone + Send + 'static>
    where
        K: Hash + Eq + Data,
        KA: Fn(&A) -> K + Clone + Send + 'static,
        KB: Fn(&B) -> K + Clone + Send + 'static,
    {
        let key_fn = move |e: &Either<A, B>| match e {
            Either::Left(a) => left_key(a),
            Either::Right(b) => right_key(b),
        };
        let left = self.left.map(Either::Left).name("connect_left");
        let right = self.right.map(Either::Right).name("connect_right");
        KeyedStream::with_inputs(left, vec![right], key_fn)
    }
}

/// How the join operator pairs records.
#[derive(Debug, Clone, Copy)]
enum JoinKind {
    /// Every pair, forever.
    Inner,
    /// `a.ts + lower <= b.ts <= a.ts + upper`.
    Interval { lower: i64, upper: i64 },
}

/// A record kept by the join: its side's store holds it under `(ts, seq)`.
type Slot = (i64, u64);

/// A pending removal from a side's store once the watermark passes.
type Expiry<K> = (K, bool, Slot);

struct JoinOperator<A, B, K, O, KF, TA, TB, F> {
    kind: JoinKind,
    key_fn: KF,
    ts_a: TA,
    ts_b: TB,
    f: F,
    left: MapStore<K, Slot, A, SerdeCodec>,
    right: MapStore<K, Slot, B, SerdeCodec>,
    opts: [StoreOptions; 2],
    seq: u64,
    expiry: BTreeMap<i64, Vec<Expiry<K>>>,
    watermark: i64,
    lifecycle: StoreLifecycle,
    matches: Vec<Slot>,
    out: Vec<O>,
    next: Box<dyn Collector<O>>,
    op: usize,
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
    crate::stores::paced_flow!();
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
        let root = crate::stores::checkpoint_root(ctx, "join state")?;
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

impl<A, B, K, KF> KeyedStream<Either<A, B>, K, KF>
where
    A: Data,
    B: Data,
    K: Hash + Eq + Data + StateKey,
    KF: Fn(&Either<A, B>) -> K + Clone + Send + 'static,
{
    /// Emits `f(a, b)` for every pair of records of equal key, whatever
    /// their order of arrival; both sides are kept forever (the state
    /// grows with the input: use it on bounded inputs or small sides).
    pub fn inner_join<O, F>(self, f: F) -> Stream<O>
    where
        O: Send + 'static,
        F: FnMut(&A, &B) -> O + Clone + Send + 'static,
    {
        self.join(JoinKind::Inner, |_: &A| 0, |_: &B| 0, f, "inner_join")
    }

    /// Emits `f(a, b)` for every pair of records of equal key with
    /// `ts_a(a) + lower_ms <= ts_b(b) <= ts_a(a) + upper_ms`. A record
    /// leaves the state once the watermark rules out any further match.
    pub fn interval_join<O, TA, TB, F>(self, lower_ms: i64, upper_ms: i64, ts_a: TA, ts_b: TB, f: F) -> Stream<O>
    where
        O: Send + 'static,
        TA: Fn(&A) -> i64 + Clone + Send + 'static,
        TB: Fn(&B) -> i64 + Clone + Send + 'static,
        F: FnMut(&A, &B) -> O + Clone + Send + 'static,
    {
        if lower_ms > upper_ms {
            self.record_error(format!(
                "interval join: lower bound {lower_ms} ms is above upper bound {upper_ms} ms"
            ));
        }
        self.join(
            JoinKind::Interval {
                lower: lower_ms,
                upper: upper_ms,
            },
            ts_a,
            ts_b,
            f,
            "interval_join",
        )
    }

    /// Emits `f(window, a, b)` for every pair of records of equal key in
    /// the same event-time window (tumbling or sliding), when the window
    /// fires; late records come out as [`Windowed::Late`].
    pub fn window_join<O, TA, TB, F>(
        self,
        windows: Windows,
        ts_a: TA,
        ts_b: TB,
        f: F,
    ) -> Stream<Windowed<O, Either<A, B>>>
    where
        A: Clone,
        B: Clone,
        O: Send + 'static,
        TA: Fn(&A) -> i64 + Clone + Send + 'static,
        TB: Fn(&B) -> i64 + Clone + Send + 'static,
        F: FnMut(Window, &A, &B) -> O + Clone + Send + 'static,
    {
        if let Windows::Session { .. } = windows {
            self.record_error("window join: use tumbling or sliding windows".into());
        }
        let ts = move |e: &Either<A, B>| match e {
            Either::Left(a) => ts_a(a),
            Either::Right(b) => ts_b(b),
        };
        let mut f = f;
        self.window(windows, ts)
            .process(move |_: &K, w: Window, records: &[Either<A, B>], out: &mut Vec<O>| {
                for a in records.iter().filter_map(|r| match r {
                    Either::Left(a) => Some(a),
                    Either::Right(_) => None,
                }) {
                    for b in records.iter().filter_map(|r| match r {
                        Either::Right(b) => Some(b),
                        Either::Left(_) => None,
                    }) {
                        out.push(f(w, a, b));
                    }
                }
            })
    }

    fn join<O, TA, TB, F>(self, kind: JoinKind, ts_a: TA, ts_b: TB, f: F, name: &str) -> Stream<O>
    where
        O: Send + 'static,
        TA: Fn(&A) -> i64 + Clone + Send + 'static,
        TB: Fn(&B) -> i64 + Clone + Send + 'static,
        F: FnMut(&A, &B) -> O + Clone + Send + 'static,
    {
        let bytes = self.record_bytes.unwrap_or(DEFAULT_MAX_RECORD_BYTES);
        let (graph, p, q, key_fn, edges) = self.exchange(name);
        let edges_in = edges.clone();
        let chain: ChainFn<O> = Box::new(move |ctx, j, down| {
            let inputs = ctx.inputs_from::<Either<A, B>>(&edges, j);
            let opts = [store_options(ctx, j, q, bytes)?, store_options(ctx, j, q, bytes)?];
            let op = JoinOperator {
                kind,
                key_fn: key_fn.clone(),
                ts_a: ts_a.clone(),
                ts_b: ts_b.clone(),
                f: f.clone(),
                left: MapStore::create(opts[0].clone())?,
                right: MapStore::create(opts[1].clone())?,
                opts,
                seq: 0,
                expiry: BTreeMap::new(),
                watermark: MIN_WATERMARK,
                lifecycle: StoreLifecycle::paced(),
                matches: Vec::new(),
                out: Vec::with_capacity(ctx.config.batch_size),
                next: down,
                op: 0,
            };
            Ok(Box::new(InputTask::new(inputs, Box::new(op), ctx.config.batch_size)) as Box<dyn Task>)
        });
        Stream::new(graph, q, vec![name.to_string()], p, edges_in, chain)
    }
}
