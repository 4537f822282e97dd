//! A sink of your own that talks to something slow, without ever making a
//! worker wait: the pattern every weir-io sink follows.
//!
//! The "store" here stands for a remote key-value database: every request
//! takes about a millisecond, whatever its size. Calling it from
//! `Sink::write` would stall the worker (and every other task on its core)
//! for that millisecond at every batch. Instead the sink
//!
//! - runs the store's client on its own thread, a
//!   [`weir_core::io_thread::IoThread`], which handles requests in order;
//! - copies each batch into a pending buffer on the worker and hands the
//!   buffer over whenever no request is in flight, so a slow store gets
//!   larger requests instead of more of them;
//! - says `ready() == false` while too much is pending: the task stops
//!   reading input (backpressure, like a full ring), nothing is dropped;
//! - hands the thread the worker's [`weir_core::Waker`], so a finished
//!   request wakes a parked worker at once;
//! - at a checkpoint barrier, queues a flush and returns
//!   [`weir_core::PreCommit::with_sync`] with a job that waits for it: the
//!   runtime acknowledges the checkpoint only once the store has everything
//!   written before the barrier, and the wait runs off the worker;
//! - finishes asynchronously: after `finish`, `ready()` turns true once the
//!   thread is done.
//!
//! Run it with `cargo run --release -p weir-bench --example slow_store_sink`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use weir_core::io_thread::{IoHandler, IoThread};
use weir_core::{BoxError, CheckpointConfig, CheckpointMode, PreCommit, RuntimeConfig, Sink, SinkContext, VecSource};

/// What one store request costs, whatever its size.
const REQUEST_LATENCY: Duration = Duration::from_millis(1);

/// Pending entries beyond which the sink backpressures.
const MAX_PENDING: usize = 50_000;

/// The "remote" store: latest value per key, plus how many requests it
/// served.
#[derive(Default)]
struct Store {
    entries: BTreeMap<u64, u64>,
    requests: u64,
    flushes: u64,
}

/// What the sink asks of its thread.
enum Request {
    /// Put these entries; the vector comes back empty for reuse.
    Put(Vec<(u64, u64)>),
    /// Make everything put so far durable.
    Flush,
}

/// The sink's thread: the store client.
struct Client(Arc<Mutex<Store>>);

impl IoHandler for Client {
    type Request = Request;
    type Reply = Option<Vec<(u64, u64)>>;

    fn handle(&mut self, request: Request) -> Result<Self::Reply, BoxError> {
        std::thread::sleep(REQUEST_LATENCY);
        let mut store = self.0.lock().map_err(|_| "the store is poisoned")?;
        store.requests += 1;
        match request {
            Request::Put(mut entries) => {
                store.entries.extend(entries.drain(..));
                Ok(Some(entries))
            }
            Request::Flush => {
                store.flushes += 1;
                Ok(None)
            }
        }
    }
}

/// Puts `(key, value)` records into the store, off the worker.
struct StoreSink {
    io: IoThread<Client>,
    pending: Vec<(u64, u64)>,
    /// A vector back from the thread, reused for the next pending batch.
    spare: Option<Vec<(u64, u64)>>,
    puts_in_flight: usize,
    finishing: bool,
}

impl StoreSink {
    fn new(store: Arc<Mutex<Store>>, subtask: usize) -> Result<Self, BoxError> {
        Ok(StoreSink {
            io: IoThread::spawn(&format!("store-sink-{subtask}"), Client(store), 16)?,
            pending: Vec::new(),
            spare: None,
            puts_in_flight: 0,
            finishing: false,
        })
    }

    /// Takes finished requests' replies (recycles their vectors).
    fn take_replies(&mut self) -> Result<(), BoxError> {
        while let Some(reply) = self.io.try_reply()? {
            if let Some(emptied) = reply {
                self.puts_in_flight -= 1;
                self.spare = Some(emptied);
            }
        }
        Ok(())
    }

    /// Hands the pending entries over if no put is in flight (or `force`).
    fn send(&mut self, force: bool) -> Result<(), BoxError> {
        if self.pending.is_empty() || (self.puts_in_flight > 0 && !force) {
            return Ok(());
        }
        let next = self.spare.take().unwrap_or_default();
        let batch = std::mem::replace(&mut self.pending, next);
        self.io.submit(Request::Put(batch))?;
        self.puts_in_flight += 1;
        Ok(())
    }
}

impl Sink<(u64, u64)> for StoreSink {
    fn write(&mut self, batch: &mut Vec<(u64, u64)>, ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
        self.io.set_waker(ctx.waker());
        self.pending.append(batch);
        self.take_replies()?;
        self.send(false)
    }

    fn ready(&mut self, _ctx: &mut SinkContext<'_>) -> Result<bool, BoxError> {
        self.take_replies()?;
        self.send(false)?;
        if self.finishing {
            return Ok(self.pending.is_empty() && self.io.in_flight() == 0);
        }
        Ok(self.pending.len() < MAX_PENDING)
    }

    fn pre_commit_detached(&mut self, _checkpoint: u64) -> Result<PreCommit, BoxError> {
        // Everything before the barrier, then the flush, in order.
        self.send(true)?;
        let ticket = self.io.submit(Request::Flush)?;
        Ok(PreCommit::with_sync(Vec::new(), self.io.completion(ticket)))
    }

    fn pre_commit(&mut self, checkpoint: u64) -> Result<Vec<u8>, BoxError> {
        self.pre_commit_detached(checkpoint)?.wait()
    }

    fn finish(&mut self, _ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
        self.send(true)?;
        self.io.submit(Request::Flush)?;
        self.finishing = true;
        Ok(())
    }
}

fn main() -> Result<(), BoxError> {
    const RECORDS: u64 = 3_000_000;
    let input: Arc<Vec<(u64, u64)>> = Arc::new((0..RECORDS).map(|i| (i % 1000, i)).collect());
    let store = Arc::new(Mutex::new(Store::default()));
    let dir = tempfile::tempdir()?;

    let p = weir_core::Pipeline::new("slow-store");
    let s = Arc::clone(&store);
    p.source("numbers", 2, move |i, n| VecSource::new(Arc::clone(&input), i, n))
        .sink("store", move |i| {
            StoreSink::new(Arc::clone(&s), i).expect("the store sink's thread starts")
        });
    let config = RuntimeConfig {
        checkpointing: Some(CheckpointConfig {
            interval: Duration::from_millis(20),
            ..CheckpointConfig::new(CheckpointMode::AtLeastOnce, dir.path())
        }),
        ..RuntimeConfig::default()
    };
    let result = p.run(config)?.join()?;

    let store = store.lock().map_err(|_| "the store is poisoned")?;
    println!(
        "{} records in {:.2} s; the store served {} requests ({} flushes at barriers and the end), \
         so ~{} records per put; {} checkpoints completed",
        RECORDS,
        result.elapsed.as_secs_f64(),
        store.requests,
        store.flushes,
        RECORDS / (store.requests - store.flushes).max(1),
        result.metrics.checkpoints.completed,
    );
    // Every key arrived, with one of its own values.
    assert_eq!(store.entries.len(), 1000);
    assert!(store.entries.iter().all(|(k, v)| v % 1000 == *k));
    Ok(())
}
