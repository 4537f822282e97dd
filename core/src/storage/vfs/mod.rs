//! The one filesystem interface every durable path of weir goes through:
//! checkpoint folders and manifests, state snapshot files, the write-ahead
//! log and its markers, the two-phase and direct file sinks.
//!
//! It exists so that tests can put a simulated disk under real jobs
//! ([`sim::SimFs`]: in memory, seeded, losing unsynced data, undoing
//! unsynced renames, tearing writes, injecting `ENOSPC`, `EIO` and bit
//! flips) without a parallel code path: the code that runs in production is
//! the code the simulation tests.
//!
//! Routing is by path: [`mount`] puts an [`Fs`] under a path prefix, and
//! every function here (and [`File`], [`OpenOptions`]) sends a path under a
//! mounted prefix to that filesystem and every other path to `std::fs`.
//! Nothing is mounted in production, and then the cost of routing is one
//! relaxed atomic load per open, rename, listing or sync (never per record:
//! writes through an open [`File`] to the real disk are a `match` and the
//! `std::fs::File` call).
//!
//! Memory-mapped state working files (the state backend's live pages) stay
//! on the real filesystem: they are a cache rebuilt from checkpoints, never
//! read back after a crash. The snapshot files written from them at
//! checkpoints go through this interface.

#[cfg(any(test, feature = "sim"))]
pub mod sim;

use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

/// A filesystem weir's durable paths can run on: the real one
/// (`std::fs`) or a simulated one. Paths given are absolute, as the caller
/// gave them (the mount prefix included).
pub trait Fs: Send + Sync {
    /// Opens `path` as `opts` says (as `std::fs::OpenOptions::open`).
    fn open(&self, path: &Path, opts: &OpenOptions) -> io::Result<File>;
    /// The whole contents of file `path`.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// The names in folder `path` (unsorted).
    fn read_dir(&self, path: &Path) -> io::Result<Vec<String>>;
    /// Creates folder `path`; its parent must exist, it must not.
    fn create_dir(&self, path: &Path) -> io::Result<()>;
    /// Creates folder `path` and its missing parents.
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Renames `from` to `to`, replacing a file there.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes file `path`.
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Removes folder `path` and everything under it.
    fn remove_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Makes the entries created, renamed or removed in folder `path`
    /// durable.
    fn sync_dir(&self, path: &Path) -> io::Result<()>;
    /// Size of file `path`, or whether it is a folder.
    fn metadata(&self, path: &Path) -> io::Result<Metadata>;
    /// Weir found damaged bytes in one of this filesystem's files and went
    /// on without them ([`crate::storage::corruption::report`] calls it). Nothing by
    /// default; a simulated disk records it.
    fn corruption_detected(&self, report: &crate::storage::corruption::Report) {
        let _ = report;
    }
}

/// What [`metadata`] tells of a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metadata {
    len: u64,
    dir: bool,
}

impl Metadata {
    /// Metadata of a file of `len` bytes, or of a folder.
    pub fn new(len: u64, dir: bool) -> Self {
        Metadata { len, dir }
    }
    /// Bytes in the file.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// True for an empty file.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// True for a folder.
    pub fn is_dir(&self) -> bool {
        self.dir
    }
}

/// An open file of a simulated (or other non-`std`) filesystem.
pub trait FileOps: Read + Write + Seek + Send + Sync {
    /// Makes the file's data durable (`fdatasync`).
    fn sync_data(&self) -> io::Result<()>;
    /// Makes the file's data and metadata durable (`fsync`).
    fn sync_all(&self) -> io::Result<()>;
    /// The file's metadata.
    fn metadata(&self) -> io::Result<Metadata>;
    /// Truncates or extends the file to `len` bytes.
    fn set_len(&self, len: u64) -> io::Result<()>;
}

enum Inner {
    Std(std::fs::File),
    Other(Box<dyn FileOps>),
}

/// An open file: a `std::fs::File`, or a file of a mounted [`Fs`].
pub struct File(Inner);

impl std::fmt::Debug for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Inner::Std(file) => file.fmt(f),
            Inner::Other(_) => f.write_str("File(simulated)"),
        }
    }
}

