//! The job's snapshot pool, and a way into it that never makes a worker
//! wait.
//!
//! A task's asynchronous part of a checkpoint (the state jobs, the waits of
//! the sinks' pre-commits, the task's state file) runs on the job's rayon
//! pool, on the helper cores. Spawning into a rayon pool wakes a sleeping
//! pool thread under that thread's own mutex, which the pool thread also
//! holds as it falls asleep and as it wakes; when another thread on the
//! helper core preempts it there, the spawning thread waits for the lock.
//! On a worker that is a stall of every record on its core: with the
//! two-phase file sink at a 10 ms interval (2 cores, one worker), the
//! second task to reach a barrier can wait over 150 µs, up to
//! milliseconds, to spawn (docs/design/architecture.md#where-weirs-own-threads-run;
//! the figures: docs/notebook/benchmarks-2026-12.md, "The two-phase file
//! sink's p99.9 on the worker").
//!
//! So a task does not spawn: [`SnapshotPool::spawn`] pushes the job on a
//! bounded lock-free queue and wakes the **spawner** thread only if it
//! parked (a fence and a load otherwise: the protocol of the workers' own
//! parking, [`Parker`]), through the job's wake-up relay
//! ([`crate::threads::relay`]); the spawner, on the helper cores, moves each job
//! into the rayon pool. Contract:
//!
//! - **Never lost.** Every job handed to `spawn` runs on the pool: if the
//!   queue is full ([`QUEUE_JOBS`], far more than a job's tasks times the
//!   checkpoints in flight), `spawn` hands it to the pool itself, as
//!   before, rather than wait or drop; and dropping the pool moves the
//!   jobs still queued into the rayon pool before the spawner ends.
//! - **Handed over in order**: the jobs of one spawning thread reach the
//!   pool in the order they were spawned, while the queue has room (one
//!   queue, first in, first out); the pool runs them as its threads come
//!   free, as before.
//! - **Bounded**: the queue holds at most [`QUEUE_JOBS`] jobs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_queue::ArrayQueue;

use crate::threads::idle::Parker;
use crate::threads::placement::HelperCores;
use crate::threads::relay::{Doorbell, WakeRelay};

/// Jobs the queue holds at most before [`SnapshotPool::spawn`] hands a job
/// to the pool itself: 1024, against one job per task per checkpoint.
pub(crate) const QUEUE_JOBS: usize = 1024;

type Job = Box<dyn FnOnce() + Send + 'static>;

struct Inbox {
    jobs: ArrayQueue<Job>,
    stop: AtomicBool,
}

/// The job's snapshot pool and its spawner thread; see the module docs.
pub(crate) struct SnapshotPool {
    pool: Arc<rayon::ThreadPool>,
    inbox: Arc<Inbox>,
    /// Wakes the spawner (through the job's wake-up relay, if any).
    doorbell: Doorbell,
    spawner: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for SnapshotPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotPool")
            .field("threads", &self.pool.current_num_threads())
            .field("queued", &self.inbox.jobs.len())
            .finish()
    }
}

impl SnapshotPool {
    /// Wraps `pool` and starts its spawner thread on `helpers` (the cores
    /// of weir's own threads; `None`: unpinned), woken through `relay`
    /// (`None`: directly).
    pub(crate) fn new(
        pool: Arc<rayon::ThreadPool>,
        helpers: HelperCores,
        relay: Option<Arc<WakeRelay>>,
    ) -> std::io::Result<Self> {
        let inbox = Arc::new(Inbox {
            jobs: ArrayQueue::new(QUEUE_JOBS),
            stop: AtomicBool::new(false),
        });
        let parker = Arc::new(Parker::default());
        let (i, p, park) = (Arc::clone(&inbox), Arc::clone(&pool), Arc::clone(&parker));
        let spawner = std::thread::Builder::new()
            .name("weir-snapshot-spawner".into())
            .spawn(move || {
                crate::threads::placement::enter(helpers);
                park.register();
                loop {
                    // The stop first: what was queued before it still goes
                    // into the pool, not lost.
                    let stopping = i.stop.load(Ordering::Acquire);
                    while let Some(job) = i.jobs.pop() {
                        p.spawn(job);
                    }
                    if stopping {
                        break;
                    }
                    park.park_unless(|| !i.jobs.is_empty() || i.stop.load(Ordering::Acquire));
                }
            })?;
        Ok(SnapshotPool {
            pool,
            inbox,
            doorbell: Doorbell::new(parker, relay),
            spawner: Some(spawner),
        })
    }

    /// Runs `job` on the pool, soon; never waits for a lock or for the
    /// pool (see the module docs).
    pub(crate) fn spawn(&self, job: impl FnOnce() + Send + 'static) {
        match self.inbox.jobs.push(Box::new(job)) {
            Ok(()) => self.doorbell.ring(),
            // Full: far beyond any job's need; run it rather than wait.
            Err(job) => self.pool.spawn(job),
        }
    }
}

impl Drop for SnapshotPool {
    fn drop(&mut self) {
        self.inbox.stop.store(true, Ordering::Release);
        if let Some(t) = self.spawner.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    fn pool(threads: usize) -> SnapshotPool {
        let rayon = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        SnapshotPool::new(Arc::new(rayon), None, None).unwrap()
    }

    #[test]
    fn a_spawn_wakes_a_parked_spawner_and_every_job_runs() {
        let p = pool(1);
        let (tx, rx) = mpsc::channel();
        for round in 0..10u32 {
            // Let the spawner park (a minute in tests): only the spawn's
            // wake-up gets the job into the pool.
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while !p.doorbell.parker().is_sleeping() {
                assert!(std::time::Instant::now() < deadline, "the spawner never parked");
                std::thread::yield_now();
            }
            let tx = tx.clone();
            p.spawn(move || tx.send(round).unwrap());
            assert_eq!(
                rx.recv_timeout(Duration::from_secs(30)),
                Ok(round),
                "a parked spawner is woken by the spawn"
            );
        }
    }

    #[test]
    fn a_full_queue_and_a_drop_lose_no_job() {
        // One pool thread, blocked: the spawner moves jobs into rayon's
        // queue, where they wait; more than QUEUE_JOBS of them at once
        // overflow into `spawn`'s direct path.
        let p = pool(1);
        let (gate_tx, gate_rx) = mpsc::channel::<()>();
        p.spawn(move || gate_rx.recv().unwrap());
        let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let n = 3 * QUEUE_JOBS;
        for _ in 0..n {
            let ran = Arc::clone(&ran);
            p.spawn(move || {
                ran.fetch_add(1, Ordering::SeqCst);
            });
        }
        let rayon = Arc::clone(&p.pool);
        drop(p);
        gate_tx.send(()).unwrap();
        // Every job reached the rayon pool before the drop returned; a last
        // job queued behind them runs once they all did.
        let (done_tx, done_rx) = mpsc::channel();
        rayon.spawn_fifo(move || done_tx.send(()).unwrap());
        done_rx.recv_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), n);
    }
}
