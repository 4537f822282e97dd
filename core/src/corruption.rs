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
//! the file and the byte offset as fields, and tells the filesystem the
//! file lives on ([`crate::vfs::Fs::corruption_detected`]; the storage
//! simulation checks with it that every bit it flipped was either refused
//! with an error or reported here).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

static DETECTED: AtomicU64 = AtomicU64::new(0);

/// Reports damaged bytes weir goes on without: in `file`, starting at byte
/// `offset`; `what` says which bytes, which check failed and what weir does
/// instead (it is the log message).
pub fn report(file: &Path, offset: u64, what: &str) {
    DETECTED.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(file = %file.display(), offset, "damaged bytes detected and not used: {what}");
    crate::vfs::corruption_detected(file, offset, what);
}

/// Damaged bytes reported by [`report`] in this process so far.
pub fn detected() -> u64 {
    DETECTED.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vfs::sim::{Faults, SimFs};
    use std::sync::Arc;

    #[test]
    fn a_report_is_counted_and_reaches_the_files_filesystem() {
        let root = Path::new("/weir-corruption-test");
        let fs = SimFs::new(root, 1, Faults::default());
        crate::vfs::mount(root, Arc::new(fs.clone()));
        let before = detected();
        report(&root.join("a/MANIFEST"), 17, "CRC mismatch; kept every file");
        crate::vfs::unmount(root);
        assert!(detected() > before);
        let d = fs.take_detected();
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].path, root.join("a/MANIFEST"));
        assert_eq!(d[0].offset, 17);
        assert!(d[0].what.contains("CRC mismatch"), "{:?}", d[0]);
        assert!(fs.take_detected().is_empty(), "taken once");
    }
}
