//! Running a job: the job thread (restarts, checkpoint coordination),
//! worker threads, task placement, failure and cancel.
//!
//! `Pipeline::run` builds the first attempt's tasks on the caller's thread
//! (so configuration and restore errors are returned at once), then hands
//! them to the job thread. The job thread starts the workers, runs the
//! checkpoint coordinator while they work, and on a task failure stops the
//! attempt and, if the [`RestartStrategy`] allows, builds a fresh attempt
//! restored from the latest completed checkpoint.
//!
//! Worker `w` is pinned to core `w mod cores` and runs its tasks
//! round-robin, one batch budget per task per round. A round in which no
//! task progressed lets the worker back off by the [`crate::IdleStrategy`].
//! When there are more workers than cores, spinning is switched off so that
//! two busy-spinning threads never share a core.

use std::any::Any;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

use crate::checkpoint::coordinator::{Coordinator, CoordinatorError, TaskInfo};
use crate::checkpoint::recovery::{self, Restored};
use crate::checkpoint::signals::{Event, Signals, TaskCheckpointing};
use crate::checkpoint::spawner::SnapshotPool;
use crate::checkpoint::storage::ManifestGroup;
use crate::checkpoint::{CheckpointConfig, CheckpointStats, RestartRecord, RestoreFrom};
use crate::clock;
use crate::error::{Error, Result};
use crate::runtime::carry;
use crate::runtime::collector::RestoreCtx;
use crate::runtime::config::RuntimeConfig;
use crate::runtime::context::TaskContext;
use crate::runtime::delays::{DelayHub, DelayRecorder};
use crate::runtime::metrics::{JobMetrics, LatencyPair, MetricsRegistry, TaskCounters};
use crate::runtime::plan::{BuildCtx, Plan};
use crate::runtime::task::{Task, TaskPoll};
use crate::threads::idle::{IdleStrategy, Idler, Parker};
use crate::threads::placement::{self, HelperCores};
use crate::threads::relay::{self, WakeRelay};

/// How a job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Every source was exhausted and every operator saw end-of-stream.
    Finished,
    /// [`JobHandle::cancel`] stopped it.
    Cancelled,
}

/// The result of a job that did not fail.
#[derive(Debug, Clone)]
pub struct JobResult {
    /// Finished or cancelled.
    pub outcome: Outcome,
    /// Wall-clock time from the start of the workers to the exit of the last one.
    pub elapsed: Duration,
    /// Final metrics.
    pub metrics: JobMetrics,
    /// CPU time the metrics endpoint's own threads spent, if it was on
    /// ([`RuntimeConfig::metrics_addr`]): what serving metrics cost the
    /// machine, set by [`JobHandle::join`].
    pub metrics_endpoint_cpu: Option<Duration>,
}

/// State of the whole job, shared with the handle.
struct JobShared {
    cancel: AtomicBool,
    finished: AtomicBool,
    registry: Mutex<Arc<MetricsRegistry>>,
    stats: Arc<Mutex<CheckpointStats>>,
    job_thread: Mutex<Option<Thread>>,
    /// The workers' gaps, every attempt's (`delays`).
    delays: Arc<DelayHub>,
}

impl JobShared {
    fn metrics(&self) -> JobMetrics {
        let mut m = self.registry.lock().unwrap_or_else(|p| p.into_inner()).snapshot();
        m.checkpoints = self.stats.lock().unwrap_or_else(|p| p.into_inner()).clone();
        m.worker_delays = self.delays.read();
        m
    }
}

/// State of one attempt (one set of workers).
struct Attempt {
    stop: AtomicBool,
    failure: Mutex<Option<Error>>,
    running: AtomicUsize,
    workers: Mutex<Vec<Thread>>,
    job_thread: Thread,
    /// Per worker: replacements of its failed tasks (dedup recovery).
    mail: Vec<Mailbox>,
    /// Failed tasks (dedup recovery) handed to the job thread, which drops
    /// each and restores its replacement off the worker.
    failed_tasks: Mutex<Vec<FailedTask>>,
    /// The failure must not restart the job: a subtask that recovers
    /// alone spent its restart attempts.
    final_failure: AtomicBool,
    /// Where the workers publish their gaps when they exit.
    delays: Arc<DelayHub>,
}

/// Replacements for a worker's failed tasks, from the job thread.
#[derive(Default)]
struct Mailbox {
    /// Set when `items` holds something: one load per worker round.
    flag: AtomicBool,
    items: Mutex<Vec<Replacement>>,
}

/// A task that failed under dedup, handed by its worker to the job thread
/// with a context like its own: the job thread drops the chain (its
/// sink's threads stop, its files close) and restores the replacement in
/// that context, so that neither stalls the worker's other tasks.
struct FailedTask {
    /// Global index of the task.
    task: usize,
    chain: Box<dyn Task>,
    /// A fresh context of the same subtask (its restore runs in it).
    ctx: TaskContext,
}

/// A failed task's replacement, built and restored on the job thread; the
/// worker gives it the failed task's inputs and runs it.
struct Replacement {
    /// Global index of the task it replaces.
    task: usize,
    built: Box<dyn Task>,
    /// What its restore set in its context: the checkpoint notified, the
    /// last barrier (`None`: no checkpoint completed yet, not restored).
    restored: Option<(u64, u64)>,
    checkpoint: u64,
    generation: u64,
    /// Feed the backup one record at a time ([`Task::resume_inputs`]).
    one_by_one: bool,
}

/// A task that failed and waits for its replacement: never polled.
struct Failed;

impl Task for Failed {
    fn poll(&mut self, _ctx: &mut TaskContext) -> std::result::Result<TaskPoll, crate::error::BoxError> {
        Ok(TaskPoll::Idle)
    }
    fn restore(
        &mut self,
        _r: &RestoreCtx<'_>,
        _ctx: &mut TaskContext,
    ) -> std::result::Result<(), crate::error::BoxError> {
        Ok(())
    }
    fn open(&mut self, _ctx: &mut TaskContext) -> std::result::Result<(), crate::error::BoxError> {
        Ok(())
    }
}

/// What the job thread needs of a running attempt to recover one of its
/// tasks alone.
struct Running {
    parkers: Vec<Arc<Parker>>,
    state_root: std::path::PathBuf,
    infos: Vec<TaskInfo>,
}

impl Attempt {
    fn stop_all(&self) {
        self.stop.store(true, Ordering::Release);
        for t in self.workers.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            t.unpark();
        }
        self.job_thread.unpark();
    }

    fn fail(&self, error: Error) {
        let mut f = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_none() {
            *f = Some(error);
        }
        drop(f);
        self.stop_all();
    }

    fn failed(&self) -> bool {
        self.failure.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// How the attempt ended, once its workers stopped, from how its
    /// supervision ended: with the failure recorded, if there is one.
    fn end(&self, end: AttemptEnd) -> AttemptEnd {
        match end {
            AttemptEnd::Failed(_) => {
                let e = self.failure.lock().unwrap_or_else(|p| p.into_inner()).take();
                AttemptEnd::Failed(e.unwrap_or_else(|| Error::InvalidPipeline("unknown failure".into())))
            }
            other => {
                if let Some(e) = self.failure.lock().unwrap_or_else(|p| p.into_inner()).take() {
                    AttemptEnd::Failed(e)
                } else {
                    other
                }
            }
        }
    }
}

