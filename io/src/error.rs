//! The one error type of `weir-io`.
//!
//! Every message names what failed and where: the file (and byte offset or
//! line number), the sink subtask and the checkpoint epoch, so that an
//! operator can find the bad byte or the bad line without a debugger.

use std::path::{Path, PathBuf};

/// Result alias of `weir-io`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in a source or sink of `weir-io`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting is out of range.
    #[error("invalid configuration: {setting} = {value}: {reason}")]
    InvalidConfig {
        /// The setting's name.
        setting: &'static str,
        /// The offending value.
        value: String,
        /// What is accepted.
        reason: &'static str,
    },
    /// A stored offset cannot be understood by the source it is given to.
    #[error("bad source offset for {source_name}: {reason}")]
    BadOffset {
        /// Which source.
        source_name: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// An operating-system call on a file or folder failed.
    #[error("cannot {op} {}: {source}", path.display())]
    Io {
        /// What was being done ("open", "fsync", "rename ... to", ...).
        op: String,
        /// The file or folder.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// An input line could not be parsed (and bad records are not skipped).
    #[error("{file}, line {line}: {reason} (line text: {text:?})")]
    Malformed {
        /// The input file (or stream name).
        file: String,
        /// 1-based line number.
        line: u64,
        /// What the parse function reported.
        reason: String,
        /// The start of the line, lossily decoded, at most
        /// [`crate::lines::MAX_QUOTED_TEXT`] bytes.
        text: String,
    },
    /// An input line is longer than the reader accepts.
    #[error("{file}, line {line}: line longer than {limit} bytes")]
    LineTooLong {
        /// The input file (or stream name).
        file: String,
        /// 1-based line number.
        line: u64,
        /// The bound, [`crate::lines::MAX_LINE_BYTES`].
        limit: usize,
    },
    /// Stored data (a WAL segment, a commit marker, a checkpoint state)
    /// failed verification. The data is refused, never used silently.
    #[error("corrupt {what} in {}, at byte {offset}: {reason}", file.display())]
    Corrupt {
        /// What kind of data ("WAL record", "WAL segment header", "commit marker", ...).
        what: &'static str,
        /// The file.
        file: PathBuf,
        /// Byte offset of the bad data in the file.
        offset: u64,
        /// What does not match.
        reason: String,
    },
    /// The state a sink stored in a checkpoint cannot be used.
    #[error("{sink}: bad state in checkpoint {checkpoint}: {reason}")]
    BadState {
        /// The sink (kind and subtask, where known).
        sink: String,
        /// The checkpoint being restored.
        checkpoint: u64,
        /// What is wrong.
        reason: String,
    },
    /// The target already holds output this run would write again: a job
    /// started without a checkpoint (or from an older one) into a target
    /// that a later checkpoint committed to. Writing on would duplicate or
    /// overwrite committed output, so the sink refuses.
    #[error(
        "sink '{sink}' subtask {subtask}: {target} already holds output committed through epoch {committed}, \
         but the job {}; restore from the latest checkpoint, or use an empty target",
        restored.map_or_else(|| "starts without a checkpoint".to_string(), |r| format!("restores checkpoint {r}"))
    )]
    TargetAhead {
        /// The kind of sink.
        sink: &'static str,
        /// The sink subtask.
        subtask: usize,
        /// The target (folder, database).
        target: String,
        /// The last epoch committed there.
        committed: u64,
        /// The checkpoint being restored, `None` for a fresh start.
        restored: Option<u64>,
    },
    /// A pre-committed transaction was to be committed, but neither its
    /// temporary file nor its committed file exists: its output is lost.
    #[error("sink '{sink}': transaction of epoch {epoch} is lost: neither {} nor {} exists", temp.display(), target.display())]
    LostTransaction {
        /// The kind of sink.
        sink: &'static str,
        /// The transaction's epoch.
        epoch: u64,
        /// Where the pre-committed data should be.
        temp: PathBuf,
        /// Where the committed data should be.
        target: PathBuf,
    },
    /// A record is larger than a sink accepts.
    #[error("sink '{sink}' subtask {subtask}: a record of {len} bytes exceeds the limit of {limit} bytes")]
    RecordTooLarge {
        /// The kind of sink.
        sink: &'static str,
        /// The sink subtask.
        subtask: usize,
        /// The encoded record's length.
        len: usize,
        /// The bound.
        limit: usize,
    },
    /// A call of the Kafka client failed.
    #[error("Kafka topic '{topic}' at {brokers}: {context}: {source}")]
    Kafka {
        /// The bootstrap servers.
        brokers: String,
        /// The topic.
        topic: String,
        /// What was being done (and on which partition, where it applies).
        context: String,
        /// The client's error (boxed: it is large, and errors are rare).
        source: Box<rdkafka::error::KafkaError>,
    },
    /// A Kafka topic, partition or stored position cannot be used as asked.
    #[error("Kafka topic '{topic}' at {brokers}: {reason}")]
    KafkaTopic {
        /// The bootstrap servers.
        brokers: String,
        /// The topic.
        topic: String,
        /// What is wrong, and what the user can do.
        reason: String,
    },
    /// A Kafka record's value could not be parsed (and bad records are not
    /// skipped).
    #[error(
        "Kafka topic '{topic}', partition {partition}, offset {offset}: {reason} (value: {text:?}); \
         fix the producer, or skip bad records (KafkaSourceConfig::skip_bad_records)"
    )]
    KafkaMalformed {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The record's offset in the partition.
        offset: i64,
        /// What the parse function reported.
        reason: String,
        /// The start of the value, lossily decoded, at most
        /// [`crate::lines::MAX_QUOTED_TEXT`] bytes.
        text: String,
    },
    /// The process folders of a job shared by several processes
    /// ([`crate::shards`]) do not fit together, or not with the settings
    /// given: another job's folder, more processes than shards, a shard in
    /// no folder or at one generation in two.
    #[error("{reason}")]
    Shards {
        /// What does not fit, and what the user can do.
        reason: String,
    },
    /// A SQLite call failed.
    #[error("SQLite {}: {context}: {source}", db.display())]
    Sqlite {
        /// The database file.
        db: PathBuf,
        /// What was being done, with the epoch where it applies.
        context: String,
        /// SQLite's error.
        source: rusqlite::Error,
    },
}

impl Error {
    /// An [`Error::Io`] for `op` on `path`.
    pub(crate) fn io(op: impl Into<String>, path: &Path, source: std::io::Error) -> Self {
        Error::Io {
            op: op.into(),
            path: path.to_path_buf(),
            source,
        }
    }

    /// An [`Error::Corrupt`].
    pub(crate) fn corrupt(what: &'static str, file: &Path, offset: u64, reason: impl Into<String>) -> Self {
        Error::Corrupt {
            what,
            file: file.to_path_buf(),
            offset,
            reason: reason.into(),
        }
    }
}

/// Adds the file to an I/O result: `file.sync_data().ctx("fsync", path)?`.
pub(crate) trait IoContext<T> {
    /// Maps the error to [`Error::Io`] naming `op` and `path`.
    fn ctx(self, op: &str, path: &Path) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn ctx(self, op: &str, path: &Path) -> Result<T> {
        self.map_err(|e| Error::io(op, path, e))
    }
}
