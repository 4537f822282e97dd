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

use crate::api::pipeline::{KeyedStream, Stream};
use crate::data::Data;
use crate::operators::process::store_options;
use crate::operators::stores::StoreLifecycle;
use crate::operators::window::{Window, Windowed, Windows};
use crate::runtime::plan::ChainFn;
use crate::runtime::task::{InputTask, Task};
use crate::state::{MapStore, StateKey};
use crate::watermark::MIN_WATERMARK;
use std::collections::BTreeMap;
use std::hash::Hash;

pub use crate::operators::join::*;

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
