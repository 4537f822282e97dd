//! Resuming a job from its checkpoint: run it, kill it mid-way, start it
//! again from the same checkpoint directory, and check that the result is
//! the one an uninterrupted run gives.
//!
//! ```text
//! orders (source, p=2) --key_by(customer)--> totals (count, sum) -> upsert (p=2) -> table
//! ```
//!
//! 1. The job runs with aligned checkpoints every 100 ms into a directory.
//! 2. Once three checkpoints have completed, it is stopped with
//!    [`JobHandle::cancel`] and [`RetainOnCancel::Keep`]: like a killed
//!    process, nothing of it survives but the checkpoint directory and what
//!    its sink already wrote to the table (the table stands for an external
//!    key-value store).
//! 3. The same pipeline starts again with [`RestoreFrom::Latest`]: every
//!    keyed subtask gets its per-customer state back, every source seeks to
//!    the offset stored in the checkpoint, and the job runs to its end.
//! 4. The per-customer totals in the table are compared with a direct
//!    computation over all orders. The upsert sink is idempotent, so the
//!    orders processed again after the restore (those between the
//!    checkpoint and the kill) overwrite rows with the same values.
//!
//! Run it with `cargo run --release -p weir-bench --example resume`; it
//! takes about two seconds (the source is paced at 200,000 orders per
//! second so that the kill lands mid-way). The checkpoints stay in the
//! printed directory: look at them with
//! `cargo run --release -p weir-bench -- checkpoints list DIR`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use weir_core::checkpoint::storage;
use weir_core::{
    BoxError, CheckpointConfig, CheckpointMode, JobHandle, JobMetrics, Outcome, Output, Pipeline, RestoreFrom,
    RetainOnCancel, RuntimeConfig, Sink, SinkContext, Source, SourceContext, SourcePoll,
};

/// Orders in the whole input, over all source subtasks.
const ORDERS: u64 = 400_000;
/// Distinct customers (keys).
const CUSTOMERS: u64 = 1_000;
/// Parallelism of the source and of the keyed operator.
const PARALLELISM: usize = 2;
/// Orders per second emitted by each source subtask.
const PACE_PER_SUBTASK: f64 = 100_000.0;
/// Checkpoints that must complete before the first run is killed.
const KILL_AFTER_CHECKPOINTS: u64 = 3;

/// One order.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
struct Order {
    customer: u64,
    cents: u64,
}

/// SplitMix64 finaliser: a deterministic pseudo-random word per sequence number.
fn mix(seq: u64) -> u64 {
    let mut z = seq.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Order number `seq` of the input: the same in every run.
fn order(seq: u64) -> Order {
    let r = mix(seq);
    Order {
        customer: r % CUSTOMERS,
        cents: 100 + (r >> 32) % 10_000,
    }
}

/// Emits the orders `subtask, subtask + parallelism, ...` below [`ORDERS`],
/// at most [`PACE_PER_SUBTASK`] per second. Replayable: its offset is the
/// next order number, and a restored source starts there.
struct Orders {
    next: u64,
    stride: u64,
    /// When pacing started and the order number it started at.
    paced_from: Option<(Instant, u64)>,
}

impl Source<Order> for Orders {
    fn poll(&mut self, out: &mut Vec<Order>, max: usize, _: &mut SourceContext<'_>) -> Result<SourcePoll, BoxError> {
        let (start, first) = *self.paced_from.get_or_insert((Instant::now(), self.next));
        let due = first + (start.elapsed().as_secs_f64() * PACE_PER_SUBTASK) as u64 * self.stride;
        while out.len() < max && self.next < ORDERS && self.next <= due {
            out.push(order(self.next));
            self.next += self.stride;
        }
        Ok(if self.next >= ORDERS {
            SourcePoll::Done
        } else if out.is_empty() {
            SourcePoll::Idle
        } else {
            SourcePoll::Ready
        })
    }

    fn offset(&self) -> Vec<u8> {
        self.next.to_le_bytes().to_vec()
    }

    fn seek(&mut self, offset: &[u8]) -> Result<(), BoxError> {
        let bytes: [u8; 8] = offset
            .try_into()
            .map_err(|_| format!("an Orders offset is 8 bytes, got {}", offset.len()))?;
        self.next = u64::from_le_bytes(bytes);
        Ok(())
    }

    fn is_replayable(&self) -> bool {
        true
    }
}

/// Per-customer state: orders so far and their total.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Totals {
    orders: u64,
    cents: u64,
}

/// The external table: customer -> latest totals.
type Table = Arc<Mutex<HashMap<u64, Totals>>>;

/// Writes every update to the table; writing a row twice with the same
/// value changes nothing, which is what makes replays harmless here.
struct Upsert {
    table: Table,
}

impl Sink<(u64, Totals)> for Upsert {
    fn write(&mut self, batch: &mut Vec<(u64, Totals)>, _: &mut SinkContext<'_>) -> Result<(), BoxError> {
        let mut t = self.table.lock().map_err(|_| "the table lock is poisoned")?;
        t.extend(batch.drain(..));
        Ok(())
    }
}

