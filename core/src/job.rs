//! Running a job: worker threads, task placement, failure and cancel.
//!
//! Worker `w` is pinned to core `w mod cores` and runs its tasks round-robin,
//! one batch budget per task per round. A round in which no task progressed
//! lets the worker back off by the [`crate::IdleStrategy`]. When there are
//! more workers than cores, spinning is switched off so that two
//! busy-spinning threads never share a core.
//!
//! The first error or panic of any task is recorded (with operator name and
//! subtask), every worker is told to stop, and [`JobHandle::join`] returns it.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

use crate::config::{available_cores, RuntimeConfig};
use crate::context::TaskContext;
use crate::error::{Error, Result};
use crate::idle::{IdleStrategy, Idler};
use crate::metrics::{JobMetrics, MetricsRegistry, TaskCounters};
use crate::task::{Task, TaskPoll};

/// The tasks of one chain, as built by the pipeline.
pub(crate) struct GroupTasks {
    pub(crate) ops: Arc<[String]>,
    pub(crate) parallelism: usize,
    pub(crate) input_capacity: u64,
    pub(crate) tasks: Vec<Box<dyn Task>>,
}

struct Placed {
    task: Box<dyn Task>,
    ctx: TaskContext,
}

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
    /// Wall-clock time from start to the last worker's exit.
    pub elapsed: Duration,
    /// Final metrics.
    pub metrics: JobMetrics,
}

struct Shared {
    cancel: AtomicBool,
    failure: Mutex<Option<Error>>,
    workers: Mutex<Vec<Thread>>,
    running_workers: AtomicUsize,
    registry: Arc<MetricsRegistry>,
}

impl Shared {
    fn stop_all(&self) {
        self.cancel.store(true, Ordering::Release);
        for t in self.workers.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            t.unpark();
        }
    }

    fn fail(&self, error: Error) {
        let mut f = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_none() {
            *f = Some(error);
        }
        drop(f);
        self.stop_all();
    }
}

/// A running job: cancel it, watch its metrics, wait for its result.
///
/// Dropping the handle cancels the job and waits for its threads.
pub struct JobHandle {
    name: String,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    started: Instant,
}

impl JobHandle {
    /// The job's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Asks every worker to stop; returns at once. Workers notice within one
    /// scheduling round or one park timeout (at most 50 ms).
    pub fn cancel(&self) {
        self.shared.stop_all();
    }

    /// True once every worker has exited.
    pub fn is_finished(&self) -> bool {
        self.shared.running_workers.load(Ordering::Acquire) == 0
    }

    /// Live metrics: records per task, ring occupancy, latency so far.
    pub fn metrics(&self) -> JobMetrics {
        self.shared.registry.snapshot()
    }

    /// Waits for the job to end; returns its error if any task failed.
    pub fn join(mut self) -> Result<JobResult> {
        self.join_threads();
        let elapsed = self.started.elapsed();
        if let Some(e) = self.shared.failure.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return Err(e);
        }
        let outcome = if self.shared.cancel.load(Ordering::Acquire) {
            Outcome::Cancelled
        } else {
            Outcome::Finished
        };
        Ok(JobResult {
            outcome,
            elapsed,
            metrics: self.shared.registry.snapshot(),
        })
    }

    fn join_threads(&mut self) {
        for t in self.threads.drain(..) {
            // Worker bodies catch task panics; a panic here is a runtime bug.
            if t.join().is_err() {
                self.shared.fail(Error::InvalidPipeline(
                    "a worker thread panicked outside any task".into(),
                ));
            }
        }
    }
}

impl Drop for JobHandle {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.shared.stop_all();
            self.join_threads();
        }
    }
}

