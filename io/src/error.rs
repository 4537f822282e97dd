//! The one error type of `weir-io`.

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
}
