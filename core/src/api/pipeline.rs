//! The dataflow API: build a typed graph of sources, operators and sinks,
//! then run it.
//!
//! A [`Stream<T>`] is the open end of a chain: operators added with a
//! forward edge (`map`, `filter`, `flat_map`) are fused into the same task
//! and called directly, batch by batch. An exchange (`key_by`, `rebalance`,
//! `union`) ends the chain: it becomes rings, one per pair of producer and
//! consumer subtask, and a new chain starts at the consumer side. A sink
//! closes a chain. Nothing runs until [`Pipeline::run`], which builds every
//! task and places it on a worker.

use std::cell::RefCell;
use std::hash::Hash;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use crate::data::Data;
use crate::error::{Error, Result};
use crate::operators::keyed::{KeyedProcess, MappedKeyedProcess, Output, PodCell};
use crate::operators::stateless::{Filter, FlatMap, Map, SinkTail};
use crate::runtime::collector::Collector;
use crate::runtime::config::RuntimeConfig;
use crate::runtime::job::JobHandle;
use crate::runtime::output::{HashOutput, OutputKeep, RebalanceOutput};
use crate::runtime::plan::{BuildCtx, ChainFn, ChainGroup, EdgeId, Plan};
use crate::runtime::sink::Sink;
use crate::runtime::source::Source;
use crate::runtime::task::{InputTask, SourceTask, Task};
use crate::state::key_groups::DEFAULT_MAX_PARALLELISM;

/// Most parallel instances of one operator.
pub const MAX_PARALLELISM: usize = 4096;

/// An exchange between two chains: `from` producer subtasks, `to` consumers.
struct EdgeSpec {
    from: usize,
    to: usize,
    from_group: usize,
    to_group: Option<usize>,
}

#[derive(Default)]
pub(crate) struct Graph {
    name: String,
    max_parallelism: usize,
    groups: Vec<ChainGroup>,
    edges: Vec<EdgeSpec>,
    /// Streams dropped without being consumed (their operators would never run).
    dangling: Vec<String>,
    /// Build-time errors recorded by methods that cannot return one.
    errors: Vec<String>,
    /// Last operators of the streams not consumed yet.
    open_streams: Vec<String>,
}

/// A dataflow job under construction.
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use weir_core::{CollectSink, Pipeline, RuntimeConfig, VecSource};
///
/// let words: Arc<Vec<String>> = Arc::new(["a", "b", "a", "c", "a"].map(String::from).to_vec());
/// let counts = Arc::new(Mutex::new(Vec::new()));
///
/// let pipeline = Pipeline::new("word-count");
/// let out = counts.clone();
/// pipeline
///     .source("words", 2, move |i, p| VecSource::new(words.clone(), i, p))
///     .map(|w: String| (w, 1u64))
///     .key_by(|(w, _): &(String, u64)| w.clone())
///     .parallelism(2)
///     .process(|w: &String, n: &mut u64, (_, one): (String, u64), out| {
///         *n += one;
///         out.emit((w.clone(), *n));
///     })
///     .sink("collect", move |_| CollectSink::new(out.clone()));
///
/// pipeline.run(RuntimeConfig::default()).unwrap().join().unwrap();
///
/// let mut got = counts.lock().unwrap().clone();
/// got.sort();
/// let expected = [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("c", 1)].map(|(w, n)| (w.to_string(), n));
/// assert_eq!(got, expected);
/// ```
pub struct Pipeline {
    graph: Rc<RefCell<Graph>>,
}

impl Pipeline {
    /// An empty pipeline named `name` (used in logs and checkpoints).
    pub fn new(name: &str) -> Self {
        Pipeline {
            graph: Rc::new(RefCell::new(Graph {
                name: name.to_string(),
                max_parallelism: DEFAULT_MAX_PARALLELISM,
                ..Graph::default()
            })),
        }
    }

    /// The job's name.
    pub fn name(&self) -> String {
        self.graph.borrow().name.clone()
    }

