//! Replacing a whole file durably, for output a program assembles at the
//! end of a job (`weir nexmark`'s `qN.csv`): a crash at any instant leaves
//! the old file or the new one, whole, never a torn one and never none.
//!
//! The steps, each behind a named fault point and through weir-core's
//! virtual file system (so the storage simulation sees them): write the
//! bytes to `.<name>.tmp` beside the target ([`FAULT_WRITE`]), fsync it
//! ([`FAULT_FSYNC`]), rename it over the target ([`FAULT_RENAME`]), fsync
//! the folder ([`FAULT_DIRSYNC`]). A temporary file a crash left behind is
//! overwritten by the next write.

use std::io::Write as _;
use std::path::Path;

use weir_core::vfs::{self, OpenOptions};

use crate::error::IoContext;
use crate::fsutil::{fault, sync_dir};
use crate::Result;

/// Fault point before the temporary copy is created and written.
pub const FAULT_WRITE: &str = "durable.write";
/// Fault point before the temporary copy is fsynced.
pub const FAULT_FSYNC: &str = "durable.fsync";
/// Fault point before the temporary copy is renamed over the target.
pub const FAULT_RENAME: &str = "durable.rename";
/// Fault point before the target's folder is fsynced.
pub const FAULT_DIRSYNC: &str = "durable.dirsync";
/// Every fault point of this module.
pub const DURABLE_FAULT_POINTS: &[&str] = &[FAULT_WRITE, FAULT_FSYNC, FAULT_RENAME, FAULT_DIRSYNC];

/// Replaces `path` with `bytes`, durably: once this returns `Ok`, the new
/// content survives a crash; a crash before leaves the old file (or none,
/// if there was none) or the new one. The folder must exist.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    write_file_at(path, bytes, [FAULT_WRITE, FAULT_FSYNC, FAULT_RENAME, FAULT_DIRSYNC])
}

/// [`write_file`] through the fault points `faults` (write, fsync, rename,
/// folder fsync), for a caller whose steps have names of their own.
pub(crate) fn write_file_at(path: &Path, bytes: &[u8], faults: [&str; 4]) -> Result<()> {
    let [write, fsync, rename, dirsync] = faults;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(".{name}.tmp"));
    fault(write, "write", &tmp)?;
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .ctx("create", &tmp)?;
    f.write_all(bytes).ctx("write", &tmp)?;
    fault(fsync, "fsync", &tmp)?;
    f.sync_data().ctx("fsync", &tmp)?;
    drop(f);
    fault(rename, "rename", &tmp)?;
    vfs::rename(&tmp, path).ctx(&format!("rename {} to", tmp.display()), path)?;
    sync_dir(dir, dirsync)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::fsutil::sim::Mounted;

    #[test]
    fn write_file_replaces_the_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q1.csv");
        write_file(&path, b"a\n").unwrap();
        write_file(&path, b"b\nc\n").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"b\nc\n");
        assert!(!dir.path().join(".q1.csv.tmp").exists(), "no temporary copy left");
    }

    /// A crash at every step of a replacement leaves the old content or the
    /// new, whole, with every seed (each deciding differently what of the
    /// unsynced data and folder entries survives); a write that returned
    /// `Ok` always survives.
    #[test]
    fn a_crash_at_every_step_leaves_the_old_file_or_the_new() {
        let old = vec![b'o'; 3000];
        let new = vec![b'n'; 5000];
        let steps = {
            let m = Mounted::new(PathBuf::from("/weir-sim-unit/durable-count"), 0);
            let path = m.0.join("out.csv");
            write_file(&path, &old).unwrap();
            let before = m.1.ops();
            write_file(&path, &new).unwrap();
            m.1.ops() - before
        };
        assert!(steps >= 4, "create, write, fsync, rename, folder fsync: {steps}");
        let (mut olds, mut news) = (0, 0);
        for k in 1..=steps + 1 {
            for seed in 0..8 {
                let m = Mounted::new(PathBuf::from(format!("/weir-sim-unit/durable-{k}-{seed}")), seed);
                let path = m.0.join("out.csv");
                write_file(&path, &old).unwrap();
                m.1.crash_after(Some(k));
                let wrote = write_file(&path, &new);
                assert_eq!(wrote.is_ok(), k > steps, "crash point {k}: {wrote:?}");
                m.1.crash();
                let got = vfs::read(&path).unwrap_or_else(|e| panic!("crash point {k}, seed {seed}: {e}"));
                if got == old {
                    olds += 1;
                } else if got == new {
                    news += 1;
                } else {
                    panic!("crash point {k}, seed {seed}: a torn file of {} bytes", got.len());
                }
                if wrote.is_ok() {
                    assert_eq!(got, new, "crash point {k}, seed {seed}: an acknowledged write was lost");
                }
                // And the next write goes through.
                write_file(&path, &new).unwrap();
                assert_eq!(vfs::read(&path).unwrap(), new);
            }
        }
        assert!(olds > 0 && news > 0, "old {olds}, new {news}");
    }
}