/// A running job: cancel it, watch its metrics, wait for its result.
///
/// Dropping the handle cancels the job and waits for its threads.
pub struct JobHandle {
    name: String,
    shared: Arc<JobShared>,
    thread: Option<JoinHandle<Result<JobResult>>>,
    /// The metrics endpoint, when configured: lives as long as the handle.
    observer: Option<crate::runtime::observe::Observer>,
}

impl JobHandle {
    /// The job's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Asks every thread of the job to stop; returns at once. Workers
    /// notice within one scheduling round or one park timeout.
    pub fn cancel(&self) {
        if self.shared.finished.load(Ordering::Acquire) {
            return;
        }
        self.shared.cancel.store(true, Ordering::Release);
        if let Some(t) = &*self.shared.job_thread.lock().unwrap_or_else(|p| p.into_inner()) {
            t.unpark();
        }
    }

    /// True once the job has ended (finished, failed or cancelled).
    pub fn is_finished(&self) -> bool {
        self.shared.finished.load(Ordering::Acquire)
    }

    /// Live metrics: records per task, ring occupancy, latency so far,
    /// checkpoints.
    pub fn metrics(&self) -> JobMetrics {
        self.shared.metrics()
    }

    /// Leaves the workers' gaps before clock reading `at_ns`
    /// ([`crate::clock::now_ns`]) out of [`JobMetrics::worker_delays`]:
    /// a benchmark's warm-up, which its latency figures leave out too.
    pub fn measure_worker_delays_from(&self, at_ns: u64) {
        self.shared.delays.measure_from(at_ns);
    }

    /// Records the sources have emitted so far, summed over their
    /// subtasks: one relaxed load per source task and no allocation, cheap
    /// enough to poll often (unlike [`JobHandle::metrics`], which copies the
    /// latency histograms).
    pub fn records_emitted(&self) -> u64 {
        self.shared
            .registry
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .records_emitted()
    }

    /// What the metrics endpoint has done so far (its threads' CPU time,
    /// samples, requests), if it is on ([`RuntimeConfig::metrics_addr`]).
    pub fn metrics_endpoint_stats(&self) -> Option<crate::EndpointStats> {
        self.observer.as_ref().map(|o| o.stats())
    }

    /// Pauses (`true`) or resumes (`false`) the metrics endpoint's sampler,
    /// the thread that reads the job's counters once a second for the
    /// rates and history; returns once a sample in progress has ended.
    /// Paused, the sampler does not wake at all; the server still answers
    /// requests, with rates as of the last sample. This exists so that
    /// `weir bench --metrics-ab` can measure what the endpoint costs by
    /// turning it off and on within one run; a program serving metrics has
    /// no reason to call it. Without an endpoint it does nothing.
    pub fn pause_metrics_sampler(&self, paused: bool) {
        if let Some(o) = &self.observer {
            o.pause_sampler(paused);
        }
    }

    /// The address of the metrics endpoint
    /// ([`RuntimeConfig::metrics_addr`], with the port the system chose for
    /// port 0), if it is on. It keeps answering after the job ends, until
    /// the handle is joined or dropped.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.observer.as_ref().and_then(|o| o.addr())
    }

    /// Waits for the job to end; returns its error if it failed (after
    /// exhausting its restart strategy).
    pub fn join(mut self) -> Result<JobResult> {
        let t = self.thread.take().expect("joined once");
        let mut result = t
            .join()
            .unwrap_or_else(|_| Err(Error::InvalidPipeline("the job thread panicked".into())))?;
        result.metrics_endpoint_cpu = self.observer.as_ref().map(|o| o.cpu());
        Ok(result)
    }
}

impl Drop for JobHandle {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.cancel();
            let _ = t.join();
        }
    }
}

/// One task ready to run, with its context.
struct Placed {
    task: Box<dyn Task>,
    ctx: TaskContext,
    /// Where the task's time is accounted up to (clock ns).
    mark_ns: u64,
    /// Global index of the task.
    global: usize,
    /// Dedup mode, a chain that can be built again alone: a failure
    /// recovers this task alone instead of failing the attempt.
    recoverable: bool,
    /// A failed task's inputs while it waits for its replacement (it is
    /// not polled meanwhile).
    held: Option<Box<dyn Any + Send>>,
}

impl Placed {
    /// Accounts the time since the task's last turn ended, up to `now`:
    /// waiting behind full output is backpressure, any other wait is idle.
    #[inline]
    fn account_wait(&mut self, now: u64) {
        let gap = now.saturating_sub(self.mark_ns);
        if self.ctx.output_blocked {
            self.ctx.backpressured_ns += gap;
        } else {
            self.ctx.idle_ns += gap;
        }
        self.mark_ns = now;
    }

    /// Accounts a turn that ran from the mark to `end`: busy if it did
    /// work, else backpressured or idle as it ended.
    #[inline]
    fn account_turn(&mut self, end: u64, progressed: bool) {
        if progressed {
            self.ctx.busy_ns += end.saturating_sub(self.mark_ns);
            self.mark_ns = end;
        } else {
            self.account_wait(end);
        }
    }
}

/// Everything one attempt needs to run.
struct Prepared {
    /// State working files of this attempt, removed when it ends.
    state_root: std::path::PathBuf,
    placed: Vec<Placed>,
    parkers: Vec<Arc<Parker>>,
    registry: Arc<MetricsRegistry>,
    checkpointing: Option<Checkpointing>,
    infos: Vec<TaskInfo>,
}

/// The checkpointing of an attempt: the signals its tasks share with the
/// coordinator, and the channel of the tasks' events to it.
type Checkpointing = (Arc<Signals>, Receiver<Event>, mpsc::Sender<Event>);

/// A built task before it is placed: its chain, subtask, counters and the
/// chain's operator names.
type Unplaced = (usize, usize, Box<dyn Task>, Arc<TaskCounters>, Arc<[String]>);

/// The stable description of the job graph stored in manifests.
fn graph_description(plan: &Plan) -> (Vec<ManifestGroup>, String) {
    let groups: Vec<ManifestGroup> = plan
        .groups
        .iter()
        .enumerate()
        .map(|(g, group)| ManifestGroup {
            operators: group
                .ops
                .iter()
                .enumerate()
                .map(|(i, n)| format!("{g}.{i}:{n}"))
                .collect(),
            parallelism: group.parallelism,
        })
        .collect();
    let mut text = String::new();
    for g in &groups {
        text.push_str(&g.operators.join(","));
        text.push(';');
    }
    for (from, to) in &plan.edge_groups {
        text.push_str(&format!("{from}>{to};"));
    }
    let fp = crate::state::key_groups::stable_hash(text.as_bytes());
    (groups, format!("{fp:016x}"))
}