    /// Sets the number of key groups (default 128): the most subtasks any
    /// keyed operator of this job can ever run with, now or after rescaling.
    pub fn max_parallelism(self, max_parallelism: usize) -> Self {
        if max_parallelism == 0 || max_parallelism > MAX_PARALLELISM {
            self.graph.borrow_mut().errors.push(format!(
                "max_parallelism = {max_parallelism}: must be between 1 and {MAX_PARALLELISM}"
            ));
        }
        self.graph.borrow_mut().max_parallelism = max_parallelism;
        self
    }

    /// Adds a source with `parallelism` instances; `factory(i, parallelism)`
    /// creates instance `i`.
    pub fn source<T, S, F>(&self, name: &str, parallelism: usize, mut factory: F) -> Stream<T>
    where
        T: Send + 'static,
        S: Source<T>,
        F: FnMut(usize, usize) -> S + Send + 'static,
    {
        check_parallelism(&self.graph, name, parallelism);
        let chain: ChainFn<T> = Box::new(move |ctx, i, down| {
            let source = factory(i, parallelism);
            Ok(Box::new(SourceTask::new(source, down, ctx.config.batch_size)) as Box<dyn Task>)
        });
        Stream::new(
            self.graph.clone(),
            parallelism,
            vec![name.to_string()],
            0,
            Vec::new(),
            chain,
        )
    }

    /// Starts the job on worker threads and returns at once.
    ///
    /// Fails before starting anything if the configuration is invalid, the
    /// graph is incomplete (a stream that never reaches a sink), or the
    /// checkpoint to restore from cannot be used.
    pub fn run(self, config: RuntimeConfig) -> Result<JobHandle> {
        config.validate()?;
        if Rc::strong_count(&self.graph) > 1 {
            let open = self.graph.borrow().open_streams.join("', '");
            return Err(Error::InvalidPipeline(format!(
                "the stream after '{open}' is still open: end every stream with a sink (or drop it) before run"
            )));
        }
        let graph = std::mem::take(&mut *self.graph.borrow_mut());
        if let Some(e) = graph.errors.first() {
            return Err(Error::InvalidPipeline(e.clone()));
        }
        if let Some(d) = graph.dangling.first() {
            return Err(Error::InvalidPipeline(format!(
                "the stream after '{d}' is never consumed: end it with a sink"
            )));
        }
        if graph.groups.is_empty() {
            return Err(Error::InvalidPipeline(format!(
                "job '{}' has no sink: nothing would run",
                graph.name
            )));
        }
        for (k, e) in graph.edges.iter().enumerate() {
            if e.to > graph.max_parallelism {
                return Err(Error::InvalidPipeline(format!(
                    "exchange {k} feeds {} subtasks but max_parallelism is {}: raise max_parallelism",
                    e.to, graph.max_parallelism
                )));
            }
        }
        let plan = Plan {
            name: graph.name,
            max_parallelism: graph.max_parallelism,
            edges: graph.edges.iter().map(|e| (e.from, e.to)).collect(),
            edge_groups: graph
                .edges
                .iter()
                .enumerate()
                .map(|(k, e)| {
                    e.to_group.map(|to| (e.from_group, to)).ok_or_else(|| {
                        Error::InvalidPipeline(format!("exchange {k} has no consumer: end every stream with a sink"))
                    })
                })
                .collect::<Result<_>>()?,
            groups: graph.groups,
        };
        crate::runtime::job::start(plan, config)
    }
}

fn check_parallelism(graph: &Rc<RefCell<Graph>>, name: &str, parallelism: usize) {
    if parallelism == 0 || parallelism > MAX_PARALLELISM {
        graph.borrow_mut().errors.push(format!(
            "operator '{name}': parallelism {parallelism} must be between 1 and {MAX_PARALLELISM}"
        ));
    }
}

/// Marks a stream as consumed; a stream dropped while armed is reported by
/// [`Pipeline::run`] as dangling.
struct Guard {
    graph: Rc<RefCell<Graph>>,
    last_op: String,
    armed: bool,
}

