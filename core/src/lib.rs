//! # weir-core
//!
//! The dataflow API and runtime of weir, an embeddable single-node stream
//! processor: typed records flow through chains of fused operators, tasks
//! run on worker threads pinned to cores, and tasks exchange records over
//! lock-free single-producer single-consumer rings ([`rtrb`]).
//!
//! ## A tour
//!
//! - [`Pipeline`] builds a job: [`Pipeline::source`], then operators on
//!   [`Stream`] (`map`, `filter`, `flat_map`, `key_by` + `process`,
//!   `rebalance`, `union`), then a sink. [`Pipeline::run`] starts it and
//!   returns a [`JobHandle`] to cancel it, read live [`JobMetrics`] and
//!   [`JobHandle::join`] its result.
//! - [`Source`] and [`Sink`] are the two traits to implement to connect
//!   weir to the outside world; `weir-io` has ready ones.
//! - [`RuntimeConfig`] sets workers, pinning, ring capacity, batch size and
//!   the [`IdleStrategy`]; [`RuntimeConfig::metrics_addr`] serves Prometheus
//!   metrics and a live page while the job runs.
//!
//! ## Guarantees of the runtime
//!
//! - Bounded memory: every ring has a fixed capacity; a full ring stops its
//!   producer (backpressure), nothing is dropped.
//! - No allocation, lock or system call per record in steady state: records
//!   move in batches through reused buffers and chunked ring transfers.
//! - Order: records and control messages on one channel stay in order.
//! - Failure: the first error or panic in any operator fails the whole job
//!   with the operator's name and subtask; no thread is left behind.

#![deny(missing_docs)]

// The layers, bottom to top; a folder uses only the folders above it in
// this list and the base modules at the crate root (error, clock, data,
// latency, watermark). `tests/layers.rs` fails on an import against this order.
mod api;
pub mod checkpoint; // barriers, snapshots, the coordinator, recovery
mod operators; // stateless, keyed, process, windows, joins, event time
mod runtime; // tasks, rings, the job thread, metrics
pub mod state; // keyed state in mapped pages, snapshot files
mod storage; // vfs, syncs, corruption reports, fault points
mod threads; // helper threads: placement, parking, waking, I/O threads // Pipeline, Stream, KeyedStream; the connector harness

pub mod clock;
mod data;
mod error;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
mod latency;
mod watermark;

pub use api::{harness, join, process, window};
pub use operators::{keyed, time, timers};
pub use storage::{corruption, disk, fault, vfs};
pub use threads::{io_thread, periodic};

pub use api::pipeline::{KeyedStream, Pipeline, Stream, MAX_PARALLELISM};
pub use checkpoint::{
    CheckpointConfig, CheckpointMode, CheckpointStats, FailedCheckpoint, RestartStrategy, RestoreFrom, RetainOnCancel,
};
pub use data::Data;
pub use error::{BoxError, Error, Result};
pub use operators::keyed::Output;
pub use runtime::carry;
pub use runtime::config::{
    available_cores, default_state_dir, RuntimeConfig, MAX_BATCH_SIZE, MAX_RING_CAPACITY, MAX_WORKERS,
    MIN_RING_CAPACITY,
};
pub use runtime::context::{SinkContext, SourceContext, VisibleTap};
pub use runtime::delays::{WorkerDelays, GAP_FLOOR_NS};
pub use runtime::job::{JobHandle, JobResult, Outcome};
pub use runtime::metrics::{JobMetrics, TaskMetrics, LATENCY_MAX_NS};
pub use runtime::observe::EndpointStats;
pub use runtime::sink::{CollectSink, ForEachSink, PreCommit, Sink, StateJob, SyncJob};
pub use runtime::source::{Source, SourcePoll, VecSource};
pub use state::StateBackend;
pub use threads::idle::{IdleStrategy, Waker, MAX_PARK};
pub use threads::placement::on_worker_thread;
pub use threads::placement::HelperPlacement;
