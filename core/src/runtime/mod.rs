//! The runtime: a job's tasks on pinned workers, the rings between them, and
//! the job thread that starts, restarts and stops them.
//!
//! - [`plan`]: the physical plan the API builds and the runtime runs;
//! - [`job`]: starting a job, restarts, the final result;
//! - [`task`]: the unit a worker schedules (source tasks, input tasks and
//!   their barrier handling), with [`collector`] (the calling convention of
//!   a chain) and [`context`] (what a task knows about itself);
//! - [`output`] and [`message`]: what a chain hands to rings, and in what
//!   format; [`source`] and [`sink`]: the contracts of the two ends;
//! - [`carry`]: what a failed sink leaves its replacement in a dedup recovery;
//! - [`config`], [`metrics`], [`observe`]: settings, counters, the endpoint;
//!   [`delays`]: how long the machine kept the workers from their loops.
//!
//! Uses the checkpoint, state, thread and storage layers below it; the
//! operators and the API above it use it.

pub mod carry;
pub(crate) mod collector;
pub(crate) mod config;
pub(crate) mod context;
pub(crate) mod delays;
pub(crate) mod input_watermarks;
pub(crate) mod job;
pub(crate) mod message;
pub(crate) mod metrics;
pub(crate) mod observe;
pub(crate) mod output;
pub(crate) mod output_ledger;
pub(crate) mod plan;
pub(crate) mod sink;
pub(crate) mod source;
pub(crate) mod task;

#[cfg(test)]
mod ring_tests;
