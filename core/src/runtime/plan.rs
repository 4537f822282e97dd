//! The physical plan: what the API hands the runtime to run. A [`Plan`] is a
//! list of chains ([`ChainGroup`]: fused operators and their parallelism,
//! with a function that builds their tasks) and the exchange edges between
//! them; [`BuildCtx`] instantiates it once per attempt of the job, creating
//! the rings of every edge and handing their ends to the tasks.

use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::runtime::collector::Collector;
use crate::runtime::config::RuntimeConfig;
use crate::runtime::message::{batch_pool, BatchPool, BatchReturn, Message};
use crate::runtime::output::Outbox;
use crate::runtime::task::{Inbox, Task};
use crate::threads::idle::Parker;
use rtrb::{Consumer, Producer, RingBuffer};

pub(crate) type EdgeId = usize;

/// Builds one task instance: given the subtask index and the collector the
/// chain ends in, returns the runnable task.
pub(crate) type ChainFn<T> =
    Box<dyn FnMut(&mut BuildCtx, usize, Box<dyn Collector<T>>) -> Result<Box<dyn Task>> + Send>;

/// Builds every task of a chain; called once per attempt of the job.
pub(crate) type GroupBuild = Box<dyn FnMut(&mut BuildCtx) -> Result<Vec<Box<dyn Task>>> + Send>;

/// Builds one subtask of a chain again, for a dedup recovery of that
/// subtask alone; its input rings are made afresh here and replaced by the
/// failed task's ([`Task::resume_inputs`]).
pub(crate) type SubtaskBuild = Box<dyn FnMut(&mut BuildCtx, usize) -> Result<Box<dyn Task>> + Send>;

/// A finished chain waiting to be instantiated by [`Pipeline::run`].
pub(crate) struct ChainGroup {
    pub(crate) ops: Vec<String>,
    pub(crate) parallelism: usize,
    /// Input rings of each subtask (0 for a source chain).
    pub(crate) input_rings: usize,
    pub(crate) build: GroupBuild,
    /// Chains that read input rings and end in a sink or an exchange: one
    /// subtask built again (an exchange's end takes over its failed
    /// predecessor's outboxes, [`BuildCtx::resuming`]).
    pub(crate) rebuild: Option<SubtaskBuild>,
    /// The chain ends in an exchange (other tasks read its rings): it
    /// recovers alone only with `CheckpointConfig::dedup_deterministic`.
    pub(crate) feeds_exchange: bool,
}

/// A complete job graph, ready to be instantiated (once per attempt).
pub(crate) struct Plan {
    pub(crate) name: String,
    pub(crate) max_parallelism: usize,
    pub(crate) groups: Vec<ChainGroup>,
    /// `(from, to)` subtask counts per edge.
    pub(crate) edges: Vec<(usize, usize)>,
    /// `(producer chain, consumer chain)` per edge.
    pub(crate) edge_groups: Vec<(usize, usize)>,
}

/// The rings of one exchange edge, created at run time and handed out to
/// the producer and consumer subtasks. Indexed `[from][to]`.
struct RingSet<T> {
    producers: Vec<Vec<Option<Producer<Message<T>>>>>,
    consumers: Vec<Vec<Option<Consumer<Message<T>>>>>,
    /// Same-worker pairs only: the pool's two ends, the producer's and the
    /// consumer's.
    pools: Vec<Vec<Option<BatchPool<T>>>>,
    returns: Vec<Vec<Option<BatchReturn<T>>>>,
}

/// What [`Pipeline::run`] hands to chain builders.
pub(crate) struct BuildCtx {
    pub(crate) config: RuntimeConfig,
    edges: Vec<(usize, usize)>,
    edge_groups: Vec<(usize, usize)>,
    group_offsets: Vec<usize>,
    parkers: Vec<Arc<Parker>>,
    /// This attempt's folder for state backend working files.
    state_root: std::path::PathBuf,
    stores: usize,
    rings: HashMap<EdgeId, Box<dyn Any + Send>>,
    pub(crate) max_parallelism: usize,
    /// A dedup recovery of one subtask alone, restored from this
    /// checkpoint: the chain's end takes over its failed predecessor's
    /// outboxes instead of making rings.
    pub(crate) resuming: Option<u64>,
}

