//! Event-time windows over a keyed stream: tumbling, sliding (hop) and
//! session windows, half-open `[start, end)` and aligned to epoch 0, with
//! an incremental aggregate, a reduce, or a function over all the
//! window's records, and allowed lateness.
//!
//! Semantics (those of Flink's event-time trigger):
//! - a record with timestamp `ts` belongs to every window containing `ts`;
//! - a window fires once the watermark reaches `end - 1`, its largest
//!   timestamp; with allowed lateness `L` its contents are kept until the
//!   watermark reaches `end - 1 + L`, and every record arriving in that
//!   time fires the window again with the updated result;
//! - a record all of whose windows are past `end - 1 + L` is **late**: it
//!   is emitted as [`Windowed::Late`], never dropped silently;
//! - session windows start as `[ts, ts + gap)` and merge with every window
//!   of the key they overlap or touch.
//!
//! State: the windows of each key and whether they fired, and the window
//! contents (an accumulator, or every record), live in [`MapStore`]s of
//! the memory-mapped backend and are checkpointed incrementally. The queue
//! of pending firings is rebuilt from them on restore, so nothing fires
//! twice and nothing is forgotten across a recovery.

use crate::api::pipeline::{KeyedStream, Stream};
use crate::data::Data;
use crate::operators::process::store_options;
use crate::operators::stores::StoreLifecycle;
use crate::runtime::plan::ChainFn;
use crate::runtime::task::{InputTask, Task};
use crate::state::{MapStore, StateKey, StoreOptions};
use crate::watermark::MIN_WATERMARK;
use std::collections::BTreeMap;
use std::hash::Hash;

pub use crate::operators::window::*;

/// A keyed stream cut into event-time windows; finish it with
/// [`WindowedStream::aggregate`], [`WindowedStream::reduce`] or
/// [`WindowedStream::process`].
pub struct WindowedStream<T, K, KF, TF> {
    keyed: KeyedStream<T, K, KF>,
    windows: Windows,
    ts_fn: TF,
    lateness_ms: i64,
    element_bytes: usize,
}

/// Default room for one encoded record of [`WindowedStream::process`].
pub const DEFAULT_MAX_ELEMENT_BYTES: usize = 512;

impl<T, K, KF> KeyedStream<T, K, KF>
where
    T: Data,
    K: Hash + Eq + Data,
    KF: Fn(&T) -> K + Clone + Send + 'static,
{
    /// Cuts the stream into event-time windows; `timestamp` gives each
    /// record's event time (epoch milliseconds). Windows fire on the
    /// watermark: give the stream one with
    /// [`crate::Stream::assign_watermarks`] upstream.
    ///
    /// ```
    /// use weir_core::window::{Windowed, Windows};
    /// use weir_core::time::WatermarkStrategy;
    /// # use std::sync::{Arc, Mutex};
    /// # let p = weir_core::Pipeline::new("doc");
    /// # let items = Arc::new(vec![(1u64, 1_000i64), (1, 9_000), (1, 12_000)]);
    /// # let out = Arc::new(Mutex::new(Vec::new()));
    /// # let sink_out = out.clone();
    /// // (key, timestamp) records; count per key per 10 s.
    /// p.source("events", 1, move |i, n| weir_core::VecSource::new(items.clone(), i, n))
    ///     .assign_watermarks(WatermarkStrategy::ascending(|e: &(u64, i64)| e.1))
    ///     .key_by(|e: &(u64, i64)| e.0)
    ///     .window(Windows::tumbling(10_000), |e: &(u64, i64)| e.1)
    ///     .process(|k: &u64, w, records: &[(u64, i64)], out: &mut Vec<(u64, i64, usize)>| {
    ///         out.push((*k, w.start, records.len()))
    ///     })
    ///     .flat_map(Windowed::result)
    ///     .sink("collect", move |_| weir_core::CollectSink::new(sink_out.clone()));
    /// p.run(weir_core::RuntimeConfig::default()).unwrap().join().unwrap();
    /// assert_eq!(*out.lock().unwrap(), vec![(1, 0, 2), (1, 10_000, 1)]);
    /// ```
    pub fn window<TF>(self, windows: Windows, timestamp: TF) -> WindowedStream<T, K, KF, TF>
    where
        TF: Fn(&T) -> i64 + Clone + Send + 'static,
    {
        if let Err(e) = windows.validate() {
            self.record_error(e);
        }
        WindowedStream {
            keyed: self,
            windows,
            ts_fn: timestamp,
            lateness_ms: 0,
            element_bytes: DEFAULT_MAX_ELEMENT_BYTES,
        }
    }
}

