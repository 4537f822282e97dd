//! Keyed state in memory-mapped pages, snapshotted asynchronously and
//! incrementally with CRC32 checksums.
//!
//! # Guarantees
//!
//! - **State lives in mapped files.** Every store keeps its keys and values
//!   in fixed-size slots of fixed-size pages of files in its private working
//!   directory, mapped with `memmap2`; the operating system pages them, so
//!   state may exceed memory. Value state keeps one open-addressing hash
//!   table per key group in the pages themselves (nothing to rebuild on
//!   restore); map and list state keep an in-memory index from key to slot.
//! - **Hot path without allocation, lock or system call.** Updating an
//!   existing key is a hash, a probe of its home slots in the mapped page,
//!   two compares, and a store into the page.
//! - **Cheap barrier.** [`ValueStore::snapshot`] (and the map and list
//!   equivalents) costs O(1): it closes the lists of pages and slots
//!   changed since the last snapshot and bumps an epoch. The returned [`SnapshotJob`] does the
//!   rest on any thread while the task keeps writing; copy-on-write of a
//!   page the job has not captured yet keeps the snapshot exactly at the
//!   barrier.
//! - **Incremental.** A snapshot writes only the slots changed since the
//!   last *completed* one (whole pages when most of a page changed), into
//!   one new immutable file; its [`StateHandle`] lists that file after the
//!   files it builds on. After [`StoreOptions::max_delta_chain`]
//!   increments the next snapshot is full, bounding what a restore reads.
//! - **Durable and verified.** Files are written to a temp name, fsynced,
//!   renamed and the directory fsynced. Every page record carries a CRC32,
//!   the file a trailer CRC, and the handle the whole-file CRC; restore
//!   checks all of them before using a byte and reports a mismatch as
//!   [`Error::Corrupt`](crate::Error::Corrupt), naming checkpoint, file,
//!   page, expected and actual CRC.
//! - **Rescalable.** A page belongs to one key group; restore takes the
//!   handles of any parallelism and keeps the pages of the key groups it
//!   owns.
//!
//! # The states
//!
//! - [`ValueStore`]: per key, one plain value (`bytemuck::Pod`) inline.
//! - [`MapStore`]: per key, a map from user key to a value encoded by a
//!   [`Codec`].
//! - [`ListStore`]: per key, an append-only list of encoded values.
//!
//! `docs/design/state.md` describes the page layout, the snapshot protocol
//! and the file format in full, with measured figures.

pub(crate) mod arena;
mod codec;
pub(crate) mod format;
mod handle;
pub(crate) mod key_groups;
mod list;
mod map;
mod options;
mod pack;
mod restore;
mod slot_cache;
mod snapshot;
mod user_map;
mod value;

#[cfg(test)]
mod tests;

pub use codec::{Codec, PodCodec, PodKey, SerdeCodec, StateKey, StateValue, MAX_KEY_BYTES};
pub use handle::{SlotLayout, StateFile, StateHandle, StateKind};
pub use list::ListStore;
pub use map::MapStore;
pub use options::{
    StateBackend, StoreOptions, DEFAULT_MAX_DELTA_CHAIN, DEFAULT_MAX_VALUE_LEN, DEFAULT_PAGE_SIZE, MAX_DELTA_CHAIN,
    MAX_PAGE_SIZE, MAX_VALUE_LEN, MIN_PAGE_SIZE,
};
pub use snapshot::SnapshotJob;
pub use value::ValueStore;

/// Removes the temp files (`shared/*.tmp`) that writes interrupted by a
/// crash left under `checkpoint_root`; no handle ever references them.
/// Call it at startup, before any snapshot is being written. Returns how
/// many were removed.
pub fn remove_temp_files(checkpoint_root: &std::path::Path) -> crate::Result<usize> {
    let dir = checkpoint_root.join("shared");
    let names = match crate::storage::vfs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => {
            return Err(crate::Error::State {
                context: format!("listing {}", dir.display()),
                message: e.to_string(),
            })
        }
    };
    let mut removed = 0;
    for name in names {
        if name.ends_with(".tmp") && crate::storage::vfs::remove_file(dir.join(&name)).is_ok() {
            removed += 1;
        }
    }
    Ok(removed)
}
