//! Damaged bytes weir found on disk and went on without.
//!
//! Every byte weir reads back is checked (CRC32, or a length and magic
//! before it). A failed check is an error naming the file and the position
//! wherever the bytes are needed. On a few paths weir does not need them
//! and goes on: the losing slot of the WAL's two-slot commit marker, a WAL
//! record after the restored checkpoint's end (cut off with the tail), a
//! manifest read only to protect `shared/` state files from deletion
//! (then every file is kept), the end of a direct sink's file read twice
//! with different bytes. Going on must never be silent: each such path
//! calls [`report`], which counts it ([`detected`]), logs it at `warn` with
//! the file and the byte offset as fields, keeps the newest reports
//! ([`recent`]), and tells the filesystem the file lives on
//! ([`crate::storage::vfs::Fs::corruption_detected`]; the storage simulation checks
//! with it that every bit it flipped was either refused with an error or
//! reported here).
//!
//! A crash tears the last write in flight, so after a crash a WAL log tail
//! or marker slot is reported here too: the check cannot tell a torn write
//! from rot. The count says "look at the disk" only where no crash came
//! before.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Reports [`recent`] keeps: the newest this many.
pub const RECENT: usize = 32;

static DETECTED: AtomicU64 = AtomicU64::new(0);
static LAST: Mutex<VecDeque<Report>> = Mutex::new(VecDeque::new());

/// One report of damaged bytes weir went on without.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The file.
    pub file: PathBuf,
    /// The byte the damaged bytes start at (for a whole-file or whole-record
    /// check, the start of what it covers).
    pub offset: u64,
    /// Which bytes, which check failed, and what weir did instead; it names
    /// the file.
    pub what: String,
}

/// Reports damaged bytes weir goes on without: in `file`, starting at byte
/// `offset`; `what` says which bytes, which check failed and what weir does
/// instead (it is the log message, and names the file). A rare event (it
/// takes a lock and allocates), never on a per-record path.
pub fn report(file: &Path, offset: u64, what: &str) {
    DETECTED.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(file = %file.display(), offset, "damaged bytes detected and not used: {what}");
    let r = Report {
        file: file.to_path_buf(),
        offset,
        what: what.to_string(),
    };
    crate::storage::vfs::corruption_detected(&r);
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    if last.len() == RECENT {
        last.pop_front();
    }
    last.push_back(r);
}

/// Damaged bytes reported by [`report`] in this process so far.
pub fn detected() -> u64 {
    DETECTED.load(Ordering::Relaxed)
}

/// The newest reports of this process (at most [`RECENT`]), oldest first.
pub fn recent() -> Vec<Report> {
    LAST.lock().unwrap_or_else(|e| e.into_inner()).iter().cloned().collect()
}

/// The reports among [`recent`] of files under `dir`: for tests that
/// damage files of their own and check the report.
pub fn recent_under(dir: &Path) -> Vec<Report> {
    recent().into_iter().filter(|r| r.file.starts_with(dir)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::vfs::sim::{Faults, SimFs};
    use std::sync::Arc;

    #[test]
    fn a_report_is_counted_kept_and_reaches_the_files_filesystem() {
        let root = Path::new("/weir-corruption-test");
        let fs = SimFs::new(root, 1, Faults::default());
        crate::storage::vfs::mount(root, Arc::new(fs.clone()));
        let before = detected();
        let file = root.join("a/MANIFEST");
        report(&file, 17, "a/MANIFEST: CRC mismatch; kept every file");
        crate::storage::vfs::unmount(root);
        assert!(detected() > before);
        let d = fs.take_detected();
        assert_eq!(d.len(), 1);
        assert_eq!((d[0].file.as_path(), d[0].offset), (file.as_path(), 17));
        assert!(d[0].what.contains("CRC mismatch"), "{:?}", d[0]);
        assert!(fs.take_detected().is_empty(), "taken once");
        assert_eq!(recent_under(root), d);
    }

    #[test]
    fn recent_reports_are_bounded() {
        let root = Path::new("/weir-corruption-bounded");
        for i in 0..RECENT as u64 + 5 {
            report(&root.join("f"), i, "test");
        }
        let r = recent_under(root);
        assert!(r.len() <= RECENT);
        assert_eq!(
            r.last().map(|r| r.offset),
            Some(RECENT as u64 + 4),
            "the newest is kept"
        );
    }
}