#[allow(clippy::too_many_arguments)]
fn prepare(
    plan: &mut Plan,
    config: &RuntimeConfig,
    restored: Option<&Restored>,
    latency: &LatencyPair,
    root: Option<&Path>,
    next_id: u64,
    pool: &Arc<SnapshotPool>,
) -> Result<Prepared> {
    let total: usize = plan.groups.iter().map(|g| g.parallelism).sum();
    let parkers: Vec<Arc<Parker>> = (0..worker_count(config, total))
        .map(|_| Arc::new(Parker::default()))
        .collect();
    let mut ctx = BuildCtx::new(config.clone(), plan, parkers.clone());
    let state_root = ctx.state_root().to_path_buf();
    let ckpt = config.checkpointing.as_ref();
    let checkpointing = ckpt.map(|c| checkpoint_signals(c, restored, next_id));
    let mut built = Vec::new();
    for (g, group) in plan.groups.iter_mut().enumerate() {
        let tasks = (group.build)(&mut ctx)?;
        assert_eq!(tasks.len(), group.parallelism, "one task per subtask");
        built.push((g, tasks));
    }
    let (counters, placed, infos) = count_tasks(plan, built, config.ring_capacity as u64);
    let registry = Arc::new(MetricsRegistry::with_latency(counters, latency.clone()));
    let mut out = Vec::with_capacity(placed.len());
    for (k, (g, i, mut task, c, ops)) in placed.into_iter().enumerate() {
        let group = &plan.groups[g];
        let mut ctx = TaskContext::new(i, group.parallelism, ops, c, registry.clone());
        // Task `k` runs on worker `k mod workers` (see `spawn_workers`).
        ctx.parker = Some(Arc::clone(&parkers[k % parkers.len()]));
        if let (Some((signals, _, tx)), Some(root)) = (&checkpointing, root) {
            check_replayable(&*task, ckpt, &group.ops[0])?;
            ctx.ckpt = Some(TaskCheckpointing {
                signals: signals.clone(),
                events: tx.clone(),
                task: k,
                group: g,
                root: Arc::from(root),
                inline_max: ckpt.map_or(crate::checkpoint::DEFAULT_INLINE_STATE_MAX, |c| c.inline_state_max),
                pool: Arc::clone(pool),
                generation: 0,
                backup_limit: ckpt.map_or(crate::checkpoint::DEFAULT_DEDUP_BACKUP_LIMIT, |c| c.dedup_backup_limit),
                align_inputs: fed_by_a_reading_chain(plan, g),
            });
        }
        if let Some(r) = restored {
            restore_task(&mut *task, &mut ctx, r, g, group.parallelism, plan.max_parallelism)?;
        }
        if let Some((signals, _, _)) = &checkpointing {
            // Barrier ids follow the coordinator's numbering: the first
            // barrier this task sees is the coordinator's first trigger,
            // `first_id`, which lies past every checkpoint folder on disk.
            // Starting from the restored id (or 0) instead, a source would
            // inject barriers for the ids in between, which the coordinator
            // never triggered and which name existing checkpoints: their
            // task and state files would be written into those folders.
            ctx.last_barrier = signals.first_id - 1;
        }
        task.open(&mut ctx).map_err(|e| Error::OperatorFailed {
            operator: ctx.operator_name().to_string(),
            subtask: i,
            parallelism: group.parallelism,
            message: format!("could not open: {e}"),
        })?;
        // Dedup: a chain that feeds an exchange recovers alone only when the
        // user says its operators are deterministic (its exchange drops by
        // count what its predecessor sent).
        let recoverable = ckpt.is_some_and(|c| {
            c.mode == crate::checkpoint::CheckpointMode::Dedup && (!group.feeds_exchange || c.dedup_deterministic)
        }) && group.rebuild.is_some();
        out.push(Placed {
            task,
            ctx,
            mark_ns: 0,
            global: k,
            recoverable,
            held: None,
        });
    }
    Ok(Prepared {
        state_root,
        placed: out,
        parkers,
        registry,
        checkpointing,
        infos,
    })
}

/// The signals and event channel of an attempt with checkpointing `c`,
/// restored from `restored`; `next_id` is the lowest id the attempt may use.
fn checkpoint_signals(c: &CheckpointConfig, restored: Option<&Restored>, next_id: u64) -> Checkpointing {
    let completed = restored.map_or(0, |r| r.manifest.id);
    // Never reuse an id: folders of earlier runs may remain.
    let highest = crate::checkpoint::storage::list_ids(&c.dir)
        .ok()
        .and_then(|ids| ids.last().copied())
        .unwrap_or(0);
    let timeout_ns = c.alignment_timeout.map_or(0, |d| d.as_nanos() as u64);
    let (tx, rx) = mpsc::channel();
    // Never reuse an id, not even one an earlier attempt of this run
    // triggered and that left no folder: its late writes could land in
    // a new checkpoint of the same id. Every task starts its barrier
    // numbering here too (`prepare`), whatever it restored.
    let first_id = (completed.max(highest) + 1).max(next_id);
    (Arc::new(Signals::new(c.mode, timeout_ns, completed, first_id)), rx, tx)
}

/// Gives every built task (per chain, in graph order) its counters and
/// its identity for the coordinator: the job's counters, the tasks, and
/// their identities, in the same order.
fn count_tasks(
    plan: &Plan,
    built: Vec<(usize, Vec<Box<dyn Task>>)>,
    ring_capacity: u64,
) -> (Vec<Arc<TaskCounters>>, Vec<Unplaced>, Vec<TaskInfo>) {
    let mut counters = Vec::new();
    let mut placed = Vec::new();
    let mut infos = Vec::new();
    for (g, tasks) in built {
        let group = &plan.groups[g];
        let ops: Arc<[String]> = group.ops.clone().into();
        let name = group.ops.join(" -> ");
        for (i, task) in tasks.into_iter().enumerate() {
            let c = Arc::new(TaskCounters::new(
                name.clone(),
                i,
                group.parallelism,
                group.input_rings,
                ring_capacity,
            ));
            counters.push(c.clone());
            infos.push(TaskInfo {
                group: g,
                subtask: i,
                name: name.clone(),
                is_source: group.input_rings == 0,
            });
            placed.push((g, i, task, c, ops.clone()));
        }
    }
    (counters, placed, infos)
}

/// Restores the task of `ctx` (a subtask of chain `g`, at `parallelism`)
/// from checkpoint `r`.
fn restore_task(
    task: &mut dyn Task,
    ctx: &mut TaskContext,
    r: &Restored,
    g: usize,
    parallelism: usize,
    max_parallelism: usize,
) -> Result<()> {
    let i = ctx.subtask;
    let all = &r.states[g];
    let own = all
        .iter()
        .find(|s| s.subtask as usize == i && s.parallelism as usize == parallelism);
    let rc = RestoreCtx {
        own,
        all,
        checkpoint: r.manifest.id,
        key_groups: crate::state::key_groups::key_group_range(i, parallelism, max_parallelism),
        // Tasks with inputs and watermark generators set their own.
        watermark: crate::watermark::MIN_WATERMARK,
    };
    task.restore(&rc, ctx).map_err(|e| {
        Error::Restore(format!(
            "checkpoint {}: operator '{}' subtask {i}: {e}",
            r.manifest.id,
            ctx.operator_name()
        ))
    })?;
    ctx.notified = r.manifest.id;
    Ok(())
}