impl Guard {
    fn new(graph: Rc<RefCell<Graph>>, last_op: String) -> Self {
        graph.borrow_mut().open_streams.push(last_op.clone());
        Guard {
            graph,
            last_op,
            armed: true,
        }
    }

    fn forget_open(&self) {
        if let Ok(mut g) = self.graph.try_borrow_mut() {
            if let Some(i) = g.open_streams.iter().position(|n| *n == self.last_op) {
                g.open_streams.swap_remove(i);
            }
        }
    }

    /// The stream was consumed by an operator, an exchange or a sink.
    fn disarm(&mut self) {
        if self.armed {
            self.armed = false;
            self.forget_open();
        }
    }

    fn rename(&mut self, name: &str) {
        if let Ok(mut g) = self.graph.try_borrow_mut() {
            if let Some(n) = g.open_streams.iter_mut().find(|n| **n == self.last_op) {
                *n = name.to_string();
            }
        }
        self.last_op = name.to_string();
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.armed {
            self.forget_open();
            if let Ok(mut g) = self.graph.try_borrow_mut() {
                g.dangling.push(self.last_op.clone());
            }
        }
    }
}

/// A typed stream of records: the open end of a chain of operators.
///
/// Operators added with `map`, `filter` and `flat_map` are chained: they run
/// in the same task, at the same parallelism, as plain calls.
pub struct Stream<T> {
    graph: Rc<RefCell<Graph>>,
    parallelism: usize,
    ops: Vec<String>,
    input_rings: usize,
    /// Exchange edges feeding this chain.
    input_edges: Vec<EdgeId>,
    chain: ChainFn<T>,
    guard: Guard,
}

