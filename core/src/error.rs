//! The one error type of `weir-core`.
//!
//! Every message says what failed, where (operator, subtask, setting) and,
//! where it helps, what the user can do about it.

/// An error raised by user code (a source, sink or operator function).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Result alias used throughout `weir-core`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while building or running a job.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting of the pipeline or the runtime is out of range.
    #[error("invalid configuration: {setting} = {value}: {reason}")]
    InvalidConfig {
        /// The name of the setting, as in the builder method.
        setting: &'static str,
        /// The offending value, formatted.
        value: String,
        /// Why it is refused and what is accepted instead.
        reason: &'static str,
    },

    /// The dataflow graph cannot run as built.
    #[error("invalid pipeline: {0}")]
    InvalidPipeline(String),

    /// An operator returned an error or panicked; the job was stopped.
    #[error("operator '{operator}' (subtask {subtask}/{parallelism}) failed: {message}")]
    OperatorFailed {
        /// The name given to the operator in the pipeline.
        operator: String,
        /// Index of the failing parallel instance.
        subtask: usize,
        /// Parallelism of the operator.
        parallelism: usize,
        /// The error or panic message.
        message: String,
    },

    /// Checkpointing failed in a way that stops the job (too many
    /// consecutive failed checkpoints, or the final one failed).
    #[error("checkpointing failed: {0}")]
    Checkpoint(String),

    /// A checkpoint cannot be restored: missing or corrupt files (the
    /// message names the checkpoint, the file and the position), another
    /// job's checkpoint, or an incompatible change of the job.
    #[error("cannot restore: {0}")]
    Restore(String),

    /// A worker thread could not be started.
    #[error("could not start worker thread {worker}: {source}")]
    Spawn {
        /// Index of the worker.
        worker: usize,
        /// The operating system's error.
        source: std::io::Error,
    },

    /// One of weir's other threads (the job thread, the snapshot pool)
    /// could not be started.
    #[error("could not start weir's {what}: {source}")]
    SpawnHelper {
        /// Which thread or pool.
        what: &'static str,
        /// The operating system's error.
        source: std::io::Error,
    },

    /// The metrics endpoint ([`crate::RuntimeConfig::metrics_addr`]) could
    /// not listen on its address.
    #[error(
        "could not serve metrics on {addr}: {source}; choose a free port (or port 0 for any) in \
         RuntimeConfig::metrics_addr / --metrics-addr"
    )]
    Metrics {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// The operating system's error.
        source: std::io::Error,
    },

    /// The state backend failed to read or write its files, or was used
    /// inconsistently (for example restored from handles of another layout).
    #[error("state: {context}: {message}")]
    State {
        /// What the backend was doing, with the file involved.
        context: String,
        /// The cause (an operating-system error or the broken rule).
        message: String,
    },

    /// A state checkpoint file failed verification on restore: the data is
    /// refused, never restored silently.
    #[error(
        "corrupt state in checkpoint {checkpoint}: file {file}, {}: expected CRC {expected:#010x}, actual {actual:#010x} ({what})",
        page.map_or_else(|| "file header/trailer".to_string(), |p| format!("page {p}"))
    )]
    Corrupt {
        /// The checkpoint whose handle listed the file.
        checkpoint: u64,
        /// The file, relative to the checkpoint root.
        file: String,
        /// The page record (0-based, in file order) that failed; `None` for
        /// the file header, the trailer or a whole-file check.
        page: Option<u64>,
        /// The checksum the data should have.
        expected: u32,
        /// The checksum the data has.
        actual: u32,
        /// What was checked (page, header, trailer, size).
        what: String,
    },
}

impl Error {
    pub(crate) fn config(setting: &'static str, value: impl std::fmt::Display, reason: &'static str) -> Self {
        Error::InvalidConfig {
            setting,
            value: value.to_string(),
            reason,
        }
    }
}