/// Starts a job: builds and restores its first attempt here, then runs it
/// on a job thread.
pub(crate) fn start(mut plan: Plan, config: RuntimeConfig) -> Result<JobHandle> {
    validate(&config)?;
    let (groups, fingerprint) = graph_description(&plan);
    let metrics_addr = config.metrics_addr;
    let graph_info = graph_info(&plan, &config);
    let restored = match &config.checkpointing {
        Some(c) => restore_point(c, c.restore, &fingerprint, plan.groups.len())?,
        None => None,
    };
    let latency = LatencyPair::default();
    let stats = Arc::new(Mutex::new(CheckpointStats {
        restored_from: restored.as_ref().map(|r| r.manifest.id),
        ..CheckpointStats::default()
    }));
    if let Some(r) = &restored {
        tracing::info!(job = %plan.name, checkpoint = r.manifest.id, "restoring from checkpoint");
    }
    let (cores, helpers) = job_cores(&plan, &config)?;
    // Workers wake helper threads through it (`relay`).
    let relay = WakeRelay::start(helpers.clone()).map_err(|source| Error::SpawnHelper {
        what: "wake-up relay",
        source,
    })?;
    let pool = snapshot_pool(helpers.clone(), cores.len().max(1), &relay)?;
    let prepared = prepare_first(&mut plan, &config, restored.as_ref(), &latency, &pool, &helpers, &relay)?;
    let shared = Arc::new(JobShared {
        cancel: AtomicBool::new(false),
        finished: AtomicBool::new(false),
        registry: Mutex::new(prepared.registry.clone()),
        stats,
        job_thread: Mutex::new(None),
        delays: Arc::default(),
    });
    // Before the job thread starts: an address in use fails the job
    // before it has read or written anything.
    let observer = match metrics_addr {
        Some(addr) => Some(start_observer(addr, graph_info, &shared)?),
        None => None,
    };
    let name = plan.name.clone();
    let sh = shared.clone();
    let retained: VecDeque<u64> = match &config.checkpointing {
        Some(c) => recovery::completed_ids(&c.dir)?.into_iter().collect(),
        None => VecDeque::new(),
    };
    let thread = thread::Builder::new()
        .name(format!("weir-job-{name}"))
        .spawn(move || {
            placement::enter(helpers.clone());
            relay::set_current(Some(relay.clone()));
            let mut job = JobRun {
                plan,
                config,
                shared: sh.clone(),
                latency,
                groups,
                fingerprint,
                retained,
                next_id: 1,
                helpers,
                relay,
                pool,
                cores,
                task_failures: std::collections::HashMap::new(),
            };
            let r = job.run(prepared);
            sh.finished.store(true, Ordering::Release);
            r
        })
        .map_err(|source| Error::Spawn { worker: 0, source })?;
    *shared.job_thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(thread.thread().clone());
    Ok(JobHandle {
        name,
        shared,
        thread: Some(thread),
        observer,
    })
}

/// The cores this job may use, and where weir's own threads go: where the
/// workers are not (`placement`).
fn job_cores(plan: &Plan, config: &RuntimeConfig) -> Result<(Vec<core_affinity::CoreId>, HelperCores)> {
    // The cores this job may use, read once here: threads pinned later
    // (the job thread, to the helper cores) would see only theirs.
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let core_ids: Vec<usize> = cores.iter().map(|c| c.id).collect();
    let tasks: usize = plan.groups.iter().map(|g| g.parallelism).sum();
    let helpers = placement::helper_cores(
        &config.helpers,
        worker_count(config, tasks),
        config.pin_workers,
        &core_ids,
    )?;
    Ok((cores, helpers))
}

/// Builds and restores the first attempt on the caller's thread: the
/// threads its sinks start there follow the helper cores too, and are
/// woken through the relay.
fn prepare_first(
    plan: &mut Plan,
    config: &RuntimeConfig,
    restored: Option<&Restored>,
    latency: &LatencyPair,
    pool: &Arc<SnapshotPool>,
    helpers: &HelperCores,
    relay: &Arc<WakeRelay>,
) -> Result<Prepared> {
    let root = config.checkpointing.as_ref().map(|c| c.dir.clone());
    let callers = (placement::current(), relay::current());
    placement::set_current(helpers.clone());
    relay::set_current(Some(relay.clone()));
    let prepared = prepare(plan, config, restored, latency, root.as_deref(), 1, pool);
    placement::set_current(callers.0);
    relay::set_current(callers.1);
    prepared
}

/// Checks the configuration, and makes the checkpoint directory.
fn validate(config: &RuntimeConfig) -> Result<()> {
    config.validate()?;
    if let Some(c) = &config.checkpointing {
        c.validate()?;
        // Durably: a crash must not take back the folder, with every
        // checkpoint in it, once sinks have committed what they hold.
        crate::storage::disk::create_dir_all_durable(&c.dir).map_err(|e| {
            Error::Checkpoint(format!(
                "cannot create the checkpoint directory {}: {e}",
                c.dir.display()
            ))
        })?;
    }
    config.restart.validate()
}

/// Whether chain `g` reads a ring written by a chain that reads rings
/// itself: dedup mode aligns such a chain's barriers
/// ([`TaskCheckpointing::align_inputs`]), since its producer, fed by several
/// rings, interleaves them anew after a restore and cannot replay the same
/// records in the same order, which dropping replayed records by position
/// needs (a source chain replays from its offsets and can).
fn fed_by_a_reading_chain(plan: &Plan, g: usize) -> bool {
    plan.edge_groups
        .iter()
        .any(|&(from, to)| to == g && plan.groups[from].input_rings > 0)
}

/// The job graph as the metrics endpoint shows it.
fn graph_info(plan: &Plan, config: &RuntimeConfig) -> crate::runtime::observe::GraphInfo {
    crate::runtime::observe::GraphInfo {
        job: plan.name.clone(),
        chains: plan
            .groups
            .iter()
            .map(|g| crate::runtime::observe::ChainInfo {
                operators: g.ops.clone(),
                parallelism: g.parallelism,
                input_rings: g.input_rings,
            })
            .collect(),
        edges: plan.edge_groups.clone(),
        ring_capacity: config.ring_capacity,
        checkpoint_mode: config.checkpointing.as_ref().map(|c| c.mode.name()),
    }
}

/// The checkpoint of `c.dir` to restore from (`from`, for a job graph of
/// `fingerprint` with `chains` chains), if any; then what an earlier run
/// left incomplete or orphaned there is removed.
fn restore_point(
    c: &CheckpointConfig,
    from: RestoreFrom,
    fingerprint: &str,
    chains: usize,
) -> Result<Option<Restored>> {
    let r = recovery::find(&c.dir, from, fingerprint, chains)?;
    recovery::remove_incomplete(&c.dir);
    recovery::remove_orphaned_shared_files(&c.dir)?;
    Ok(r)
}

/// Starts the metrics endpoint on `addr`, reading the job's metrics.
fn start_observer(
    addr: std::net::SocketAddr,
    graph_info: crate::runtime::observe::GraphInfo,
    shared: &Arc<JobShared>,
) -> Result<crate::runtime::observe::Observer> {
    let sh = shared.clone();
    let read: crate::runtime::observe::ReadJob = Arc::new(move || (sh.metrics(), sh.finished.load(Ordering::Acquire)));
    crate::runtime::observe::Observer::start(addr, graph_info, read)
}

