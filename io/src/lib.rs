//! # weir-io
//!
//! Sources, sinks and file formats for weir. Everything here is built on
//! the [`weir_core::Source`] and [`weir_core::Sink`] traits; nothing in
//! `weir-core` depends on this crate. `docs/guide/guarantees.md` explains which
//! combination gives which guarantee.
//!
//! ## Sources
//!
//! | source | replayable | offset |
//! |---|---|---|
//! | [`Generator`] ([`generator`]) | yes | sequence number |
//! | [`FileSource`] ([`files`]): lines of a file or a folder | yes | (file, byte position, line) |
//! | [`ReaderSource`] ([`reader`]): lines of stdin, a pipe, a socket | **no** | none |
//! | [`NexmarkSource`] ([`nexmark`]): Nexmark auction events | yes | next local event index |
//! | [`KafkaSource`] ([`kafka`]): records of a Kafka topic, `read_committed` | yes | next offset per partition |
//!
//! Line sources hand each line to a user parse function with its
//! [`LineInfo`]; a line it rejects stops the job with the file and line
//! number, or is skipped into a rejected-records file ([`BadRecords`]).
//!
//! ## Sinks
//!
//! | sink | guarantee | output visible |
//! |---|---|---|
//! | [`WalSink`] ([`wal`]): write-ahead log, then files | exactly-once | at checkpoint completion |
//! | [`TwoPhaseCommitSink`] + [`FileTransactions`] | exactly-once | at checkpoint completion |
//! | [`TwoPhaseCommitSink`] + [`SqliteTransactions`] | exactly-once | at checkpoint completion |
//! | [`SqliteUpsertSink`] ([`upsert`]): upsert by key | effectively once (idempotent) | at once |
//! | [`DirectFileSink`] ([`direct`]) | at-least-once | at once |
//!
//! Every sink records the **visibility latency**, from a record's emission
//! to the moment a reader of the target can see it, through
//! [`weir_core::SinkContext::record_visible_latency`], and the processing
//! latency, to the record's arrival at the sink, through
//! [`weir_core::SinkContext::record_latency`]; each takes a function giving
//! a record's emission time (0 for unknown). Transactional sinks record
//! visibility at commit ([`latency`] explains how, without a context in
//! `commit`).
//!
//! Sink constructors are infallible and touch nothing on disk; the first
//! call of the sink (a restore, or a write, barrier or finish) creates
//! folders and opens files, so they can be called in a pipeline's sink
//! factory:
//!
//! ```no_run
//! # use weir_io::{WalSink, WalSinkConfig};
//! # let p = weir_core::Pipeline::new("doc");
//! # let stream = p.source("numbers", 1, |i, n| {
//! #     weir_core::VecSource::new(std::sync::Arc::new(vec![1u64, 2, 3]), i, n)
//! # });
//! let config = WalSinkConfig::new("/tmp/wal", "/tmp/out");
//! let line = |r: &u64, out: &mut Vec<u8>| out.extend_from_slice(format!("{r}\n").as_bytes());
//! stream.sink("wal", move |i| WalSink::new(config.clone(), i, line, |_: &u64| 0));
//! ```
//!
//! ## Crash testing
//!
//! Every durable step of every sink, and of the shard folders of a job
//! shared by several processes ([`shards`]), passes a named fault point
//! ([`weir_core::fault`]); [`FAULT_POINTS`] lists them all.

#![deny(missing_docs)]

pub mod direct;
pub mod durable;
mod error;
pub mod files;
mod fsutil;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod generator;
mod handover;
pub mod kafka;
pub mod latency;
pub mod lines;
pub mod nexmark;
pub mod reader;
pub mod shards;
pub mod sinks;
mod sql;
pub mod text;
pub mod twophase;
pub mod upsert;
pub mod wal;

pub use direct::DirectFileSink;
pub use error::{Error, Result};
pub use files::FileSource;
pub use generator::{GenContext, Generator, GeneratorConfig};
pub use kafka::{KafkaRecordInfo, KafkaSource, KafkaSourceConfig, StartFrom};
pub use lines::{BadRecords, LineInfo, ParseError};
pub use nexmark::NexmarkSource;
/// The Kafka client the Kafka source uses (librdkafka, bundled): for
/// client settings, and for tests and tools that create topics or produce.
pub use rdkafka;
pub use reader::ReaderSource;
/// The SQLite bindings the SQLite sinks use (bundled SQLite): values for
/// [`SqlRow::push`] implement [`rusqlite::ToSql`], and tests read tables
/// with [`rusqlite::Connection`].
pub use rusqlite;
pub use sql::{SqlRow, SqliteTable, BUSY_TIMEOUT};
pub use twophase::file::{committed_files, FileTransactions, FileTxn, IN_PROGRESS_DIR};
pub use twophase::{SqliteTransactions, SqliteTxn, TwoPhaseCommit, TwoPhaseCommitSink};
pub use upsert::SqliteUpsertSink;
pub use wal::{WalRecovery, WalSink, WalSinkConfig};

/// Every named fault point in this crate (the sinks' and the shard
/// files'), for crash tests that arm them one by one.
pub const FAULT_POINTS: &[&[&str]] = &[
    wal::FAULT_POINTS,
    twophase::FILE_FAULT_POINTS,
    twophase::SQLITE_FAULT_POINTS,
    upsert::UPSERT_FAULT_POINTS,
    direct::DIRECT_FAULT_POINTS,
    shards::SHARD_FAULT_POINTS,
    durable::DURABLE_FAULT_POINTS,
];

/// A two-phase-commit sink into files: [`TwoPhaseCommitSink`] over
/// [`FileTransactions`].
pub type TwoPhaseFileSink<T, F, E> = TwoPhaseCommitSink<T, FileTransactions<T, F, E>>;

/// A two-phase-commit sink into SQLite: [`TwoPhaseCommitSink`] over
/// [`SqliteTransactions`].
pub type TwoPhaseSqliteSink<T, B, E> = TwoPhaseCommitSink<T, SqliteTransactions<T, B, E>>;

/// A two-phase-commit file sink for `subtask` into folder `target`:
/// `TwoPhaseCommitSink::new(FileTransactions::new(target, subtask, encode, emitted_ns))`.
pub fn two_phase_file_sink<T, F, E>(
    target: impl Into<std::path::PathBuf>,
    subtask: usize,
    encode: F,
    emitted_ns: E,
) -> TwoPhaseFileSink<T, F, E>
where
    T: Send + 'static,
    F: Fn(&T, &mut Vec<u8>) + Send + 'static,
    E: Fn(&T) -> u64 + Send + 'static,
{
    TwoPhaseCommitSink::new(FileTransactions::new(target, subtask, encode, emitted_ns))
}

/// A two-phase-commit SQLite sink for `subtask` into `table`:
/// `TwoPhaseCommitSink::new(SqliteTransactions::new(table, subtask, bind, emitted_ns))`
/// with [`twophase::SQLITE_MAX_BUFFERED_RECORDS`] as its buffer bound.
pub fn two_phase_sqlite_sink<T, B, E>(
    table: SqliteTable,
    subtask: usize,
    bind: B,
    emitted_ns: E,
) -> TwoPhaseSqliteSink<T, B, E>
where
    T: Send + 'static,
    B: Fn(&T, &mut SqlRow<'_, '_>) + Send + 'static,
    E: Fn(&T) -> u64 + Send + 'static,
{
    TwoPhaseCommitSink::new(SqliteTransactions::new(table, subtask, bind, emitted_ns))
        .max_buffered_records(twophase::SQLITE_MAX_BUFFERED_RECORDS)
}
