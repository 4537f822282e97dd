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

    /// A worker thread could not be started.
    #[error("could not start worker thread {worker}: {source}")]
    Spawn {
        /// Index of the worker.
        worker: usize,
        /// The operating system's error.
        source: std::io::Error,
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
