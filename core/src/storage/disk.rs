//! Durable syncs (`fsync`, `fdatasync`) issued by weir, timed and counted
//! process-wide.
//!
//! Every sync of a checkpoint file, a manifest, a folder, a write-ahead log
//! or a sink's output goes through [`sync_data`], [`sync_all`] or
//! [`sync_dir`]. They count each call and record its duration, so that a
//! benchmark can say what bounds a checkpoint's latency: how many syncs a
//! checkpoint takes and how long each waited for the disk ([`sync_stats`]).
//! Syncs that a library does internally (SQLite's) are not seen here.
//!
//! Cost: one clock reading before and after, two relaxed atomic additions
//! and a short lock on the histogram, per sync: nothing beside the
//! hundreds of microseconds a sync waits for the disk.

use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use hdrhistogram::Histogram;

static COUNT: AtomicU64 = AtomicU64::new(0);
static TOTAL_NS: AtomicU64 = AtomicU64::new(0);
static LATENCY: Mutex<Option<Histogram<u64>>> = Mutex::new(None);

/// Syncs issued so far in this process.
#[derive(Debug, Clone)]
pub struct SyncStats {
    /// Syncs completed (successful or not).
    pub count: u64,
    /// Time spent in them, summed, nanoseconds.
    pub total_ns: u64,
    /// Their durations, nanoseconds.
    pub latency_ns: Histogram<u64>,
}

impl SyncStats {
    /// What happened between `earlier` and `self` (both from [`sync_stats`]).
    pub fn since(&self, earlier: &SyncStats) -> SyncStats {
        let mut latency_ns = self.latency_ns.clone();
        // Histograms only grow, so the subtraction cannot underflow.
        let _ = latency_ns.subtract(&earlier.latency_ns);
        SyncStats {
            count: self.count - earlier.count,
            total_ns: self.total_ns - earlier.total_ns,
            latency_ns,
        }
    }
}

/// A snapshot of the process-wide sync counters.
///
/// ```
/// let before = weir_core::disk::sync_stats();
/// let dir = tempfile::tempdir().unwrap();
/// let f = std::fs::File::create(dir.path().join("x")).unwrap();
/// weir_core::disk::sync_data(&f).unwrap();
/// let after = weir_core::disk::sync_stats();
/// assert!(after.since(&before).count >= 1);
/// ```
pub fn sync_stats() -> SyncStats {
    let latency_ns = LATENCY
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .unwrap_or_else(crate::latency::new_latency_histogram);
    SyncStats {
        count: COUNT.load(Ordering::Relaxed),
        total_ns: TOTAL_NS.load(Ordering::Relaxed),
        latency_ns,
    }
}

fn timed(f: impl FnOnce() -> std::io::Result<()>) -> std::io::Result<()> {
    let start = crate::clock::now_ns();
    let result = f();
    let took = crate::clock::now_ns().saturating_sub(start);
    COUNT.fetch_add(1, Ordering::Relaxed);
    TOTAL_NS.fetch_add(took, Ordering::Relaxed);
    let mut h = LATENCY.lock().unwrap_or_else(|p| p.into_inner());
    h.get_or_insert_with(crate::latency::new_latency_histogram)
        .saturating_record(took.max(1));
    result
}

/// `file.sync_data()` (fdatasync), counted.
pub fn sync_data(file: &File) -> std::io::Result<()> {
    timed(|| file.sync_data())
}

/// `file.sync_all()` (fsync), counted.
pub fn sync_all(file: &File) -> std::io::Result<()> {
    timed(|| file.sync_all())
}

/// Fsyncs folder `dir`, so that entries created, renamed or removed in it
/// survive a crash; counted (the open is not timed). A folder on a
/// mounted filesystem ([`crate::storage::vfs::mount`]) is synced there.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    if crate::storage::vfs::is_mounted(dir) {
        crate::storage::vfs::sync_dir(dir)?;
        trace::note(|| format!("sync {}", dir.display()));
        return Ok(());
    }
    sync_dir_std(dir)
}

/// [`sync_dir`] on the real filesystem.
pub(crate) fn sync_dir_std(dir: &Path) -> std::io::Result<()> {
    let d = File::open(dir)?;
    timed(|| d.sync_all())?;
    trace::note(|| format!("sync {}", dir.display()));
    Ok(())
}