impl<T, K, KF, TF> WindowedStream<T, K, KF, TF>
where
    T: Data,
    K: Hash + Eq + Data + StateKey,
    KF: Fn(&T) -> K + Clone + Send + 'static,
    TF: Fn(&T) -> i64 + Clone + Send + 'static,
{
    /// Keeps each window's contents `ms` after it fired: records arriving
    /// in that time fire it again with the updated result (default 0).
    pub fn allowed_lateness_ms(mut self, ms: i64) -> Self {
        if ms < 0 {
            self.keyed
                .record_error(format!("allowed lateness {ms} ms must not be negative"));
        }
        self.lateness_ms = ms.max(0);
        self
    }

    /// Room for one encoded record kept by [`WindowedStream::process`]
    /// (default [`DEFAULT_MAX_ELEMENT_BYTES`]).
    pub fn max_element_bytes(mut self, bytes: usize) -> Self {
        self.element_bytes = bytes;
        self
    }

    /// Aggregates each window incrementally; `result(key, window, output)`
    /// makes the emitted record.
    pub fn aggregate<A, O, R>(self, agg: A, result: R) -> Stream<Windowed<O, T>>
    where
        A: AggregateFunction<T>,
        O: Send + 'static,
        R: FnMut(&K, Window, A::Output) -> O + Clone + Send + 'static,
    {
        self.build(A::MAX_ACC_BYTES, "window_aggregate", move |opts| {
            Ok(AggBody {
                agg: agg.clone(),
                result: result.clone(),
                store: MapStore::create(opts)?,
            })
        })
    }

    /// Reduces each window's records pairwise with `f`; `result(key,
    /// window, reduced)` makes the emitted record.
    pub fn reduce<F, O, R>(self, f: F, result: R) -> Stream<Windowed<O, T>>
    where
        T: Clone,
        F: Fn(&T, &T) -> T + Clone + Send + 'static,
        O: Send + 'static,
        R: FnMut(&K, Window, T) -> O + Clone + Send + 'static,
    {
        let bytes = self.element_bytes;
        self.build(bytes, "window_reduce", move |opts| {
            Ok(AggBody {
                agg: Reduce(f.clone()),
                result: result.clone(),
                store: MapStore::create(opts)?,
            })
        })
    }

    /// Keeps every record of each window and calls `f(key, window,
    /// records, out)` with all of them (in arrival order) when it fires.
    pub fn process<O, P>(self, f: P) -> Stream<Windowed<O, T>>
    where
        T: Clone,
        O: Send + 'static,
        P: FnMut(&K, Window, &[T], &mut Vec<O>) + Clone + Send + 'static,
    {
        let bytes = self.element_bytes;
        self.build(bytes, "window_process", move |opts| {
            Ok(ListBody {
                f: f.clone(),
                store: MapStore::create(opts)?,
                seq: 0,
                scratch: Vec::new(),
                records: Vec::new(),
                results: Vec::new(),
            })
        })
    }

    fn build<O, B>(
        self,
        value_bytes: usize,
        name: &str,
        make_body: impl Fn(StoreOptions) -> crate::error::Result<B> + Clone + Send + 'static,
    ) -> Stream<Windowed<O, T>>
    where
        O: Send + 'static,
        B: WindowBody<K, T, O> + 'static,
    {
        let WindowedStream {
            keyed,
            windows,
            ts_fn,
            lateness_ms,
            ..
        } = self;
        let (graph, p, q, key_fn, edges) = keyed.exchange(name);
        let edges_in = edges.clone();
        let chain: ChainFn<Windowed<O, T>> = Box::new(move |ctx, j, down| {
            let inputs = ctx.inputs_from::<T>(&edges, j);
            let meta_opts = store_options(ctx, j, q, 1)?;
            let body_opts = store_options(ctx, j, q, value_bytes)?;
            let fired_opts = store_options(ctx, j, q, 8)?;
            let op = WindowOperator {
                key_fn: key_fn.clone(),
                ts_fn: ts_fn.clone(),
                windows,
                lateness: lateness_ms,
                meta: MapStore::create(meta_opts.clone())?,
                meta_opts,
                body: make_body(body_opts.clone())?,
                body_opts,
                panes: match windows {
                    Windows::Sliding { size_ms, slide_ms } if size_ms % slide_ms == 0 => Some((size_ms, slide_ms)),
                    _ => None,
                },
                fired_until: MapStore::create(fired_opts.clone())?,
                fired_opts,
                pane_scratch: Vec::new(),
                queue: BTreeMap::new(),
                watermark: MIN_WATERMARK,
                lifecycle: StoreLifecycle::paced(),
                out: Vec::with_capacity(ctx.config.batch_size),
                assigned: Vec::new(),
                next: down,
                op: 0,
            };
            Ok(Box::new(InputTask::new(inputs, Box::new(op), ctx.config.batch_size)) as Box<dyn Task>)
        });
        Stream::new(graph, q, vec![name.to_string()], p, edges_in, chain)
    }
}
