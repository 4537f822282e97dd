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

pub mod checkpoint;
pub mod clock;
mod collector;
mod config;
mod context;
pub mod corruption;
mod data;
pub mod disk;
mod error;
pub mod fault;
#[doc(hidden)]
pub mod fuzzing;
pub mod harness;
mod idle;
pub mod io_thread;
mod job;
pub mod join;
pub mod keyed;
mod message;
mod metrics;
mod observe;
mod operators;
mod output;
pub mod periodic;
mod pipeline;
mod placement;
pub mod process;
mod relay;
mod sink;
mod source;
pub mod state;
mod stores;
mod task;
pub mod time;
pub mod timers;
pub mod vfs;
pub mod window;

#[cfg(test)]
mod ring_tests;

pub use checkpoint::{
    CheckpointConfig, CheckpointMode, CheckpointStats, FailedCheckpoint, RestartStrategy, RestoreFrom, RetainOnCancel,
};
pub use config::{
    available_cores, default_state_dir, RuntimeConfig, MAX_BATCH_SIZE, MAX_RING_CAPACITY, MAX_WORKERS,
    MIN_RING_CAPACITY,
};
pub use context::{SinkContext, SourceContext};
pub use data::Data;
pub use error::{BoxError, Error, Result};
pub use idle::{IdleStrategy, Waker, MAX_PARK};
pub use job::{on_worker_thread, JobHandle, JobResult, Outcome};
pub use keyed::Output;
pub use metrics::{JobMetrics, TaskMetrics, LATENCY_MAX_NS};
pub use observe::EndpointStats;
pub use pipeline::{KeyedStream, Pipeline, Stream, MAX_PARALLELISM};
pub use placement::HelperPlacement;
pub use sink::{CollectSink, ForEachSink, PreCommit, Sink, StateJob, SyncJob};
pub use source::{Source, SourcePoll, VecSource};