/// Fails the job at its start if a source that cannot replay is to be
/// checkpointed exactly once.
fn check_replayable(task: &dyn Task, ckpt: Option<&CheckpointConfig>, source: &str) -> Result<()> {
    if ckpt.is_some_and(|c| c.mode.is_exactly_once()) && !task.replayable() {
        return Err(Error::InvalidPipeline(format!(
            "source '{}' is not replayable, so mode '{}' cannot be exactly-once: use a replayable \
             source, or the at-least-once mode or no checkpointing",
            source,
            ckpt.map_or("", |c| c.mode.name())
        )));
    }
    Ok(())
}

/// The job thread's state.
struct JobRun {
    plan: Plan,
    config: RuntimeConfig,
    shared: Arc<JobShared>,
    latency: LatencyPair,
    groups: Vec<ManifestGroup>,
    fingerprint: String,
    retained: VecDeque<u64>,
    /// The lowest checkpoint id the next attempt may use.
    next_id: u64,
    /// Where weir's own threads run (`placement`).
    helpers: HelperCores,
    /// Wakes helper threads for the workers (`relay`).
    relay: Arc<WakeRelay>,
    /// Asynchronous snapshot work of every attempt.
    pool: Arc<SnapshotPool>,
    /// The cores the job may use (workers are pinned to them in order).
    cores: Vec<core_affinity::CoreId>,
    /// Dedup mode: failures per task that recovered alone (global index).
    task_failures: std::collections::HashMap<usize, u32>,
}

enum AttemptEnd {
    Finished,
    Cancelled,
    Failed(Error),
    /// Failed, and restarting would not help (see `Attempt::final_failure`).
    FailedFinally(Error),
}

impl JobRun {
    fn run(&mut self, first: Prepared) -> Result<JobResult> {
        let started = Instant::now();
        let mut prepared = first;
        let mut restarts = 0u32;
        loop {
            let (end, finished_at) = self.run_attempt(prepared, restarts);
            let elapsed = finished_at.duration_since(started);
            let error = match end {
                AttemptEnd::Finished => return Ok(self.result(Outcome::Finished, elapsed)),
                AttemptEnd::Cancelled => return Ok(self.result(Outcome::Cancelled, elapsed)),
                AttemptEnd::Failed(e) => e,
                AttemptEnd::FailedFinally(e) => {
                    tracing::error!(job = %self.plan.name, error = %e, "job failed");
                    return Err(e);
                }
            };
            restarts += 1;
            let Some(delay) = self.config.restart.delay(restarts) else {
                tracing::error!(job = %self.plan.name, error = %error, "job failed");
                return Err(error);
            };
            tracing::warn!(job = %self.plan.name, error = %error, restart = restarts, ?delay, "task failed; restarting");
            if self.sleep_unless_cancelled(delay) {
                return Ok(self.result(Outcome::Cancelled, started.elapsed()));
            }
            let restored = match &self.config.checkpointing {
                Some(c) => {
                    let from = match c.restore {
                        RestoreFrom::LatestValid => RestoreFrom::LatestValid,
                        _ => RestoreFrom::Latest,
                    };
                    let r = restore_point(c, from, &self.fingerprint, self.plan.groups.len())?;
                    self.retained = recovery::completed_ids(&c.dir)?.into_iter().collect();
                    r
                }
                None => None,
            };
            let restored_from = restored.as_ref().map(|r| r.manifest.id);
            tracing::info!(job = %self.plan.name, restart = restarts, checkpoint = ?restored_from, "restarted");
            self.record_restart(RestartRecord {
                attempt: restarts,
                error: error.to_string(),
                restored_from,
                subtask: None,
            });
            let root = self.config.checkpointing.as_ref().map(|c| c.dir.clone());
            prepared = prepare(
                &mut self.plan,
                &self.config,
                restored.as_ref(),
                &self.latency,
                root.as_deref(),
                self.next_id,
                &self.pool,
            )?;
            *self.shared.registry.lock().unwrap_or_else(|p| p.into_inner()) = prepared.registry.clone();
        }
    }

    /// Adds a restart, of the job or of one subtask, to the job's history.
    fn record_restart(&self, r: RestartRecord) {
        self.shared
            .stats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .restarts
            .push(r);
    }

    fn result(&self, outcome: Outcome, elapsed: Duration) -> JobResult {
        JobResult {
            outcome,
            elapsed,
            metrics: self.shared.metrics(),
            metrics_endpoint_cpu: None,
        }
    }

    /// Sleeps in short steps; true if the job was cancelled meanwhile.
    fn sleep_unless_cancelled(&self, total: Duration) -> bool {
        let end = Instant::now() + total;
        loop {
            if self.shared.cancel.load(Ordering::Acquire) {
                return true;
            }
            let now = Instant::now();
            if now >= end {
                return false;
            }
            thread::park_timeout((end - now).min(Duration::from_millis(10)));
        }
    }

    fn run_attempt(&mut self, prepared: Prepared, restarts: u32) -> (AttemptEnd, Instant) {
        let attempt = Arc::new(Attempt {
            stop: AtomicBool::new(false),
            failure: Mutex::new(None),
            running: AtomicUsize::new(0),
            workers: Mutex::new(Vec::new()),
            job_thread: thread::current(),
            mail: (0..prepared.parkers.len()).map(|_| Mailbox::default()).collect(),
            failed_tasks: Mutex::new(Vec::new()),
            final_failure: AtomicBool::new(false),
            delays: self.shared.delays.clone(),
        });
        let running = Running {
            parkers: prepared.parkers.clone(),
            state_root: prepared.state_root.clone(),
            infos: prepared.infos.clone(),
        };
        let mut coordinator = self.coordinator(&prepared);
        let (events, _keep_sender) = match prepared.checkpointing {
            Some((_, rx, tx)) => (Some(rx), Some(tx)),
            None => (None, None),
        };
        let state_root = prepared.state_root.clone();
        let threads = match spawn_workers(
            prepared.placed,
            &prepared.parkers,
            &self.config,
            &attempt,
            &self.helpers,
            &self.relay,
            &self.cores,
        ) {
            Ok(t) => t,
            Err(e) => return (AttemptEnd::Failed(e), Instant::now()),
        };
        let end = self.supervise(&attempt, coordinator.as_mut(), events.as_ref(), &running);
        for t in threads {
            if t.join().is_err() {
                attempt.fail(Error::InvalidPipeline(
                    "a worker thread panicked outside any task".into(),
                ));
            }
        }
        let finished_at = Instant::now();
        // The workers dropped their tasks (and stores) before exiting.
        let _ = std::fs::remove_dir_all(&state_root);
        let end = match attempt.end(end) {
            AttemptEnd::Failed(e) if attempt.final_failure.load(Ordering::Acquire) => AttemptEnd::FailedFinally(e),
            end => end,
        };
        if let Some(c) = &mut coordinator {
            let restarting = matches!(end, AttemptEnd::Failed(_)) && self.config.restart.delay(restarts + 1).is_some();
            self.end_checkpointing(c, events.as_ref(), matches!(end, AttemptEnd::Cancelled), restarting);
        }
        (end, finished_at)
    }

