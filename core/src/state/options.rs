//! The settings of one store, with their bounds and the reasons for them.

use std::ops::Range;
use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::state::key_groups::DEFAULT_MAX_PARALLELISM;

/// Default page size: 4 KiB, the operating system's page.
///
/// A page is the unit of copy-on-write, of the per-page checksum and of
/// key-group ownership. Small pages make a copy-on-write copy cheap (one
/// 4 KiB `memcpy` when the task writes a page the snapshot has not captured
/// yet) and localise a checksum failure; larger pages cut per-page metadata.
/// Incremental size does not depend on it: a delta carries changed slots,
/// not changed pages.
pub const DEFAULT_PAGE_SIZE: usize = 4096;

/// Smallest accepted page size (the operating system's page).
pub const MIN_PAGE_SIZE: usize = 4096;

/// Largest accepted page size: one page must fit a mapped segment.
pub const MAX_PAGE_SIZE: usize = crate::state::arena::SEGMENT_BYTES;

/// Default bound on incremental snapshots stacked on one full snapshot.
///
/// A restore reads the full base file and then every delta in order, so the
/// chain length bounds restore time; each delta of a checkpoint with 1% of
/// keys changed is ~1-2% of a full one, so with 8 deltas a restore reads at
/// most ~1.2x the state while seven of every eight checkpoints stay small.
pub const DEFAULT_MAX_DELTA_CHAIN: usize = 8;

/// Upper bound on [`StoreOptions::max_delta_chain`].
pub const MAX_DELTA_CHAIN: usize = 1024;

/// Default room for one encoded value of map and list state, in bytes.
pub const DEFAULT_MAX_VALUE_LEN: usize = 64;

/// Upper bound on [`StoreOptions::max_value_len`]: a slot must fit a page.
pub const MAX_VALUE_LEN: usize = 1 << 20;

/// The settings of one state store (one state of one keyed subtask).
///
/// ```
/// use weir_core::state::StoreOptions;
/// let opts = StoreOptions::new("/tmp/weir-doc/subtask-0").with_key_groups(0..64);
/// assert_eq!(opts.max_parallelism, 128);
/// assert_eq!(opts.page_size, 4096);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreOptions {
    /// The number of key groups of the job (its maximum parallelism).
    pub max_parallelism: usize,
    /// The key groups this subtask owns, within `0..max_parallelism`.
    pub key_groups: Range<usize>,
    /// Page size in bytes: a power of two in
    /// [`MIN_PAGE_SIZE`]`..=`[`MAX_PAGE_SIZE`]; see [`DEFAULT_PAGE_SIZE`].
    pub page_size: usize,
    /// Where this store's mapped files live; private to one subtask. The
    /// files are scratch: the durable copy is the checkpoint.
    pub working_dir: PathBuf,
    /// How many incremental snapshots may stack on a full one before the
    /// next snapshot is full again; see [`DEFAULT_MAX_DELTA_CHAIN`].
    /// 0 makes every snapshot full.
    pub max_delta_chain: usize,
    /// Room for one encoded value in map and list state, in bytes; a longer
    /// value is refused with an error. Unused by value state.
    pub max_value_len: usize,
}

impl StoreOptions {
    /// Options with the defaults: all [`DEFAULT_MAX_PARALLELISM`] key
    /// groups, [`DEFAULT_PAGE_SIZE`], [`DEFAULT_MAX_DELTA_CHAIN`] and
    /// [`DEFAULT_MAX_VALUE_LEN`].
    pub fn new(working_dir: impl Into<PathBuf>) -> Self {
        StoreOptions {
            max_parallelism: DEFAULT_MAX_PARALLELISM,
            key_groups: 0..DEFAULT_MAX_PARALLELISM,
            page_size: DEFAULT_PAGE_SIZE,
            working_dir: working_dir.into(),
            max_delta_chain: DEFAULT_MAX_DELTA_CHAIN,
            max_value_len: DEFAULT_MAX_VALUE_LEN,
        }
    }

    /// Sets the key groups this store owns.
    pub fn with_key_groups(mut self, key_groups: Range<usize>) -> Self {
        self.key_groups = key_groups;
        self
    }

    /// Sets the maximum parallelism (number of key groups).
    pub fn with_max_parallelism(mut self, max_parallelism: usize) -> Self {
        self.max_parallelism = max_parallelism;
        self
    }

    /// Sets the page size.
    pub fn with_page_size(mut self, page_size: usize) -> Self {
        self.page_size = page_size;
        self
    }

    /// Sets the bound on the incremental chain.
    pub fn with_max_delta_chain(mut self, max_delta_chain: usize) -> Self {
        self.max_delta_chain = max_delta_chain;
        self
    }

    /// Sets the room for one encoded map or list value.
    pub fn with_max_value_len(mut self, max_value_len: usize) -> Self {
        self.max_value_len = max_value_len;
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.max_parallelism == 0 || self.max_parallelism > u32::MAX as usize {
            return Err(Error::config(
                "max_parallelism",
                self.max_parallelism,
                "must be in 1..2^32",
            ));
        }
        let kg = &self.key_groups;
        if kg.start >= kg.end || kg.end > self.max_parallelism {
            return Err(Error::config(
                "key_groups",
                format!("{kg:?}"),
                "must be a non-empty range within 0..max_parallelism",
            ));
        }
        if !self.page_size.is_power_of_two() || !(MIN_PAGE_SIZE..=MAX_PAGE_SIZE).contains(&self.page_size) {
            return Err(Error::config(
                "page_size",
                self.page_size,
                "must be a power of two from 4096 to the segment size (16 MiB)",
            ));
        }
        if self.max_delta_chain > MAX_DELTA_CHAIN {
            return Err(Error::config(
                "max_delta_chain",
                self.max_delta_chain,
                "must be at most 1024",
            ));
        }
        if self.max_value_len == 0 || self.max_value_len > MAX_VALUE_LEN {
            return Err(Error::config(
                "max_value_len",
                self.max_value_len,
                "must be in 1..=1 MiB",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_options_are_refused() {
        let ok = StoreOptions::new("/tmp/x");
        assert!(ok.validate().is_ok());
        assert!(ok.clone().with_key_groups(5..5).validate().is_err());
        assert!(ok.clone().with_key_groups(0..129).validate().is_err());
        assert!(ok.clone().with_page_size(1000).validate().is_err());
        assert!(ok.clone().with_page_size(2048).validate().is_err());
        assert!(ok.clone().with_max_parallelism(0).validate().is_err());
        assert!(ok.clone().with_max_value_len(0).validate().is_err());
        assert!(ok.with_max_delta_chain(MAX_DELTA_CHAIN + 1).validate().is_err());
    }
}

/// Where [`crate::KeyedStream::process`] keeps its per-key state; chosen per
/// job by [`crate::RuntimeConfig::state_backend`], so one pipeline runs on
/// either without a change to its code.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StateBackend {
    /// Memory-mapped pages ([`crate::state::ValueStore`]): state may exceed
    /// memory (with a disk [`crate::RuntimeConfig::state_dir`]), and each
    /// checkpoint writes only the pages that changed, asynchronously.
    #[default]
    Mapped,
    /// A hash map on the heap: bounded by memory, and each checkpoint
    /// encodes all of it at the barrier. Cheaper per record when the state
    /// is small and checkpoints are rare.
    Heap,
}