impl File {
    /// Wraps a file of another filesystem.
    pub fn from_ops(ops: Box<dyn FileOps>) -> Self {
        File(Inner::Other(ops))
    }
    /// Opens `path` for reading.
    pub fn open(path: impl AsRef<Path>) -> io::Result<File> {
        OpenOptions::new().read(true).open(path)
    }
    /// Creates (or truncates) `path` for writing.
    pub fn create(path: impl AsRef<Path>) -> io::Result<File> {
        OpenOptions::new().write(true).create(true).truncate(true).open(path)
    }
    /// `fdatasync`, counted by [`crate::storage::disk`].
    pub fn sync_data(&self) -> io::Result<()> {
        match &self.0 {
            Inner::Std(f) => crate::storage::disk::sync_data(f),
            Inner::Other(f) => f.sync_data(),
        }
    }
    /// `fsync`, counted by [`crate::storage::disk`].
    pub fn sync_all(&self) -> io::Result<()> {
        match &self.0 {
            Inner::Std(f) => crate::storage::disk::sync_all(f),
            Inner::Other(f) => f.sync_all(),
        }
    }
    /// The file's metadata.
    pub fn metadata(&self) -> io::Result<Metadata> {
        match &self.0 {
            Inner::Std(f) => f.metadata().map(|m| Metadata::new(m.len(), m.is_dir())),
            Inner::Other(f) => f.metadata(),
        }
    }
    /// Truncates or extends the file to `len` bytes.
    pub fn set_len(&self, len: u64) -> io::Result<()> {
        match &self.0 {
            Inner::Std(f) => f.set_len(len),
            Inner::Other(f) => f.set_len(len),
        }
    }
    /// The `std::fs::File`, for a file of the real filesystem (memory
    /// maps, positioned I/O); `None` for a simulated one.
    pub fn as_std(&self) -> Option<&std::fs::File> {
        match &self.0 {
            Inner::Std(f) => Some(f),
            Inner::Other(_) => None,
        }
    }
}

impl Read for File {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.0 {
            Inner::Std(f) => f.read(buf),
            Inner::Other(f) => f.read(buf),
        }
    }
}

impl Write for File {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.0 {
            Inner::Std(f) => f.write(buf),
            Inner::Other(f) => f.write(buf),
        }
    }
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match &mut self.0 {
            Inner::Std(f) => f.write_all(buf),
            Inner::Other(f) => f.write_all(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match &mut self.0 {
            Inner::Std(f) => f.flush(),
            Inner::Other(f) => f.flush(),
        }
    }
}

impl Seek for File {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        match &mut self.0 {
            Inner::Std(f) => f.seek(pos),
            Inner::Other(f) => f.seek(pos),
        }
    }
}

/// How to open a file; the same flags as `std::fs::OpenOptions`.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// Open for reading.
    pub read: bool,
    /// Open for writing.
    pub write: bool,
    /// Every write goes to the end.
    pub append: bool,
    /// Create the file if absent.
    pub create: bool,
    /// Create the file; fail if it exists.
    pub create_new: bool,
    /// Truncate the file to 0 bytes.
    pub truncate: bool,
}

impl OpenOptions {
    /// No flags set.
    pub fn new() -> Self {
        OpenOptions::default()
    }
    /// Sets `read`.
    pub fn read(&mut self, on: bool) -> &mut Self {
        self.read = on;
        self
    }
    /// Sets `write`.
    pub fn write(&mut self, on: bool) -> &mut Self {
        self.write = on;
        self
    }
    /// Sets `append`.
    pub fn append(&mut self, on: bool) -> &mut Self {
        self.append = on;
        self
    }
    /// Sets `create`.
    pub fn create(&mut self, on: bool) -> &mut Self {
        self.create = on;
        self
    }
    /// Sets `create_new`.
    pub fn create_new(&mut self, on: bool) -> &mut Self {
        self.create_new = on;
        self
    }
    /// Sets `truncate`.
    pub fn truncate(&mut self, on: bool) -> &mut Self {
        self.truncate = on;
        self
    }
    /// Opens `path` on the filesystem mounted there, or the real one.
    pub fn open(&self, path: impl AsRef<Path>) -> io::Result<File> {
        let path = path.as_ref();
        match route(path) {
            Some(fs) => fs.open(path, self),
            None => RealFs.open(path, self),
        }
    }
}

/// `std::fs`: the filesystem of every path nothing is mounted on.
#[derive(Debug, Clone, Copy, Default)]
pub struct RealFs;

impl Fs for RealFs {
    fn open(&self, path: &Path, o: &OpenOptions) -> io::Result<File> {
        std::fs::OpenOptions::new()
            .read(o.read)
            .write(o.write)
            .append(o.append)
            .create(o.create)
            .create_new(o.create_new)
            .truncate(o.truncate)
            .open(path)
            .map(|f| File(Inner::Std(f)))
    }
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }
    fn read_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(path)? {
            if let Ok(name) = entry?.file_name().into_string() {
                names.push(name);
            }
        }
        Ok(names)
    }
    fn create_dir(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir(path)
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir_all(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_dir_all(path)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        crate::storage::disk::sync_dir_std(path)
    }
    fn metadata(&self, path: &Path) -> io::Result<Metadata> {
        std::fs::metadata(path).map(|m| Metadata::new(m.len(), m.is_dir()))
    }
}

static ANY_MOUNTED: AtomicBool = AtomicBool::new(false);
type Mounts = Vec<(PathBuf, Arc<dyn Fs>)>;
static MOUNTS: RwLock<Mounts> = RwLock::new(Vec::new());

/// Puts `fs` under path prefix `at` (process-wide) until [`unmount`]:
/// every path under `at` then goes to `fs`. For tests.
pub fn mount(at: impl Into<PathBuf>, fs: Arc<dyn Fs>) {
    let mut m = MOUNTS.write().unwrap_or_else(|e| e.into_inner());
    let at = at.into();
    m.retain(|(p, _)| *p != at);
    m.push((at, fs));
    ANY_MOUNTED.store(true, Ordering::Release);
}