    /// The coordinator of an attempt with checkpointing.
    fn coordinator(&self, prepared: &Prepared) -> Option<Coordinator> {
        let mut coordinator = match (&prepared.checkpointing, &self.config.checkpointing) {
            (Some((signals, _, _)), Some(cfg)) => Some(Coordinator::new(
                cfg.clone(),
                signals.clone(),
                self.plan.name.clone(),
                self.fingerprint.clone(),
                self.groups.clone(),
                prepared.infos.clone(),
                signals.first_id,
                self.retained.clone(),
                self.shared.stats.clone(),
            )),
            _ => None,
        };
        if let Some(c) = &mut coordinator {
            c.set_relay(self.relay.clone());
        }
        coordinator
    }

    /// Watches an attempt while its workers run, and coordinates its
    /// checkpoints, until it is cancelled, fails or finishes.
    fn supervise(
        &mut self,
        attempt: &Attempt,
        mut coordinator: Option<&mut Coordinator>,
        events: Option<&Receiver<Event>>,
        running: &Running,
    ) -> AttemptEnd {
        loop {
            if self.shared.cancel.load(Ordering::Acquire) {
                attempt.stop_all();
                break AttemptEnd::Cancelled;
            }
            if attempt.failed() {
                break AttemptEnd::Failed(Error::InvalidPipeline(String::new()));
            }
            if attempt.running.load(Ordering::Acquire) == 0 {
                break AttemptEnd::Finished;
            }
            match (&mut coordinator, events) {
                (Some(c), Some(rx)) => {
                    match rx.recv_timeout(c.next_wakeup()) {
                        Ok(ev) => {
                            if let Err(e) = self.on_event(ev, c, attempt, running) {
                                attempt.fail(e);
                                continue;
                            }
                            // Drain what else is queued before ticking.
                            while let Ok(ev) = rx.try_recv() {
                                if let Err(e) = self.on_event(ev, c, attempt, running) {
                                    attempt.fail(e);
                                    break;
                                }
                            }
                        }
                        Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => {}
                    }
                    if let Err(e) = c.tick() {
                        attempt.fail(coordinator_error(e));
                    }
                }
                _ => thread::park_timeout(Duration::from_millis(10)),
            }
        }
    }

    /// One event of the attempt's tasks: a failed task recovering alone
    /// (dedup), or the coordinator's.
    fn on_event(&mut self, ev: Event, c: &mut Coordinator, attempt: &Attempt, running: &Running) -> Result<()> {
        match ev {
            Event::TaskFailed {
                task,
                message,
                record,
                replayable_from,
            } => self.recover(task, message, record, &replayable_from, c, attempt, running),
            ev => c.handle(ev).map_err(coordinator_error),
        }
    }

    /// Dedup mode: task `task` failed with `message` (on `record`, if it
    /// failed while its backup was fed again); its worker dropped it and
    /// holds its inputs. Builds its replacement, restored from the latest
    /// completed checkpoint, and hands it to that worker; every other task
    /// runs on. An error (the attempt fails) when the restart strategy's
    /// attempts for this subtask are spent or the replacement cannot be
    /// built.
    #[allow(clippy::too_many_arguments)]
    fn recover(
        &mut self,
        task: usize,
        message: String,
        record: Option<(u32, u64, u64)>,
        replayable_from: &[u64],
        c: &mut Coordinator,
        attempt: &Attempt,
        running: &Running,
    ) -> Result<()> {
        let info = &running.infos[task];
        let (g, i) = (info.group, info.subtask);
        // The failed chain first: its sink's threads must stop and its
        // files close before anything else (its replacement's restore
        // reads them). Dropped here, not on its worker: a sink that waits
        // for its I/O threads would stall the worker's other tasks.
        let failed = {
            let mut f = attempt.failed_tasks.lock().unwrap_or_else(|p| p.into_inner());
            let k = f.iter().position(|t| t.task == task);
            k.map(|k| f.swap_remove(k))
        };
        let Some(FailedTask {
            chain,
            ctx: mut task_ctx,
            ..
        }) = failed
        else {
            debug_assert!(false, "task {task} failed, but its worker handed nothing over");
            return Err(Error::Restore(format!(
                "task {task} failed, but its worker handed nothing over to recover it alone"
            )));
        };
        let mut carried = carry::Carried::default();
        // A panic while dropping the failed chain must not take the job
        // thread down with it.
        let _ = catch_unwind(AssertUnwindSafe(|| carried.enter(move || drop(chain))));
        let failures = {
            let n = self.task_failures.entry(task).or_insert(0);
            *n += 1;
            *n
        };
        let group = &self.plan.groups[g];
        let (operator, parallelism) = (group.ops.join(" -> "), group.parallelism);
        let on_record = match record {
            None => String::new(),
            Some((input, first, last)) if first == last => {
                format!(" on the record at position {first} of input channel {input}")
            }
            Some((input, first, last)) => {
                format!(" on one of the records at positions {first}..={last} of input channel {input}")
            }
        };
        let Some(delay) = self.config.restart.delay(failures) else {
            // Restarting the whole job would only meet the record again.
            attempt.final_failure.store(true, Ordering::Release);
            return Err(Error::OperatorFailed {
                operator,
                subtask: i,
                parallelism,
                message: format!(
                    "{message}{on_record}; it failed {failures} times, and the restart strategy's attempts are spent"
                ),
            });
        };
        tracing::warn!(job = %self.plan.name, operator = %operator, subtask = i, error = %message, ?delay, "subtask failed; recovering it alone");
        if self.sleep_unless_cancelled(delay) {
            return Ok(());
        }
        if c.final_in_flight() {
            return Err(Error::OperatorFailed {
                operator,
                subtask: i,
                parallelism,
                message: format!(
                    "{message}{on_record}; the final checkpoint was in flight (it is triggered once), so the whole \
                     job restarts instead of this subtask alone"
                ),
            });
        }
        let (generation, checkpoint) = c.task_failed(task);
        if !replayable_from.contains(&checkpoint) {
            // Its backup let go of what it took since that checkpoint
            // (it outgrew `dedup_backup_limit`): the whole job restarts,
            // without restoring a replacement first for nothing.
            return Err(Error::OperatorFailed {
                operator,
                subtask: i,
                parallelism,
                message: format!(
                    "{message}{on_record}; its dedup backup cannot be replayed from checkpoint {checkpoint}, the \
                     latest completed (it outgrew CheckpointConfig::dedup_backup_limit since), so the whole job \
                     restarts instead"
                ),
            });
        }
        let cfg = self
            .config
            .checkpointing
            .as_ref()
            .expect("dedup recovery runs with checkpointing");
        // Its own chain's states only, the files checked as they are read
        // (`load_group`).
        let restored = if checkpoint > 0 {
            match recovery::load_group(&cfg.dir, checkpoint, &self.fingerprint, self.plan.groups.len(), g) {
                Ok(r) => Some(r),
                Err((e, damaged)) => {
                    // Damaged bytes: reported, and the whole job restarts
                    // (it reads the checkpoint again, verifying every file).
                    if let Some((file, at)) = damaged {
                        crate::storage::corruption::report(
                            &file,
                            at,
                            &format!(
                                "{e}; subtask {i} of '{operator}' cannot recover alone from checkpoint {checkpoint}: the whole job restarts instead"
                            ),
                        );
                    }
                    return Err(e);
                }
            }
        } else {
            None
        };
        let mut ctx = BuildCtx::new(self.config.clone(), &self.plan, running.parkers.clone())
            .with_state_root(running.state_root.join(format!("recovery-{task}-{failures}")));
        ctx.resuming = Some(checkpoint);
        let rebuild = self.plan.groups[g]
            .rebuild
            .as_mut()
            .expect("only tasks of rebuildable chains recover alone");
        let mut built = rebuild(&mut ctx, i)?;
        // Restored here, in a context of its own (the worker's other tasks
        // run on meanwhile); what the restore set is carried over.
        let restored = match &restored {
            Some(r) => {
                carried
                    .enter(|| restore_task(&mut *built, &mut task_ctx, r, g, parallelism, self.plan.max_parallelism))?;
                Some((task_ctx.notified, task_ctx.last_barrier))
            }
            None => None,
        };
        drop(task_ctx);
        self.record_restart(RestartRecord {
            attempt: failures,
            error: format!("operator '{operator}' subtask {i}: {message}{on_record}"),
            restored_from: (checkpoint > 0).then_some(checkpoint),
            subtask: Some((operator, i)),
        });
        let w = task % running.parkers.len();
        attempt.mail[w]
            .items
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Replacement {
                task,
                built,
                restored,
                checkpoint,
                generation,
                // After a failure in a replay, the next one names the record.
                one_by_one: failures >= 2,
            });
        attempt.mail[w].flag.store(true, Ordering::Release);
        running.parkers[w].wake();
        Ok(())
    }

    /// The end of an attempt's checkpointing, once its workers stopped:
    /// what is pending is aborted, and what the next attempt needs kept.
    fn end_checkpointing(
        &mut self,
        c: &mut Coordinator,
        events: Option<&Receiver<Event>>,
        cancelled: bool,
        restarting: bool,
    ) {
        // Task snapshots still being written would create their
        // checkpoint's folder again after `shutdown` deleted it: at the
        // job's end, under an id a next job could reuse, so they end
        // first. Before a restart they are not waited for beyond
        // RESTART_DRAIN_LIMIT: the next attempt's ids start past theirs
        // (`checkpoint_signals`), a folder they leave has no manifest and
        // the next restore point deletes it, and waiting delays the
        // restore by the rest of a checkpoint (0.6-1.3 s with 1 GiB of
        // state here).
        if restarting {
            c.wait_snapshot_jobs(RESTART_DRAIN_LIMIT);
        } else if !c.wait_snapshot_jobs(SNAPSHOT_DRAIN_LIMIT) {
            tracing::warn!(
                job = %self.plan.name,
                limit = ?SNAPSHOT_DRAIN_LIMIT,
                "task snapshots still being written at the end of the attempt; going on without them"
            );
        }
        // Acks of the final checkpoint may still be queued.
        if let Some(rx) = events {
            while let Ok(ev) = rx.try_recv() {
                let _ = c.handle(ev);
            }
        }
        c.shutdown(cancelled);
        self.retained = c.retained();
        self.next_id = c.next_id();
    }
}

