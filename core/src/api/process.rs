//! Keyed process functions with timers: the general event-time operator.
//!
//! A [`KeyedProcessFunction`] sees one record at a time with the state of
//! its key (any serde type, kept in the memory-mapped backend and
//! checkpointed incrementally) and may register event-time and
//! processing-time timers for that key; when a timer fires it is called
//! back with the key's state again. Timers are state too
//! ([`crate::operators::timers`]): a checkpoint holds them and recovery restores them.
//!
//! Order guarantees: results of timers fired by a watermark are handed on
//! before that watermark; event-time timers fire in time order; a timer
//! registered for a time the watermark already passed fires at the next
//! watermark.

use crate::api::pipeline::{KeyedStream, Stream};
use crate::data::Data;
use crate::operators::stores::StoreLifecycle;
use crate::operators::timers::TimerService;
use crate::runtime::plan::ChainFn;
use crate::runtime::task::{InputTask, Task};
use crate::state::{MapStore, StateKey};
use crate::watermark::MIN_WATERMARK;
use std::hash::Hash;

pub use crate::operators::process::*;

impl<T, K, KF> KeyedStream<T, K, KF>
where
    T: Data,
    K: Hash + Eq + Data,
    KF: Fn(&T) -> K + Clone + Send + 'static,
{
    /// Processes records with a [`KeyedProcessFunction`]: per-key state of
    /// any serde type in the memory-mapped backend, and event-time and
    /// processing-time timers, all checkpointed.
    pub fn process_function<O, F>(self, f: F) -> Stream<O>
    where
        K: StateKey,
        O: Send + 'static,
        F: KeyedProcessFunction<K, T, O>,
    {
        let (graph, p, q, key_fn, edges) = self.exchange("process");
        let edges_in = edges.clone();
        let chain: ChainFn<O> = Box::new(move |ctx, j, down| {
            let inputs = ctx.inputs_from::<T>(&edges, j);
            let state_opts = store_options(ctx, j, q, F::MAX_STATE_BYTES)?;
            let timer_opts = store_options(ctx, j, q, 1)?;
            let buffer_opts = store_options(ctx, j, q, F::MAX_BUFFERED_BYTES)?;
            let op = ProcessOperator {
                key_fn: key_fn.clone(),
                f: f.clone(),
                state: Some(MapStore::create(state_opts.clone())?),
                timers: Some(TimerService::create(timer_opts.clone())?),
                buffers: Some(Buffers::new(MapStore::create(buffer_opts.clone())?)),
                state_opts,
                timer_opts,
                buffer_opts,
                lifecycle: StoreLifecycle::paced(),
                watermark: MIN_WATERMARK,
                out: Vec::with_capacity(ctx.config.batch_size),
                ops: Vec::new(),
                next: down,
                op: 0,
                _in: std::marker::PhantomData,
            };
            Ok(Box::new(InputTask::new(inputs, Box::new(op), ctx.config.batch_size)) as Box<dyn Task>)
        });
        Stream::new(graph, q, vec!["process".to_string()], p, edges_in, chain)
    }
}