/// Creates folder `path` and its missing parents durably, and makes sure
/// that every folder on the way is durable, even one that exists already:
/// `path` and each of its ancestors up to the root of the filesystem
/// holding it (or of the mounted filesystem, [`crate::storage::vfs::mount`]) is
/// fsynced, so that a crash cannot take back a folder (and everything
/// later made durable in it, such as completed checkpoints) once its
/// contents are relied on.
///
/// Why a folder that exists is synced too: it may be the work of an
/// earlier process whose fsync of its parent failed or never ran (the
/// process failed, or the machine stopped, between the `mkdir` and the
/// sync). Finding it says nothing about whether it survives a crash.
/// This runs when a sink or a job opens its folders, never per
/// checkpoint, so its few folder syncs cost nothing that matters.
///
/// An ancestor that existed and cannot be opened for lack of permission
/// ends the walk, with a warning: nothing weir can do makes it durable.
pub fn create_dir_all_durable(path: &Path) -> std::io::Result<()> {
    crate::storage::vfs::create_dir_all(path)?;
    let top = crate::storage::vfs::mount_point(path);
    let mut dir = path;
    loop {
        match sync_dir(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied && dir != path => {
                tracing::warn!(
                    "cannot open folder {} to fsync it ({e}): a crash may take back folders under it that an earlier process created",
                    dir.display()
                );
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        if top.as_deref() == Some(dir) {
            return Ok(());
        }
        let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) else {
            return Ok(());
        };
        if top.is_none() && !same_device(dir, parent) {
            // `dir` is the root of its filesystem: its entry in the
            // filesystem it is mounted on is not this one's to keep.
            return Ok(());
        }
        dir = parent;
    }
}

/// Whether two paths on the real filesystem are on one device (a mount
/// point is on another device than its parent).
fn same_device(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev(),
        _ => false,
    }
}

/// The order of durable steps, for unit tests: a test starts recording on
/// its own thread ([`trace::start`]), runs the code under test there and
/// reads what happened ([`trace::take`]): folder syncs and the removals
/// that must follow them. Thread-local, so tests running in parallel do
/// not see each other's steps; outside `cfg(test)`, [`trace::note`] is
/// empty and compiles to nothing.
pub(crate) mod trace {
    #[cfg(test)]
    thread_local! {
        static LOG: std::cell::RefCell<Option<Vec<String>>> = const { std::cell::RefCell::new(None) };
    }

    /// Records `what()` if the calling thread records.
    #[cfg(test)]
    pub(crate) fn note(what: impl FnOnce() -> String) {
        LOG.with(|l| {
            if let Some(log) = l.borrow_mut().as_mut() {
                log.push(what());
            }
        });
    }

    /// Records `what()` if the calling thread records (never, in this build).
    #[cfg(not(test))]
    #[inline(always)]
    pub(crate) fn note(_what: impl FnOnce() -> String) {}

    /// Starts recording on the calling thread (clearing what was recorded).
    #[cfg(test)]
    pub(crate) fn start() {
        LOG.with(|l| *l.borrow_mut() = Some(Vec::new()));
    }

    /// Stops recording on the calling thread; returns what was recorded.
    #[cfg(test)]
    pub(crate) fn take() -> Vec<String> {
        LOG.with(|l| l.borrow_mut().take().unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syncs_are_counted_and_timed() {
        let dir = tempfile::tempdir().unwrap();
        let before = sync_stats();
        let f = File::create(dir.path().join("a")).unwrap();
        sync_data(&f).unwrap();
        sync_all(&f).unwrap();
        sync_dir(dir.path()).unwrap();
        let d = sync_stats().since(&before);
        // Other tests of this process may sync at the same time: at least ours.
        assert!(d.count >= 3, "{d:?}");
        assert!(d.latency_ns.len() >= 3);
        assert!(d.total_ns > 0);
        assert!(sync_dir(&dir.path().join("missing")).is_err());
    }

    /// The new folder and every folder above it, up to the root of its
    /// filesystem, is synced; so is it all again when the folders exist
    /// already (an earlier process may have failed before its syncs).
    #[test]
    fn the_folder_and_every_ancestor_is_synced_created_or_not() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let (a, b, c) = (dir.path().join("a"), dir.path().join("a/b"), dir.path().join("a/b/c"));
        let dev = std::fs::metadata(dir.path()).unwrap().dev();
        let mut expected: Vec<String> = [&c, &b, &a].iter().map(|p| format!("sync {}", p.display())).collect();
        for p in dir.path().ancestors() {
            if std::fs::metadata(p).unwrap().dev() != dev {
                break;
            }
            expected.push(format!("sync {}", p.display()));
        }
        for _ in 0..2 {
            trace::start();
            create_dir_all_durable(&c).unwrap();
            let synced = trace::take();
            // Up to the filesystem's root, or to a folder this user may not open.
            assert!(synced.len() >= 4, "{synced:?}");
            assert_eq!(synced[..], expected[..synced.len()]);
            assert!(c.is_dir());
        }
    }
}
