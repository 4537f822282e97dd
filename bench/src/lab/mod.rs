//! The lab: `weir bench` and `weir compare`, and what they measure with.
//!
//! - [`bench`] and [`compare`]: the two commands (their arguments, runs,
//!   tables, JSON and SVG);
//! - [`pipelines`], [`nexmark_jobs`], [`event`], [`kafka_bench`]: the
//!   benchmark jobs;
//! - the machine during and around a run: [`worker_gaps`] (the platform
//!   figure, from the workers' own gaps), [`platform`] (the opt-in
//!   wake-up probe), [`co_runners`], [`cpu_time`], [`copy_probe`],
//!   [`parts_probe`], [`handoff_probe`], [`disk_probe`]; [`disk_load`]
//!   (the disk-busy scenario's co-runner);
//! - [`scaling_model`], [`metrics_ab`]: models and A/B designs read off
//!   the runs;
//! - [`report`], [`plot`]: results as rows, JSON and figures.
//!
//! The lab may use the production commands' code ([`crate::cmd`]) and
//! [`crate::cli`]; nothing outside the lab uses the lab.

pub mod bench;
pub mod co_runners;
pub mod compare;
pub mod copy_probe;
pub mod cpu_time;
pub mod disk_load;
pub mod disk_probe;
pub mod disk_writes;
pub mod event;
pub mod failure;
pub mod handoff_probe;
pub mod kafka_bench;
pub mod kafka_compare;
pub mod kafka_parts;
pub mod metrics_ab;
pub mod nexmark_jobs;
pub mod parts_probe;
pub mod pipelines;
pub mod platform;
pub mod plot;
pub mod report;
pub mod scaling_model;
pub mod worker_gaps;