/// Removes the filesystem mounted at `at`.
pub fn unmount(at: &Path) {
    let mut m = MOUNTS.write().unwrap_or_else(|e| e.into_inner());
    m.retain(|(p, _)| p != at);
    ANY_MOUNTED.store(!m.is_empty(), Ordering::Release);
}

/// The filesystem mounted over `path`, if any.
#[inline]
fn route(path: &Path) -> Option<Arc<dyn Fs>> {
    if !ANY_MOUNTED.load(Ordering::Acquire) {
        return None;
    }
    let m = MOUNTS.read().unwrap_or_else(|e| e.into_inner());
    m.iter()
        .find(|(p, _)| path.starts_with(p))
        .map(|(_, fs)| Arc::clone(fs))
}

/// The prefix a filesystem is mounted at over `path`, if any.
pub fn mount_point(path: &Path) -> Option<PathBuf> {
    if !ANY_MOUNTED.load(Ordering::Acquire) {
        return None;
    }
    let m = MOUNTS.read().unwrap_or_else(|e| e.into_inner());
    m.iter().find(|(p, _)| path.starts_with(p)).map(|(p, _)| p.clone())
}

/// Runs `f` on the filesystem of `path`.
fn with<R>(path: &Path, f: impl FnOnce(&dyn Fs) -> R) -> R {
    match route(path) {
        Some(fs) => f(&*fs),
        None => f(&RealFs),
    }
}

/// The whole contents of file `path`.
pub fn read(path: impl AsRef<Path>) -> io::Result<Vec<u8>> {
    let p = path.as_ref();
    with(p, |fs| fs.read(p))
}

/// The names in folder `path`, sorted.
pub fn read_dir(path: impl AsRef<Path>) -> io::Result<Vec<String>> {
    let p = path.as_ref();
    let mut names = with(p, |fs| fs.read_dir(p))?;
    names.sort();
    Ok(names)
}

/// Creates folder `path` (its parent must exist; it must not).
pub fn create_dir(path: impl AsRef<Path>) -> io::Result<()> {
    let p = path.as_ref();
    with(p, |fs| fs.create_dir(p))
}

/// Creates folder `path` and its missing parents.
pub fn create_dir_all(path: impl AsRef<Path>) -> io::Result<()> {
    let p = path.as_ref();
    with(p, |fs| fs.create_dir_all(p))
}

/// Renames `from` to `to` (both on one filesystem).
pub fn rename(from: impl AsRef<Path>, to: impl AsRef<Path>) -> io::Result<()> {
    let (f, t) = (from.as_ref(), to.as_ref());
    with(f, |fs| fs.rename(f, t))
}

/// Removes file `path`.
pub fn remove_file(path: impl AsRef<Path>) -> io::Result<()> {
    let p = path.as_ref();
    with(p, |fs| fs.remove_file(p))
}

/// Removes folder `path` and everything under it.
pub fn remove_dir_all(path: impl AsRef<Path>) -> io::Result<()> {
    let p = path.as_ref();
    with(p, |fs| fs.remove_dir_all(p))
}

/// Fsyncs folder `path` (counted by [`crate::storage::disk`] on the real disk).
pub fn sync_dir(path: impl AsRef<Path>) -> io::Result<()> {
    let p = path.as_ref();
    with(p, |fs| fs.sync_dir(p))
}

/// The metadata of `path`.
pub fn metadata(path: impl AsRef<Path>) -> io::Result<Metadata> {
    let p = path.as_ref();
    with(p, |fs| fs.metadata(p))
}

/// Tells the filesystem of the report's file that weir found damaged bytes
/// in it and went on without them (see [`Fs::corruption_detected`]).
pub fn corruption_detected(report: &crate::storage::corruption::Report) {
    if let Some(fs) = route(&report.file) {
        fs.corruption_detected(report);
    }
}

/// Whether `path` exists.
pub fn exists(path: impl AsRef<Path>) -> bool {
    metadata(path).is_ok()
}

/// Whether `path` is a folder.
pub fn is_dir(path: impl AsRef<Path>) -> bool {
    metadata(path).is_ok_and(|m| m.is_dir())
}

/// Whether `path` is on a mounted (simulated) filesystem: its files cannot
/// be memory-mapped and are read with [`read`] instead.
pub fn is_mounted(path: &Path) -> bool {
    route(path).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unmounted_paths_go_to_the_real_filesystem() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a");
        let mut f = File::create(&p).unwrap();
        f.write_all(b"hello").unwrap();
        f.sync_data().unwrap();
        assert!(f.as_std().is_some());
        drop(f);
        rename(&p, dir.path().join("b")).unwrap();
        sync_dir(dir.path()).unwrap();
        assert_eq!(read_dir(dir.path()).unwrap(), vec!["b".to_string()]);
        assert_eq!(read(dir.path().join("b")).unwrap(), b"hello");
        assert_eq!(metadata(dir.path().join("b")).unwrap().len(), 5);
        assert!(is_dir(dir.path()));
        assert!(!is_mounted(dir.path()));
    }
}