/// How long the end of an attempt waits for task snapshots still being
/// written on the snapshot pool (a slow disk's worth of state files).
const SNAPSHOT_DRAIN_LIMIT: Duration = Duration::from_secs(30);

/// How long the end of an attempt that restarts waits for them: 20 ms,
/// enough for a small state's snapshot to end (its folder then goes
/// with the others), not a large one's.
const RESTART_DRAIN_LIMIT: Duration = Duration::from_millis(20);

fn coordinator_error(e: CoordinatorError) -> Error {
    match e {
        CoordinatorError::Failed(m) => Error::Checkpoint(m),
    }
}

/// The job's snapshot pool: asynchronous state snapshots and the waits of
/// sinks' pre-commits, on the helper cores. Its own pool, so that weir
/// neither competes with nor re-pins the threads of the application's
/// global rayon pool.
fn snapshot_pool(helpers: HelperCores, threads: usize, relay: &Arc<WakeRelay>) -> Result<Arc<SnapshotPool>> {
    let on = helpers.clone();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("weir-snapshot-{i}"))
        .start_handler(move |_| placement::enter(on.clone()))
        .build()
        .map_err(|e| Error::SpawnHelper {
            what: "snapshot pool",
            source: std::io::Error::other(e.to_string()),
        })?;
    SnapshotPool::new(Arc::new(pool), helpers, Some(relay.clone()))
        .map(Arc::new)
        .map_err(|source| Error::SpawnHelper {
            what: "snapshot spawner",
            source,
        })
}

/// Workers of an attempt with `tasks` tasks: the configured number, never
/// more than there are tasks.
pub(crate) fn worker_count(config: &RuntimeConfig, tasks: usize) -> usize {
    config.workers.min(tasks).max(1)
}

/// Places tasks on workers (task `k` on worker `k mod workers`: chains are
/// listed upstream first, so subtask `i` of consecutive chains of equal
/// parallelism share a worker, and small chains spread) and starts them.
fn spawn_workers(
    placed: Vec<Placed>,
    parkers: &[Arc<Parker>],
    config: &RuntimeConfig,
    attempt: &Arc<Attempt>,
    helpers: &HelperCores,
    relay: &Arc<WakeRelay>,
    cores: &[core_affinity::CoreId],
) -> Result<Vec<JoinHandle<()>>> {
    let workers = parkers.len();
    debug_assert_eq!(workers, worker_count(config, placed.len()));
    let mut per_worker: Vec<Vec<Placed>> = (0..workers).map(|_| Vec::new()).collect();
    for (k, p) in placed.into_iter().enumerate() {
        per_worker[k % workers].push(p);
    }
    let idle = if workers > cores.len().max(1) {
        IdleStrategy {
            spins: 0,
            ..config.idle
        }
    } else {
        config.idle
    };
    attempt.running.store(workers, Ordering::Release);
    let mut threads = Vec::with_capacity(workers);
    for (w, tasks) in per_worker.into_iter().enumerate() {
        let core = (config.pin_workers && !cores.is_empty()).then(|| cores[w % cores.len()]);
        let a = attempt.clone();
        let parker = parkers[w].clone();
        let h = helpers.clone();
        let r = relay.clone();
        let spawned = thread::Builder::new().name(format!("weir-worker-{w}")).spawn(move || {
            // Threads the tasks start (sinks' I/O threads) go to the helper
            // cores, and are woken through the relay.
            placement::set_current(h);
            relay::set_current(Some(r));
            worker_main(tasks, core, idle, &parker, &a, w)
        });
        match spawned {
            Ok(t) => {
                attempt
                    .workers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(t.thread().clone());
                threads.push(t);
            }
            Err(source) => {
                attempt.running.fetch_sub(workers - w, Ordering::AcqRel);
                attempt.stop_all();
                for t in threads {
                    let _ = t.join();
                }
                return Err(Error::Spawn { worker: w, source });
            }
        }
    }
    Ok(threads)
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        format!("panicked: {s}")
    } else if let Some(s) = payload.downcast_ref::<String>() {
        format!("panicked: {s}")
    } else {
        "panicked".to_string()
    }
}