impl<T: Send + 'static> Stream<T> {
    pub(crate) fn new(
        graph: Rc<RefCell<Graph>>,
        parallelism: usize,
        ops: Vec<String>,
        input_rings: usize,
        input_edges: Vec<EdgeId>,
        chain: ChainFn<T>,
    ) -> Self {
        let guard = Guard::new(graph.clone(), ops.last().cloned().unwrap_or_default());
        Stream {
            graph,
            parallelism,
            ops,
            input_rings,
            input_edges,
            chain,
            guard,
        }
    }

    /// Registers this chain as a group of the graph; returns its index.
    fn push_group(&self, g: &mut Graph, group: ChainGroup) -> usize {
        let index = g.groups.len();
        for &e in &self.input_edges {
            g.edges[e].to_group = Some(index);
        }
        g.groups.push(group);
        index
    }

    /// Number of parallel instances of this stream's chain.
    pub fn parallelism(&self) -> usize {
        self.parallelism
    }

    /// Renames the last operator (default names: `map`, `filter`, ...).
    /// Names appear in metrics and in error messages.
    pub fn name(mut self, name: &str) -> Self {
        if let Some(last) = self.ops.last_mut() {
            *last = name.to_string();
        }
        self.guard.rename(name);
        self
    }

    /// Adds a chained operator; `wrap(op_index, batch_size, downstream)`
    /// builds it in front of the downstream collector.
    pub(crate) fn chained<U: Send + 'static>(
        mut self,
        default_name: &str,
        mut wrap: impl FnMut(usize, usize, Box<dyn Collector<U>>) -> Box<dyn Collector<T>> + Send + 'static,
    ) -> Stream<U> {
        self.guard.disarm();
        let op = self.ops.len();
        let mut ops = std::mem::take(&mut self.ops);
        ops.push(default_name.to_string());
        let mut prev = std::mem::replace(&mut self.chain, Box::new(|_, _, _| unreachable!("chain moved")));
        let chain: ChainFn<U> = Box::new(move |ctx, i, down| {
            let batch = ctx.config.batch_size;
            prev(ctx, i, wrap(op, batch, down))
        });
        let input_edges = std::mem::take(&mut self.input_edges);
        Stream::new(
            self.graph.clone(),
            self.parallelism,
            ops,
            self.input_rings,
            input_edges,
            chain,
        )
    }

    /// Transforms every record.
    pub fn map<U, F>(self, f: F) -> Stream<U>
    where
        U: Send + 'static,
        F: FnMut(T) -> U + Clone + Send + 'static,
    {
        self.chained("map", move |op, batch, next| {
            Box::new(Map {
                f: f.clone(),
                out: Vec::with_capacity(batch),
                next,
                op,
                _in: std::marker::PhantomData,
            })
        })
    }

    /// Keeps the records for which `f` is true.
    pub fn filter<F>(self, f: F) -> Stream<T>
    where
        F: FnMut(&T) -> bool + Clone + Send + 'static,
    {
        self.chained("filter", move |op, _, next| Box::new(Filter { f: f.clone(), next, op }))
    }

    /// Replaces every record by zero or more records.
    pub fn flat_map<U, I, F>(self, f: F) -> Stream<U>
    where
        U: Send + 'static,
        I: IntoIterator<Item = U> + 'static,
        F: FnMut(T) -> I + Clone + Send + 'static,
    {
        self.chained("flat_map", move |op, batch, next| {
            Box::new(FlatMap {
                f: f.clone(),
                out: Vec::with_capacity(batch),
                next,
                op,
                _in: std::marker::PhantomData,
            })
        })
    }

    /// Gives the stream event time: timestamps by the strategy's function
    /// and watermarks bounded by its out-of-orderness, generated here (see
    /// [`crate::operators::time`]). Put it right after the source, so that idleness
    /// of a source subtask is noticed; watermarks arriving from upstream
    /// are replaced by this operator's own (end-of-input excepted).
    ///
    /// ```
    /// use weir_core::time::WatermarkStrategy;
    /// # use std::sync::Arc;
    /// # let p = weir_core::Pipeline::new("doc");
    /// # let items = Arc::new(vec![(1_000i64, 1u64)]);
    /// let events = p
    ///     .source("events", 1, move |i, n| weir_core::VecSource::new(items.clone(), i, n))
    ///     .assign_watermarks(WatermarkStrategy::bounded(100, |e: &(i64, u64)| e.0));
    /// # drop(events);
    /// ```
    pub fn assign_watermarks<F>(self, strategy: crate::operators::time::WatermarkStrategy<F>) -> Stream<T>
    where
        F: Fn(&T) -> i64 + Clone + Send + 'static,
    {
        if let Err(e) = strategy.validate() {
            self.graph.borrow_mut().errors.push(e);
        }
        self.chained("watermarks", move |op, _, next| {
            Box::new(crate::operators::time::WatermarkAssigner::new(
                strategy.clone(),
                next,
                op,
            ))
        })
    }

    /// Ends the chain in a sink; `factory(i)` creates the sink of subtask `i`.
    pub fn sink<S, F>(mut self, name: &str, mut factory: F)
    where
        S: Sink<T>,
        F: FnMut(usize) -> S + Send + 'static,
    {
        self.guard.disarm();
        let op = self.ops.len();
        let mut ops = std::mem::take(&mut self.ops);
        ops.push(name.to_string());
        let mut chain = std::mem::replace(&mut self.chain, Box::new(|_, _, _| unreachable!("chain moved")));
        let p = self.parallelism;
        // Built whole per attempt, and one subtask again for a dedup
        // recovery: both from the job thread, one at a time.
        let one = Arc::new(Mutex::new(move |ctx: &mut BuildCtx, i: usize| {
            chain(ctx, i, Box::new(SinkTail { sink: factory(i), op }))
        }));
        let again = Arc::clone(&one);
        let group = ChainGroup {
            ops,
            parallelism: p,
            input_rings: self.input_rings,
            build: Box::new(move |ctx| {
                let mut build = one.lock().unwrap_or_else(|e| e.into_inner());
                (0..p).map(|i| (*build)(ctx, i)).collect()
            }),
            rebuild: (self.input_rings > 0).then(|| {
                Box::new(move |ctx: &mut BuildCtx, i: usize| {
                    let mut build = again.lock().unwrap_or_else(|e| e.into_inner());
                    (*build)(ctx, i)
                }) as crate::runtime::plan::SubtaskBuild
            }),
            feeds_exchange: false,
        };
        let graph = self.graph.clone();
        self.push_group(&mut graph.borrow_mut(), group);
    }

    /// Closes this chain into an exchange edge to `to` subtasks; `tail(ctx,
    /// edge, i)` builds the chain's end for subtask `i`. With `rebuildable`
    /// (the tail can take over a failed predecessor's outboxes when
    /// [`BuildCtx::resuming`]), a chain that reads rings can have one
    /// subtask built again, for a dedup recovery of that subtask alone.
    fn close_into_edge(
        mut self,
        to: usize,
        rebuildable: bool,
        mut tail: impl FnMut(&mut BuildCtx, EdgeId, usize) -> Result<Box<dyn Collector<T>>> + Send + 'static,
    ) -> EdgeId {
        self.guard.disarm();
        let graph = self.graph.clone();
        let mut g = graph.borrow_mut();
        let edge = g.edges.len();
        let from_group = g.groups.len();
        g.edges.push(EdgeSpec {
            from: self.parallelism,
            to,
            from_group,
            to_group: None,
        });
        let p = self.parallelism;
        let mut chain = std::mem::replace(&mut self.chain, Box::new(|_, _, _| unreachable!("chain moved")));
        // Built whole per attempt, and one subtask again for a dedup
        // recovery: both from the job thread, one at a time.
        let one = Arc::new(Mutex::new(move |ctx: &mut BuildCtx, i: usize| {
            let t = tail(ctx, edge, i)?;
            chain(ctx, i, t)
        }));
        let again = Arc::clone(&one);
        let group = ChainGroup {
            ops: std::mem::take(&mut self.ops),
            parallelism: p,
            input_rings: self.input_rings,
            build: Box::new(move |ctx| {
                let mut build = one.lock().unwrap_or_else(|e| e.into_inner());
                (0..p).map(|i| (*build)(ctx, i)).collect()
            }),
            rebuild: (rebuildable && self.input_rings > 0).then(|| {
                Box::new(move |ctx: &mut BuildCtx, i: usize| {
                    let mut build = again.lock().unwrap_or_else(|e| e.into_inner());
                    (*build)(ctx, i)
                }) as crate::runtime::plan::SubtaskBuild
            }),
            feeds_exchange: true,
        };
        let index = self.push_group(&mut g, group);
        debug_assert_eq!(index, from_group);
        edge
    }

    /// Partitions the stream by key: every record with the same key goes to
    /// the same subtask of the next operator (see [`crate::operators::keyed`]).
    pub fn key_by<K, KF>(self, key_fn: KF) -> KeyedStream<T, K, KF>
    where
        T: Data,
        K: Hash + Eq + Data,
        KF: Fn(&T) -> K + Clone + Send + 'static,
    {
        let parallelism = self.parallelism;
        KeyedStream {
            upstream: self,
            others: Vec::new(),
            record_bytes: None,
            key_fn,
            parallelism,
            _k: std::marker::PhantomData,
        }
    }

    /// Redistributes records round-robin over `parallelism` subtasks of the
    /// operators that follow.
    pub fn rebalance(self, parallelism: usize) -> Stream<T>
    where
        T: Data,
    {
        self.union_all(Vec::new(), parallelism)
    }

    /// Merges this stream with `others` (same record type) into one stream
    /// of `parallelism` subtasks, each reading from every upstream subtask.
    pub fn union(self, others: Vec<Stream<T>>) -> Stream<T>
    where
        T: Data,
    {
        let p = self.parallelism;
        self.union_all(others, p)
    }

    fn union_all(self, others: Vec<Stream<T>>, parallelism: usize) -> Stream<T>
    where
        T: Data,
    {
        let graph = self.graph.clone();
        let name = if others.is_empty() { "rebalance" } else { "union" };
        check_parallelism(&graph, name, parallelism);
        for s in others.iter().filter(|s| !Rc::ptr_eq(&s.graph, &graph)) {
            let name = s.ops.last().cloned().unwrap_or_default();
            graph.borrow_mut().errors.push(format!(
                "union: the stream after '{name}' belongs to another pipeline; build both in the same one"
            ));
        }
        let mut edges = Vec::new();
        let mut input_rings = 0;
        for s in std::iter::once(self).chain(others) {
            input_rings += s.parallelism;
            let keeps = OutputKeeps::new(s.parallelism, s.input_rings > 0);
            edges.push(s.close_into_edge(parallelism, true, move |ctx, edge, i| {
                if let Some(checkpoint) = ctx.resuming {
                    let out = RebalanceOutput::resumed(keeps.slot(i), checkpoint).map_err(|e| keeps.cannot(i, e))?;
                    return Ok(Box::new(out) as Box<dyn Collector<T>>);
                }
                let out = RebalanceOutput::new(ctx.producers::<T>(edge, i), i % parallelism);
                Ok(match keeps.fresh(ctx, i) {
                    Some(keep) => Box::new(out.keeping(keep)) as Box<dyn Collector<T>>,
                    None => Box::new(out),
                })
            }));
        }
        let edges_in = edges.clone();
        let chain: ChainFn<T> = Box::new(move |ctx, j, down| {
            let inputs = edges.iter().flat_map(|&e| ctx.consumers::<T>(e, j)).collect();
            Ok(Box::new(InputTask::new(inputs, down, ctx.config.batch_size)) as Box<dyn Task>)
        });
        // The exchange's consumer side is the head of the new chain.
        Stream::new(graph, parallelism, vec![name.to_string()], input_rings, edges_in, chain)
    }
}