impl BuildCtx {
    /// A build context for `plan`, whose tasks will run on workers woken
    /// through `parkers` (task `k` on worker `k mod parkers.len()`).
    pub(crate) fn new(config: RuntimeConfig, plan: &Plan, parkers: Vec<Arc<Parker>>) -> Self {
        let state_root = config
            .state_dir
            .clone()
            .unwrap_or_else(crate::runtime::config::default_state_dir)
            .join(format!("weir-state-{}-{}", std::process::id(), crate::clock::now_ns()));
        let mut offsets = Vec::with_capacity(plan.groups.len());
        let mut k = 0;
        for g in &plan.groups {
            offsets.push(k);
            k += g.parallelism;
        }
        BuildCtx {
            config,
            edges: plan.edges.clone(),
            edge_groups: plan.edge_groups.clone(),
            group_offsets: offsets,
            parkers,
            state_root,
            stores: 0,
            rings: HashMap::new(),
            max_parallelism: plan.max_parallelism,
            resuming: None,
        }
    }

    /// The same context with its state working files under `root` (a
    /// recovery's, inside its attempt's folder).
    pub(crate) fn with_state_root(mut self, root: std::path::PathBuf) -> Self {
        self.state_root = root;
        self
    }

    /// A fresh working folder for one state store of this attempt.
    pub(crate) fn state_dir(&mut self) -> Result<std::path::PathBuf> {
        self.stores += 1;
        let dir = self.state_root.join(format!("store-{}", self.stores));
        std::fs::create_dir_all(&dir).map_err(|e| Error::State {
            context: format!("creating the state folder {}", dir.display()),
            message: format!("{e}; set RuntimeConfig::state_dir to a writable folder"),
        })?;
        Ok(dir)
    }

    /// The folder holding this attempt's state working files.
    pub(crate) fn state_root(&self) -> &std::path::Path {
        &self.state_root
    }

    /// The worker that runs subtask `subtask` of chain `group` (task `k`
    /// runs on worker `k mod workers`); `None` before workers are known.
    fn worker(&self, group: usize, subtask: usize) -> Option<usize> {
        if self.parkers.is_empty() {
            return None;
        }
        Some((self.group_offsets.get(group)? + subtask) % self.parkers.len())
    }

    /// The parker of the worker that runs subtask `subtask` of chain `group`.
    fn parker(&self, group: usize, subtask: usize) -> Option<Arc<Parker>> {
        self.worker(group, subtask).map(|w| self.parkers[w].clone())
    }