/// A worker's back-off after a round of turns: none after progress; after
/// a round without, the idle strategy's steps (`Idler::idle`), then one
/// more round as the last look (`parking`), then a park. True if it
/// parked (the interval is the worker's choice, not a delay).
#[inline]
fn back_off(progressed: bool, parking: &mut bool, idler: &mut Idler, parker: &Parker) -> bool {
    if progressed {
        idler.reset();
        if *parking {
            parker.awake();
            *parking = false;
        }
    } else if *parking {
        thread::park_timeout(idler.park_timeout());
        parker.awake();
        *parking = false;
        return true;
    } else if idler.idle() {
        parker.prepare_park();
        *parking = true;
    }
    false
}

fn worker_main(
    mut tasks: Vec<Placed>,
    core: Option<core_affinity::CoreId>,
    idle: IdleStrategy,
    parker: &Parker,
    attempt: &Attempt,
    w: usize,
) {
    if let Some(core) = core {
        // Pinning is best-effort: an unpinned worker is slower, not wrong.
        let _ = core_affinity::set_for_current(core);
    }
    parker.register();
    crate::threads::placement::mark_worker_thread();
    let mut idler = Idler::new(idle);
    // Set after `prepare_park`: the next round is the last look before parking.
    let mut parking = false;
    let start = clock::now_ns();
    for t in &mut tasks {
        t.mark_ns = start;
    }
    let mut delays = DelayRecorder::new(&attempt.delays, start);
    // The last clock reading of the previous turn, and whether the worker
    // parked since (then the interval is not a gap).
    let (mut last, mut parked) = (start, false);
    while !tasks.is_empty() && !attempt.stop.load(Ordering::Relaxed) {
        let mut progressed = false;
        let mut i = 0;
        // One clock reading per turn (a batch): each turn's end is the next
        // one's start; the reading here covers the worker's back-off.
        let mut now = clock::now_ns();
        delays.turn(last, now, parked);
        if attempt.mail[w].flag.load(Ordering::Acquire) {
            install_replacements(&mut tasks, attempt, w);
            progressed = true;
        }
        while i < tasks.len() {
            let placed = &mut tasks[i];
            if placed.held.is_some() {
                // Failed; waiting for its replacement.
                i += 1;
                continue;
            }
            placed.account_wait(now);
            placed.ctx.output_blocked = false;
            let before = now;
            let result = catch_unwind(AssertUnwindSafe(|| placed.task.poll(&mut placed.ctx)));
            now = clock::now_ns();
            let worked = matches!(result, Ok(Ok(TaskPoll::Progress | TaskPoll::Done)));
            placed.account_turn(now, worked);
            if !worked {
                // A turn that found nothing to do takes well under a
                // microsecond: a longer one is a gap (`delays`).
                delays.turn(before, now, false);
            }
            placed.ctx.end_turn();
            let failure = match result {
                Ok(Ok(TaskPoll::Progress)) => {
                    progressed = true;
                    None
                }
                Ok(Ok(TaskPoll::Idle)) => None,
                Ok(Ok(TaskPoll::Done)) => {
                    placed.ctx.publish_latency();
                    tasks.swap_remove(i);
                    progressed = true;
                    continue;
                }
                Ok(Err(e)) => Some(e.to_string()),
                Err(payload) => Some(panic_message(&*payload)),
            };
            if let Some(message) = failure {
                if placed.recoverable && recover_alone(placed, message.clone(), attempt) {
                    i += 1;
                    continue;
                }
                let ctx = &placed.ctx;
                attempt.fail(Error::OperatorFailed {
                    operator: ctx.operator_name().to_string(),
                    subtask: ctx.subtask,
                    parallelism: ctx.parallelism,
                    message,
                });
                break;
            }
            i += 1;
        }
        last = now;
        parked = back_off(progressed, &mut parking, &mut idler, parker);
    }
    delays.finish(clock::now_ns());
    // Keep what sinks recorded, even when the job is stopping.
    for t in &mut tasks {
        t.ctx.publish_latency();
    }
    drop(tasks);
    attempt.running.fetch_sub(1, Ordering::AcqRel);
    attempt.job_thread.unpark();
}

/// Dedup mode: a recoverable task failed with `message`. Takes its inputs
/// out, hands the failed chain to the job thread (which drops it, then
/// builds and restores its replacement: see [`FailedTask`]), and asks for
/// the replacement; false if the task cannot recover alone.
fn recover_alone(placed: &mut Placed, message: String, attempt: &Attempt) -> bool {
    let Some(ck) = placed.ctx.ckpt.clone() else {
        return false;
    };
    if placed.ctx.restart_whole_job {
        return false;
    }
    // Before its inputs (and backup) are taken out.
    let replayable_from = placed.task.replayable_from();
    let Some(inputs) = placed.task.take_inputs() else {
        return false;
    };
    let record = placed.task.failing_record();
    let chain = std::mem::replace(&mut placed.task, Box::new(Failed));
    // The job thread drops it and restores its replacement in a context
    // like this one (see `FailedTask`).
    let ctx = placed.ctx.for_restore();
    attempt
        .failed_tasks
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(FailedTask {
            task: placed.global,
            chain,
            ctx,
        });
    placed.held = Some(inputs);
    ck.send(Event::TaskFailed {
        task: placed.global,
        message,
        record,
        replayable_from,
    });
    true
}

/// Installs the replacements the job thread built for this worker's
/// failed tasks: each restored, given its predecessor's inputs, opened.
fn install_replacements(tasks: &mut [Placed], attempt: &Attempt, w: usize) {
    let items = std::mem::take(&mut *attempt.mail[w].items.lock().unwrap_or_else(|p| p.into_inner()));
    attempt.mail[w].flag.store(false, Ordering::Release);
    for r in items {
        let Some(placed) = tasks.iter_mut().find(|p| p.global == r.task) else {
            continue;
        };
        let Some(inputs) = placed.held.take() else { continue };
        let mut task = r.built;
        let ctx = &mut placed.ctx;
        let installed = (|| -> Result<()> {
            if let Some((notified, last_barrier)) = r.restored {
                ctx.notified = notified;
                ctx.last_barrier = last_barrier;
            }
            if let Some(ck) = &mut ctx.ckpt {
                ck.generation = r.generation;
            }
            let (operator, subtask, parallelism) = (ctx.operator_name().to_string(), ctx.subtask, ctx.parallelism);
            let failed = |what: &str, e: crate::error::BoxError| Error::OperatorFailed {
                operator: operator.clone(),
                subtask,
                parallelism,
                message: format!("{what} after it failed: {e}"),
            };
            task.resume_inputs(inputs, r.checkpoint, r.one_by_one, ctx)
                .map_err(|e| failed("could not resume its inputs", e))?;
            task.open(ctx).map_err(|e| failed("could not open", e))?;
            Ok(())
        })();
        match installed {
            Ok(()) => placed.task = task,
            Err(e) => attempt.fail(e),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn key_group_ranges_partition() {
        for p in 1..=8 {
            let mut next = 0;
            for i in 0..p {
                let r = crate::state::key_groups::key_group_range(i, p, 128);
                assert_eq!(r.start, next);
                next = r.end;
            }
            assert_eq!(next, 128);
        }
    }
}