/// Dedup mode: where each subtask of a chain that ends in an exchange
/// leaves its outboxes when it fails, for its replacement (a chain that
/// reads rings recovers alone: `crate::runtime::output_ledger`). One slot
/// per subtask, emptied at every new attempt.
struct OutputKeeps<T> {
    slots: Vec<OutputKeep<T>>,
    /// The chain reads rings (a source chain never recovers alone).
    reads_rings: bool,
}

impl<T> OutputKeeps<T> {
    fn new(subtasks: usize, reads_rings: bool) -> Self {
        OutputKeeps {
            slots: (0..subtasks).map(|_| OutputKeep::default()).collect(),
            reads_rings,
        }
    }

    /// Subtask `i`'s slot, for its replacement's exchange.
    fn slot(&self, i: usize) -> OutputKeep<T> {
        self.slots[i].clone()
    }

    /// A new attempt's subtask `i`: what an earlier attempt left goes; its
    /// slot if its exchange keeps its outboxes (dedup mode with
    /// deterministic operators, a chain that reads rings).
    fn fresh(&self, ctx: &BuildCtx, i: usize) -> Option<OutputKeep<T>> {
        *self.slots[i].lock().unwrap_or_else(|p| p.into_inner()) = None;
        let keeps = ctx
            .config
            .checkpointing
            .as_ref()
            .is_some_and(|c| c.mode == crate::checkpoint::CheckpointMode::Dedup && c.dedup_deterministic);
        (keeps && self.reads_rings).then(|| self.slot(i))
    }