/// The job; both runs build exactly this graph, so the second one's
/// fingerprint matches the checkpoint's.
fn start(table: &Table, dir: &Path, restore: RestoreFrom) -> Result<JobHandle, BoxError> {
    let pipeline = Pipeline::new("customer-totals");
    let table = table.clone();
    pipeline
        .source("orders", PARALLELISM, |i, p| Orders {
            next: i as u64,
            stride: p as u64,
            paced_from: None,
        })
        .key_by(|o: &Order| o.customer)
        .parallelism(PARALLELISM)
        .process_heap(
            |customer: &u64, t: &mut Totals, o: Order, out: &mut Output<(u64, Totals)>| {
                t.orders += 1;
                t.cents += o.cents;
                out.emit((*customer, *t));
            },
        )
        .name("totals")
        .sink("upsert", move |_| Upsert { table: table.clone() });
    let config = RuntimeConfig {
        workers: 2,
        checkpointing: Some(CheckpointConfig {
            interval: Duration::from_millis(100),
            retain_on_cancel: RetainOnCancel::Keep,
            restore,
            ..CheckpointConfig::new(CheckpointMode::Aligned, dir)
        }),
        ..RuntimeConfig::default()
    };
    Ok(pipeline.run(config)?)
}

/// Orders the source subtasks emitted so far.
fn orders_read(m: &JobMetrics) -> u64 {
    m.tasks
        .iter()
        .filter(|t| t.input_capacity == 0)
        .map(|t| t.records_in)
        .sum()
}

/// The latest complete checkpoint in `dir`.
fn latest_complete(dir: &Path) -> Option<u64> {
    let ids = storage::list_ids(dir).ok()?;
    ids.into_iter()
        .rev()
        .find(|&id| matches!(storage::read_manifest(dir, id), Ok(Some(_))))
}

fn main() -> Result<(), BoxError> {
    let dir: PathBuf = std::env::temp_dir().join("weir-resume-example");
    // Start from an empty directory; it is left behind for inspection.
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    let table: Table = Arc::default();
    println!("checkpoint directory: {}", dir.display());

    // Run 1, killed after a few checkpoints.
    let t0 = Instant::now();
    let job = start(&table, &dir, RestoreFrom::Nothing)?;
    while job.metrics().checkpoints.completed < KILL_AFTER_CHECKPOINTS {
        assert!(!job.is_finished(), "the job ended before it could be killed");
        std::thread::sleep(Duration::from_millis(5));
    }
    job.cancel();
    let first = job.join()?;
    assert_eq!(first.outcome, Outcome::Cancelled);
    let read_before_kill = orders_read(&first.metrics);
    let resume_from = latest_complete(&dir).ok_or("no complete checkpoint was left on disk")?;
    println!(
        "run 1: killed after {:.0} ms; {} checkpoints completed; {read_before_kill} of {ORDERS} orders read; \
         {} customers in the table",
        t0.elapsed().as_secs_f64() * 1e3,
        first.metrics.checkpoints.completed,
        table.lock().map_err(|_| "poisoned")?.len()
    );

    // Run 2: the same pipeline, restored from the latest checkpoint.
    let t1 = Instant::now();
    let second = start(&table, &dir, RestoreFrom::Latest)?.join()?;
    assert_eq!(second.outcome, Outcome::Finished);
    let restored = second.metrics.checkpoints.restored_from;
    let read_after = orders_read(&second.metrics);
    println!(
        "run 2: restored from checkpoint {}; read {read_after} orders in {:.0} ms; {} more checkpoints (the last \
         one final)",
        restored.map_or("none".to_string(), |id| id.to_string()),
        t1.elapsed().as_secs_f64() * 1e3,
        second.metrics.checkpoints.completed
    );
    assert_eq!(
        restored,
        Some(resume_from),
        "run 2 starts from the latest complete checkpoint"
    );
    let skipped = ORDERS - read_after;
    assert!(
        skipped > 0 && skipped <= read_before_kill,
        "the sources resumed at the checkpoint's offsets"
    );
    println!(
        "       the {skipped} orders before checkpoint {resume_from} were not read again; the {} that run 1 read \
         after it were",
        read_before_kill - skipped
    );

    // The table against a direct computation over every order.
    let mut expected: HashMap<u64, Totals> = HashMap::new();
    for seq in 0..ORDERS {
        let o = order(seq);
        let t = expected.entry(o.customer).or_default();
        t.orders += 1;
        t.cents += o.cents;
    }
    let got = table.lock().map_err(|_| "poisoned")?;
    let wrong: Vec<u64> = expected
        .iter()
        .filter(|(c, t)| got.get(c) != Some(t))
        .map(|(c, _)| *c)
        .collect();
    if !wrong.is_empty() || got.len() != expected.len() {
        return Err(format!(
            "{} of {} customers have wrong totals (e.g. {:?}); the table has {} rows",
            wrong.len(),
            expected.len(),
            wrong.first(),
            got.len()
        )
        .into());
    }
    let (orders, cents) = got.values().fold((0, 0), |(n, c), t| (n + t.orders, c + t.cents));
    println!(
        "result: all {} customers' totals equal a direct computation ({orders} orders, {cents} cents in all)",
        got.len()
    );
    println!(
        "inspect the checkpoints: cargo run --release -p weir-bench -- checkpoints list {}",
        dir.display()
    );
    Ok(())
}
