//! The short way to a sink: one function per kind of output, returning what
//! [`weir_core::Stream::sink`] takes (a factory the runtime calls with each
//! subtask's index), so a job names neither the subtask nor the sink's
//! type. Emission timestamps are left out: the sinks then record no
//! latency (a stamp of 0 means unknown). The sinks' own constructors
//! ([`WalSink::new`], [`DirectFileSink::new`], [`FileTransactions::new`],
//! [`crate::kafka::exactly_once`]) take the subtask and a stamp function,
//! for benchmarks and for settings these functions leave at their defaults.
//!
//! | function | guarantee | output visible |
//! |---|---|---|
//! | [`wal_files`] | exactly-once | when a checkpoint completes |
//! | [`two_phase_files`] | exactly-once | when a checkpoint completes |
//! | [`direct_files`] | at-least-once | as records arrive |
//! | [`kafka_exactly_once`] | exactly-once (`read_committed` readers) | when a checkpoint completes |
//! | [`kafka_at_least_once`] | at-least-once | as the broker acknowledges |
//!
//! ```no_run
//! use weir_core::{CheckpointConfig, Pipeline, RuntimeConfig, VecSource};
//! use weir_io::sinks;
//! use weir_io::text::Line;
//! # use std::sync::Arc;
//! # let numbers = Arc::new((0..100u64).collect::<Vec<_>>());
//!
//! let pipeline = Pipeline::new("copy");
//! pipeline
//!     .source("numbers", 1, move |i, n| VecSource::new(numbers.clone(), i, n))
//!     .sink("out", sinks::wal_files("state/wal", "out", |n: &u64, buf: &mut Vec<u8>| {
//!         Line::new(buf).u64(*n).end()
//!     }));
//! let config = RuntimeConfig {
//!     checkpointing: Some(CheckpointConfig::exactly_once("state/checkpoints")),
//!     ..RuntimeConfig::default()
//! };
//! pipeline.run(config)?.join()?;
//! # Ok::<(), weir_core::Error>(())
//! ```

use std::path::PathBuf;
use std::sync::Arc;

use crate::direct::DirectFileSink;
use crate::kafka::{KafkaAtLeastOnceSink, KafkaExactlyOnceSink, KafkaSinkConfig};
use crate::twophase::file::FileTransactions;
use crate::twophase::TwoPhaseCommitSink;
use crate::wal::{WalSink, WalSinkConfig};

/// The stamp function of a sink built here: none (every record's emission
/// time is unknown, so no latency is recorded).
pub type NoStamp<T> = fn(&T) -> u64;

fn no_stamp<T>(_: &T) -> u64 {
    0
}

/// Exactly-once files through a write-ahead log: each subtask logs its
/// records in `wal_dir` (synced at each barrier) and, when a checkpoint
/// completes, moves that checkpoint's records into a file of `target_dir`.
/// `encode(record, out)` appends one record's bytes (a line and its `\n`).
/// Other settings: [`WalSinkConfig`] with [`wal_files_with`].
pub fn wal_files<T, F>(
    wal_dir: impl Into<PathBuf>,
    target_dir: impl Into<PathBuf>,
    encode: F,
) -> impl FnMut(usize) -> WalSink<T, F, NoStamp<T>> + Send + 'static
where
    T: Send + 'static,
    F: Fn(&T, &mut Vec<u8>) + Clone + Send + 'static,
{
    wal_files_with(WalSinkConfig::new(wal_dir, target_dir), encode)
}

/// [`wal_files`] with every setting of a [`WalSinkConfig`].
pub fn wal_files_with<T, F>(
    config: WalSinkConfig,
    encode: F,
) -> impl FnMut(usize) -> WalSink<T, F, NoStamp<T>> + Send + 'static
where
    T: Send + 'static,
    F: Fn(&T, &mut Vec<u8>) + Clone + Send + 'static,
{
    move |subtask| WalSink::new(config.clone(), subtask, encode.clone(), no_stamp::<T> as NoStamp<T>)
}

/// Exactly-once files by two-phase commit: each subtask writes a
/// checkpoint's records into a temporary file of `target_dir`, flushes and
/// syncs it at the barrier (pre-commit) and renames it into place when the
/// checkpoint completes (commit). `encode` as for [`wal_files`].
pub fn two_phase_files<T, F>(
    target_dir: impl Into<PathBuf>,
    encode: F,
) -> impl FnMut(usize) -> TwoPhaseCommitSink<T, FileTransactions<T, F, NoStamp<T>>> + Send + 'static
where
    T: Send + 'static,
    F: Fn(&T, &mut Vec<u8>) + Clone + Send + 'static,
{
    let target_dir = target_dir.into();
    move |subtask| {
        TwoPhaseCommitSink::new(FileTransactions::new(
            target_dir.clone(),
            subtask,
            encode.clone(),
            no_stamp::<T> as NoStamp<T>,
        ))
    }
}

/// At-least-once files: each subtask appends its records to its own file in
/// `dir` as they arrive (on the sink's own thread), synced at each barrier;
/// after a failure, records since the last checkpoint are written again.
/// `encode` as for [`wal_files`].
pub fn direct_files<T, F>(
    dir: impl Into<PathBuf>,
    encode: F,
) -> impl FnMut(usize) -> DirectFileSink<T, F, NoStamp<T>> + Send + 'static
where
    T: Send + 'static,
    F: Fn(&T, &mut Vec<u8>) + Clone + Send + 'static,
{
    let dir = dir.into();
    move |subtask| DirectFileSink::new(dir.clone(), subtask, encode.clone(), no_stamp::<T> as NoStamp<T>)
}

/// Exactly-once into a Kafka topic: each subtask logs its records in
/// `wal_dir` and publishes each completed checkpoint's records in one Kafka
/// transaction; `read_committed` readers see each record once.
/// `encode(record, out)` writes a record with
/// [`crate::kafka::framing::encode`].
pub fn kafka_exactly_once<T, F>(
    kafka: KafkaSinkConfig,
    wal_dir: impl Into<PathBuf>,
    encode: F,
) -> impl FnMut(usize) -> KafkaExactlyOnceSink<T, F, NoStamp<T>> + Send + 'static
where
    T: Send + 'static,
    F: Fn(&T, &mut Vec<u8>) + Clone + Send + 'static,
{
    let kafka = Arc::new(kafka);
    let wal = WalSinkConfig::log_only(wal_dir);
    move |subtask| {
        crate::kafka::exactly_once(
            kafka.clone(),
            wal.clone(),
            subtask,
            encode.clone(),
            no_stamp::<T> as NoStamp<T>,
        )
    }
}

/// At-least-once into a Kafka topic (idempotent producer): each subtask
/// produces its records as they arrive; a barrier waits for the broker's
/// acknowledgement of every record before it. `encode` as for
/// [`kafka_exactly_once`].
pub fn kafka_at_least_once<T, F>(
    kafka: KafkaSinkConfig,
    encode: F,
) -> impl FnMut(usize) -> KafkaAtLeastOnceSink<T, F, NoStamp<T>> + Send + 'static
where
    T: Send + 'static,
    F: Fn(&T, &mut Vec<u8>) + Clone + Send + 'static,
{
    let kafka = Arc::new(kafka);
    move |subtask| crate::kafka::at_least_once(kafka.clone(), subtask, encode.clone(), no_stamp::<T> as NoStamp<T>)
}