    /// The error of a replacement whose exchange could not be resumed.
    fn cannot(&self, i: usize, why: String) -> Error {
        Error::Restore(format!(
            "subtask {i} cannot recover alone ({why}); the whole job restarts"
        ))
    }
}

/// A stream partitioned by key; add a keyed operator with
/// [`KeyedStream::process`].
pub struct KeyedStream<T, K, KF> {
    upstream: Stream<T>,
    /// More streams partitioned by the same key into the same operator
    /// (the second input of a connected pair).
    others: Vec<Stream<T>>,
    /// Room for one encoded record kept by a join ([`KeyedStream::max_record_bytes`]).
    pub(crate) record_bytes: Option<usize>,
    key_fn: KF,
    parallelism: usize,
    _k: std::marker::PhantomData<fn() -> K>,
}

impl<T, K, KF> KeyedStream<T, K, KF>
where
    T: Data,
    K: Hash + Eq + Data,
    KF: Fn(&T) -> K + Clone + Send + 'static,
{
    /// Sets the parallelism of the keyed operator (default: the upstream's).
    pub fn parallelism(mut self, parallelism: usize) -> Self {
        self.parallelism = parallelism;
        self
    }

    /// A keyed stream over `upstream` and `others` together.
    pub(crate) fn with_inputs(upstream: Stream<T>, others: Vec<Stream<T>>, key_fn: KF) -> Self {
        for s in others.iter().filter(|s| !Rc::ptr_eq(&s.graph, &upstream.graph)) {
            let name = s.ops.last().cloned().unwrap_or_default();
            upstream.graph.borrow_mut().errors.push(format!(
                "connect: the stream after '{name}' belongs to another pipeline; build both in the same one"
            ));
        }
        let parallelism = upstream.parallelism;
        KeyedStream {
            upstream,
            others,
            record_bytes: None,
            key_fn,
            parallelism,
            _k: std::marker::PhantomData,
        }
    }

    /// Room for one encoded record kept in the state of a join (default
    /// [`crate::operators::join::DEFAULT_MAX_RECORD_BYTES`]); a larger record fails the
    /// job with a clear error. Each kept record takes a slot of this size.
    pub fn max_record_bytes(mut self, bytes: usize) -> Self {
        if bytes == 0 || bytes > crate::state::MAX_VALUE_LEN {
            self.record_error(format!(
                "max_record_bytes = {bytes}: must be between 1 and {}",
                crate::state::MAX_VALUE_LEN
            ));
        }
        self.record_bytes = Some(bytes);
        self
    }

    /// Records a build-time error, reported by [`Pipeline::run`].
    pub(crate) fn record_error(&self, message: String) {
        self.upstream.graph.borrow_mut().errors.push(message);
    }

    /// Closes the upstream chain into the hash exchange; returns the edge.
    pub(crate) fn exchange(self, name: &str) -> (Rc<RefCell<Graph>>, usize, usize, KF, Vec<EdgeId>) {
        let q = self.parallelism;
        let graph = self.upstream.graph.clone();
        check_parallelism(&graph, name, q);
        let key_fn = self.key_fn;
        let mut p = 0;
        let mut edges = Vec::new();
        for mut upstream in std::iter::once(self.upstream).chain(self.others) {
            p += upstream.parallelism;
            let up_key = key_fn.clone();
            // The key function runs at the end of the upstream chain: name
            // it, so that a panic in it is blamed on `key_by`.
            let key_op = upstream.ops.len();
            upstream.ops.push("key_by".to_string());
            let keeps = OutputKeeps::new(upstream.parallelism, upstream.input_rings > 0);
            edges.push(upstream.close_into_edge(q, true, move |ctx, edge, i| {
                let maxp = ctx.max_parallelism;
                if let Some(checkpoint) = ctx.resuming {
                    let out = HashOutput::resumed(keeps.slot(i), checkpoint, up_key.clone(), maxp, key_op)
                        .map_err(|e| keeps.cannot(i, e))?;
                    return Ok(Box::new(out) as Box<dyn Collector<T>>);
                }
                let out = HashOutput::new(ctx.producers::<T>(edge, i), up_key.clone(), maxp, key_op);
                Ok(match keeps.fresh(ctx, i) {
                    Some(keep) => Box::new(out.keeping(keep)) as Box<dyn Collector<T>>,
                    None => Box::new(out),
                })
            }));
        }
        (graph, p, q, key_fn, edges)
    }

    /// Processes records one at a time with per-key state: `f(key, state,
    /// record, out)` runs with the state of the record's key (created by
    /// `S::default()` on first use) and may emit any number of results.
    ///
    /// The state is a plain value (`bytemuck::Pod`: numbers, arrays of
    /// numbers, `#[repr(C)]` structs deriving `Pod`) kept inline in the
    /// memory-mapped state backend ([`crate::state`]): it may exceed memory,
    /// and checkpoints write only what changed, asynchronously; with
    /// [`crate::RuntimeConfig::state_backend`] set to
    /// [`crate::StateBackend::Heap`], the same job keeps it in a hash map on
    /// the heap instead. For any other state type, use
    /// [`KeyedStream::process_heap`].
    pub fn process<S, O, F>(self, f: F) -> Stream<O>
    where
        K: crate::state::StateKey,
        S: crate::state::StateValue,
        O: Send + 'static,
        F: FnMut(&K, &mut S, T, &mut Output<O>) + Clone + Send + 'static,
    {
        let (graph, p, q, key_fn, edges) = self.exchange("process");
        let edges_in = edges.clone();
        let chain: ChainFn<O> = Box::new(move |ctx, j, down| {
            let inputs = ctx.inputs_from::<T>(&edges, j);
            if ctx.config.state_backend == crate::state::StateBackend::Heap {
                let mut f = f.clone();
                let op = KeyedProcess::new(
                    ctx.max_parallelism,
                    ctx.config.batch_size,
                    key_fn.clone(),
                    move |k: &K, s: &mut PodCell<S>, t: T, out: &mut Output<O>| f(k, &mut s.0, t, out),
                    down,
                    true,
                );
                return Ok(Box::new(InputTask::new(inputs, Box::new(op), ctx.config.batch_size)) as Box<dyn Task>);
            }
            let opts = crate::state::StoreOptions {
                max_parallelism: ctx.max_parallelism,
                key_groups: crate::state::key_groups::key_group_range(j, q, ctx.max_parallelism),
                ..crate::state::StoreOptions::new(ctx.state_dir()?)
            };
            let store = crate::state::ValueStore::create(opts.clone())?;
            let op = MappedKeyedProcess {
                store: Some(store),
                opts,
                key_fn: key_fn.clone(),
                f: f.clone(),
                out: Output {
                    buf: Vec::with_capacity(ctx.config.batch_size),
                },
                next: down,
                op: 0,
                lifecycle: crate::operators::stores::StoreLifecycle::paced(),
                _in: std::marker::PhantomData,
            };
            Ok(Box::new(InputTask::new(inputs, Box::new(op), ctx.config.batch_size)) as Box<dyn Task>)
        });
        Stream::new(graph, q, vec!["process".to_string()], p, edges_in, chain)
    }

    /// Like [`KeyedStream::process`], for any state type that serde can
    /// encode: the state lives in an in-memory hash map (bounded by memory)
    /// and each checkpoint writes all of it, at the barrier.
    pub fn process_heap<S, O, F>(self, f: F) -> Stream<O>
    where
        S: Default + Data,
        O: Send + 'static,
        F: FnMut(&K, &mut S, T, &mut Output<O>) + Clone + Send + 'static,
    {
        let (graph, p, q, key_fn, edges) = self.exchange("process");
        let edges_in = edges.clone();
        let chain: ChainFn<O> = Box::new(move |ctx, j, down| {
            let inputs = ctx.inputs_from::<T>(&edges, j);
            let op = KeyedProcess::new(
                ctx.max_parallelism,
                ctx.config.batch_size,
                key_fn.clone(),
                f.clone(),
                down,
                false,
            );
            Ok(Box::new(InputTask::new(inputs, Box::new(op), ctx.config.batch_size)) as Box<dyn Task>)
        });
        Stream::new(graph, q, vec!["process".to_string()], p, edges_in, chain)
    }
}
