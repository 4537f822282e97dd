//! # weir-io
//!
//! Sources, sinks and file formats for weir. Everything here is built on
//! the [`weir_core::Source`] and [`weir_core::Sink`] traits; nothing in
//! `weir-core` depends on this crate.
//!
//! - [`generator`]: a deterministic, replayable generator source, bounded
//!   or unbounded, at full speed or at a fixed rate, used by the benchmarks.

#![deny(missing_docs)]

mod error;
pub mod generator;

pub use error::{Error, Result};
pub use generator::{GenContext, Generator, GeneratorConfig};
