//! Durable file-system steps shared by the file sinks, and the names of
//! committed output files.
//!
//! A step is durable once its data and the directory entry naming it have
//! both been fsynced: write a file, fsync it, rename it into place, fsync the
//! folder. Every helper here passes through a named fault point first
//! ([`weir_core::fault::hit`]), so that tests can fail exactly that step.
//!
//! Committed output files are named `part-<subtask>-<epoch><suffix>`, with
//! the subtask zero-padded to 3 digits and the epoch to 9, so that names
//! sort in epoch order; a name never depends on timing, which is what makes
//! a repeated commit land on the same file.

use std::path::Path;

use weir_core::vfs;

use crate::error::IoContext;
use crate::{Error, Result};

/// Passes fault point `name`, reporting an injected fault as an I/O error
/// of step `op` on `path`.
#[inline]
pub(crate) fn fault(name: &str, op: &str, path: &Path) -> Result<()> {
    weir_core::fault::hit(name).ctx(op, path)
}

/// Fsyncs a folder, so that the entries created, renamed or removed in it
/// survive a crash.
pub(crate) fn sync_dir(dir: &Path, fault_point: &str) -> Result<()> {
    fault(fault_point, "fsync folder", dir)?;
    weir_core::disk::sync_dir(dir).ctx("fsync folder", dir)
}

/// Creates `dir` and its missing parents durably (each created folder's
/// entry fsynced in its parent, see `weir_core::disk::create_dir_all_durable`).
pub(crate) fn create_dir_durable(dir: &Path) -> Result<()> {
    weir_core::disk::create_dir_all_durable(dir).ctx("create folder", dir)
}

/// Removes a file; a file already gone is not an error. Returns whether it
/// existed.
pub(crate) fn remove_if_exists(path: &Path) -> Result<bool> {
    match vfs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::io("remove", path, e)),
    }
}

/// The names in `dir` (files and folders), sorted; an absent folder has none.
pub(crate) fn list_names(dir: &Path) -> Result<Vec<String>> {
    match vfs::read_dir(dir) {
        Ok(names) => Ok(names),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(Error::io("list folder", dir, e)),
    }
}

/// Name of the committed output file of `subtask` for `epoch`.
pub(crate) fn part_name(subtask: usize, epoch: u64, suffix: &str) -> String {
    format!("part-{subtask:03}-{epoch:09}{suffix}")
}

/// The `(subtask, epoch)` of a name made by [`part_name`], ignoring any
/// leading `.` and trailing `.tmp`.
pub(crate) fn parse_part_name(name: &str, suffix: &str) -> Option<(usize, u64)> {
    let name = name.strip_prefix('.').unwrap_or(name);
    let name = name.strip_suffix(".tmp").unwrap_or(name);
    let rest = name.strip_prefix("part-")?.strip_suffix(suffix)?;
    let (s, e) = rest.split_once('-')?;
    if s.is_empty() || e.is_empty() || !s.bytes().chain(e.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((s.parse().ok()?, e.parse().ok()?))
}

/// The newest epoch of `subtask`'s visible output in `target`: the
/// largest epoch among the names [`part_name`] made for it, hidden
/// temporaries (a leading `.`) left out; `None` if there is none.
pub(crate) fn newest_visible_part(target: &Path, suffix: &str, subtask: usize) -> Result<Option<u64>> {
    Ok(list_names(target)?
        .iter()
        .filter(|n| !n.starts_with('.'))
        .filter_map(|n| parse_part_name(n, suffix))
        .filter(|&(s, _)| s == subtask)
        .map(|(_, e)| e)
        .max())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_names_sort_by_epoch_and_parse_back() {
        let a = part_name(2, 9, ".csv");
        let b = part_name(2, 10, ".csv");
        assert_eq!(a, "part-002-000000009.csv");
        assert!(a < b);
        assert_eq!(parse_part_name(&b, ".csv"), Some((2, 10)));
        assert_eq!(parse_part_name(&format!(".{b}.tmp"), ".csv"), Some((2, 10)));
        assert_eq!(parse_part_name("part-2-x.csv", ".csv"), None);
        assert_eq!(parse_part_name("part-002-000000009.txt", ".csv"), None);
        assert_eq!(parse_part_name("other", ".csv"), None);
    }
}

/// Test support: a simulated disk (`weir_core::vfs::sim`) mounted for a
/// test's life, for the crash tests of durable writes.
#[cfg(test)]
pub(crate) mod sim {
    use std::path::PathBuf;
    use std::sync::Arc;

    use weir_core::vfs::{self, sim::Faults, sim::SimFs};

    /// A simulated disk mounted at `.0`, unmounted when dropped; `.1`
    /// crashes it and counts its operations.
    pub(crate) struct Mounted(pub(crate) PathBuf, pub(crate) SimFs);

    impl Mounted {
        /// Mounts a fresh simulated disk at `root`, its choices seeded by `seed`.
        pub(crate) fn new(root: PathBuf, seed: u64) -> Mounted {
            let fs = SimFs::new(&root, seed, Faults::default());
            vfs::mount(&root, Arc::new(fs.clone()));
            Mounted(root, fs)
        }
    }

    impl Drop for Mounted {
        fn drop(&mut self) {
            vfs::unmount(&self.0);
        }
    }
}
