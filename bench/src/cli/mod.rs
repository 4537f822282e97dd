//! What every `weir` command shares: the error type (and its exit
//! status), the checkpoint mode argument, `--metrics-addr`.
//!
//! The production commands ([`crate::cmd`]) and the lab
//! (`lab/`) both build on this module; it depends on neither.

pub mod metrics_arg;

use weir_core::CheckpointMode;

/// Checkpoint mode of a job (`--mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// No checkpoints (at-most-once).
    None,
    /// At-least-once barriers (no alignment).
    AtLeastOnce,
    /// Aligned barriers (exactly-once).
    Aligned,
    /// Unaligned barriers (exactly-once, in-flight records stored).
    Unaligned,
    /// Exactly-once by deduplication: no alignment, replays dropped per
    /// input channel, a failed subtask recovers alone.
    Dedup,
}

impl Mode {
    /// The name in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Mode::None => "none",
            Mode::AtLeastOnce => "at-least-once",
            Mode::Aligned => "aligned",
            Mode::Unaligned => "unaligned",
            Mode::Dedup => "dedup",
        }
    }

    /// Whether the mode's output is exactly-once (aligned, unaligned,
    /// dedup).
    pub fn exactly_once(self) -> bool {
        matches!(self, Mode::Aligned | Mode::Unaligned | Mode::Dedup)
    }

    /// The engine's mode, if checkpointing is on.
    pub fn checkpoint_mode(self) -> Option<CheckpointMode> {
        match self {
            Mode::None => None,
            Mode::AtLeastOnce => Some(CheckpointMode::AtLeastOnce),
            Mode::Aligned => Some(CheckpointMode::Aligned),
            Mode::Unaligned => Some(CheckpointMode::Unaligned),
            Mode::Dedup => Some(CheckpointMode::Dedup),
        }
    }
}

/// Errors of the `weir` command.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A bad argument.
    #[error("{0}")]
    Usage(String),
    /// The engine failed.
    #[error(transparent)]
    Engine(#[from] weir_core::Error),
    /// The command delivered a wrong result (the engine lost or
    /// duplicated records), or found damaged data.
    #[error("wrong result: {0}")]
    Wrong(String),
    /// A file of weir-io's (shard folders, sinks' files) cannot be read,
    /// written, or verified.
    #[error(transparent)]
    Storage(weir_io::Error),
    /// Reading or writing a file failed.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
}

/// weir-io's errors: a layout error of a job's shard folders is the
/// user's to fix (the arguments name the wrong folders or settings); any
/// other is a failure.
impl From<weir_io::Error> for CliError {
    fn from(e: weir_io::Error) -> Self {
        match e {
            weir_io::Error::Shards { reason } => CliError::Usage(reason),
            e => CliError::Storage(e),
        }
    }
}

impl CliError {
    /// The process's exit status for this error: 2 for a usage error, 1
    /// for any other.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Usage(_) => 2,
            _ => 1,
        }
    }
}