/// Places tasks on workers and starts the workers.
pub(crate) fn start(name: String, groups: Vec<GroupTasks>, config: RuntimeConfig) -> Result<JobHandle> {
    let mut counters = Vec::new();
    let mut pending = Vec::new();
    for g in groups {
        let chain_name = g.ops.join(" -> ");
        for (i, task) in g.tasks.into_iter().enumerate() {
            let c = Arc::new(TaskCounters::new(
                chain_name.clone(),
                i,
                g.parallelism,
                g.input_capacity,
            ));
            counters.push(c.clone());
            pending.push((task, g.ops.clone(), i, g.parallelism, c));
        }
    }
    let registry = Arc::new(MetricsRegistry::new(counters));
    let workers = config.workers.min(pending.len()).max(1);
    let mut per_worker: Vec<Vec<Placed>> = (0..workers).map(|_| Vec::new()).collect();
    // Task k goes to worker k mod workers. Chains are listed upstream
    // first, so subtask i of consecutive chains of equal parallelism shares
    // a worker (local handoffs), and small chains spread over workers.
    for (k, (task, ops, subtask, parallelism, c)) in pending.into_iter().enumerate() {
        let ctx = TaskContext::new(subtask, parallelism, ops, c, registry.clone());
        per_worker[k % workers].push(Placed { task, ctx });
    }
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let oversubscribed = workers > available_cores();
    let idle = if oversubscribed {
        IdleStrategy {
            spins: 0,
            ..config.idle
        }
    } else {
        config.idle
    };
    let shared = Arc::new(Shared {
        cancel: AtomicBool::new(false),
        failure: Mutex::new(None),
        workers: Mutex::new(Vec::new()),
        running_workers: AtomicUsize::new(workers),
        registry,
    });
    let mut threads = Vec::with_capacity(workers);
    for (w, tasks) in per_worker.into_iter().enumerate() {
        let core = if config.pin_workers && !cores.is_empty() {
            Some(cores[w % cores.len()])
        } else {
            None
        };
        let sh = shared.clone();
        let spawned = thread::Builder::new()
            .name(format!("weir-worker-{w}"))
            .spawn(move || worker_main(tasks, core, idle, &sh));
        match spawned {
            Ok(t) => {
                shared
                    .workers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(t.thread().clone());
                threads.push(t);
            }
            Err(source) => {
                shared.running_workers.fetch_sub(workers - w, Ordering::AcqRel);
                shared.stop_all();
                for t in threads {
                    let _ = t.join();
                }
                return Err(Error::Spawn { worker: w, source });
            }
        }
    }
    Ok(JobHandle {
        name,
        shared,
        threads,
        started: Instant::now(),
    })
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

fn worker_main(mut tasks: Vec<Placed>, core: Option<core_affinity::CoreId>, idle: IdleStrategy, shared: &Shared) {
    if let Some(core) = core {
        // Pinning is best-effort: an unpinned worker is slower, not wrong.
        let _ = core_affinity::set_for_current(core);
    }
    let mut idler = Idler::new(idle);
    while !tasks.is_empty() && !shared.cancel.load(Ordering::Relaxed) {
        let mut progressed = false;
        let mut i = 0;
        while i < tasks.len() {
            let placed = &mut tasks[i];
            let result = catch_unwind(AssertUnwindSafe(|| placed.task.poll(&mut placed.ctx)));
            placed.ctx.end_turn();
            let failure = match result {
                Ok(Ok(TaskPoll::Progress)) => {
                    progressed = true;
                    None
                }
                Ok(Ok(TaskPoll::Idle)) => None,
                Ok(Ok(TaskPoll::Done)) => {
                    tasks.swap_remove(i);
                    progressed = true;
                    continue;
                }
                Ok(Err(e)) => Some(e.to_string()),
                Err(payload) => Some(panic_message(&*payload)),
            };
            if let Some(message) = failure {
                let ctx = &placed.ctx;
                shared.fail(Error::OperatorFailed {
                    operator: ctx.operator_name().to_string(),
                    subtask: ctx.subtask,
                    parallelism: ctx.parallelism,
                    message,
                });
                break;
            }
            i += 1;
        }
        if progressed {
            idler.reset();
        } else {
            idler.idle();
        }
    }
    // Dropping the tasks here drops their rings on this thread.
    drop(tasks);
    shared.running_workers.fetch_sub(1, Ordering::AcqRel);
}