    fn ring_set<T: Send + 'static>(&mut self, edge: EdgeId) -> &mut RingSet<T> {
        let (from, to) = self.edges[edge];
        let (from_group, to_group) = self.edge_groups[edge];
        let capacity = self.config.ring_capacity;
        let batch = self.config.batch_size;
        let same: Vec<Vec<bool>> = (0..from)
            .map(|f| {
                let here = self.worker(from_group, f);
                (0..to)
                    .map(|t| here.is_some() && here == self.worker(to_group, t))
                    .collect()
            })
            .collect();
        self.rings
            .entry(edge)
            .or_insert_with(|| {
                let mut producers: Vec<Vec<_>> = (0..from).map(|_| Vec::with_capacity(to)).collect();
                let mut consumers: Vec<Vec<_>> = (0..from).map(|_| Vec::with_capacity(to)).collect();
                let mut pools: Vec<Vec<_>> = (0..from).map(|_| Vec::with_capacity(to)).collect();
                let mut returns: Vec<Vec<_>> = (0..from).map(|_| Vec::with_capacity(to)).collect();
                for f in 0..from {
                    for &same_worker in &same[f] {
                        let (p, c) = RingBuffer::new(capacity);
                        producers[f].push(Some(p));
                        consumers[f].push(Some(c));
                        let (back, pool) = if same_worker {
                            let (back, pool) = batch_pool::<T>(batch);
                            (Some(back), Some(pool))
                        } else {
                            (None, None)
                        };
                        pools[f].push(pool);
                        returns[f].push(back);
                    }
                }
                Box::new(RingSet::<T> {
                    producers,
                    consumers,
                    pools,
                    returns,
                })
            })
            .downcast_mut::<RingSet<T>>()
            .expect("an edge carries one record type")
    }

    pub(crate) fn producers<T: Send + 'static>(&mut self, edge: EdgeId, from: usize) -> Vec<Outbox<T>> {
        let batch = self.config.batch_size;
        let to_group = self.edge_groups[edge].1;
        let wakes: Vec<_> = (0..self.edges[edge].1).map(|j| self.parker(to_group, j)).collect();
        let set = self.ring_set::<T>(edge);
        set.producers[from]
            .iter_mut()
            .zip(set.pools[from].iter_mut())
            .zip(wakes)
            .map(|((p, pool), wake)| {
                Outbox::with_wake(p.take().expect("each producer is taken once"), batch, wake, pool.take())
            })
            .collect()
    }

    /// The input channels of consumer subtask `to` over several edges.
    pub(crate) fn inputs_from<T: Send + 'static>(&mut self, edges: &[EdgeId], to: usize) -> Vec<Inbox<T>> {
        edges.iter().flat_map(|&e| self.consumers::<T>(e, to)).collect()
    }

    pub(crate) fn consumers<T: Send + 'static>(&mut self, edge: EdgeId, to: usize) -> Vec<Inbox<T>> {
        let from_group = self.edge_groups[edge].0;
        let wakes: Vec<_> = (0..self.edges[edge].0).map(|i| self.parker(from_group, i)).collect();
        let set = self.ring_set::<T>(edge);
        set.consumers
            .iter_mut()
            .zip(set.returns.iter_mut())
            .zip(wakes)
            .map(|((row, backs), w)| {
                Inbox::new(
                    row[to].take().expect("each consumer is taken once"),
                    w,
                    backs[to].take(),
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A build context for one exchange edge from a chain of `p` subtasks
    /// to one of `q`, the chains placed first and second, on `workers`.
    fn ctx(p: usize, q: usize, workers: usize) -> BuildCtx {
        BuildCtx {
            config: RuntimeConfig::default(),
            edges: vec![(p, q)],
            edge_groups: vec![(0, 1)],
            group_offsets: vec![0, p],
            parkers: (0..workers).map(|_| Arc::new(Parker::default())).collect(),
            state_root: std::path::PathBuf::new(),
            stores: 0,
            rings: HashMap::new(),
            max_parallelism: crate::state::key_groups::DEFAULT_MAX_PARALLELISM,
            resuming: None,
        }
    }

    /// An outbox knows whether its consumer runs on the producer's worker
    /// (task `k` on worker `k mod workers`): only then does it get a pool
    /// of boxes, to hand batches over by reference.
    #[test]
    fn an_outbox_knows_whether_its_consumer_shares_its_worker() {
        let same = |c: &mut BuildCtx, from: usize| -> Vec<bool> {
            c.producers::<u64>(0, from).iter().map(|o| o.same_worker()).collect()
        };
        // One worker runs source and consumer.
        assert_eq!(same(&mut ctx(1, 1, 1), 0), [true]);
        // Two workers: the source on worker 0, the consumer on worker 1.
        assert_eq!(same(&mut ctx(1, 1, 2), 0), [false]);
        // Two by two on two workers: subtask i of each chain on worker i.
        let mut two = ctx(2, 2, 2);
        assert_eq!(same(&mut two, 0), [true, false]);
        assert_eq!(same(&mut two, 1), [false, true]);
        // Before workers are known, nothing is assumed.
        assert_eq!(same(&mut ctx(1, 1, 0), 0), [false]);
    }
}
