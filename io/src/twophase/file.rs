//! Two-phase commit into a folder of files: the file example of the
//! end-to-end seeds.
//!
//! - begin: a transaction of epoch `e` is the temporary file
//!   `.inprogress/part-<subtask>-<e><suffix>.tmp` in the target folder
//!   (a hidden subfolder: readers of the target never see it), created at
//!   the first write (`2pc.file.write`, also before each buffer written);
//! - pre-commit: the buffer is written, the file fsynced and closed
//!   (`2pc.file.precommit.fsync`), and the hidden folder fsynced so that
//!   the file's name survives a crash (`2pc.file.precommit.dirsync`);
//! - commit: the file is renamed to `part-<subtask>-<e><suffix>` in the
//!   target folder (`2pc.file.commit.rename`): readers see it from then
//!   on. The folder is fsynced at the next barrier, after the pre-commit's
//!   file sync (`sync_commits`, `2pc.file.commit.dirsync`), before that
//!   checkpoint is acknowledged: until then the checkpoint being committed
//!   still records the transaction, and a restore from it commits it again.
//!   (On ext4 the file sync's journal commit has then carried the renames
//!   along, so the folder fsyncs cost next to nothing: one journal commit per
//!   barrier and subtask instead of three.)
//!   Idempotent: if the temporary file is gone and the committed one exists,
//!   the commit happened before; only the folder is fsynced again. Neither
//!   existing is an error (lost output);
//! - abort: the temporary file is deleted (`2pc.file.abort`).
//!
//! On recovery, temporary files of this subtask newer than the restored
//! checkpoint are deleted, and a committed file newer than it (or any, for
//! a start without a checkpoint) makes the sink refuse to run.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use weir_core::BoxError;

use super::TwoPhaseCommit;
use crate::error::IoContext;
use crate::fsutil::{self, create_dir_durable, fault, remove_if_exists, sync_dir};
use crate::{Error, Result};

/// Fault point before a temporary file is created or written to.
pub const FAULT_WRITE: &str = "2pc.file.write";
/// Fault point before a temporary file is fsynced at pre-commit.
pub const FAULT_PRECOMMIT_FSYNC: &str = "2pc.file.precommit.fsync";
/// Fault point before the hidden folder is fsynced at pre-commit.
pub const FAULT_PRECOMMIT_DIRSYNC: &str = "2pc.file.precommit.dirsync";
/// Fault point before a temporary file is renamed into the target.
pub const FAULT_COMMIT_RENAME: &str = "2pc.file.commit.rename";
/// Fault point before the target folder is fsynced at commit.
pub const FAULT_COMMIT_DIRSYNC: &str = "2pc.file.commit.dirsync";
/// Fault point before a temporary file is deleted at abort.
pub const FAULT_ABORT: &str = "2pc.file.abort";

/// Every fault point of [`FileTransactions`], in protocol order.
pub const FILE_FAULT_POINTS: &[&str] = &[
    FAULT_WRITE,
    FAULT_PRECOMMIT_FSYNC,
    FAULT_PRECOMMIT_DIRSYNC,
    FAULT_COMMIT_RENAME,
    FAULT_COMMIT_DIRSYNC,
    FAULT_ABORT,
];

/// Name of the hidden subfolder of transactions in progress.
pub const IN_PROGRESS_DIR: &str = ".inprogress";

/// Bytes buffered before a write to the temporary file: 1 MiB.
const BUF_BYTES: usize = 1 << 20;

/// The handle of a file transaction, as a checkpoint records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileTxn {
    /// The epoch whose records it holds.
    pub epoch: u64,
    /// The temporary file, relative to the target folder.
    pub temp: String,
    /// The committed file's name in the target folder.
    pub name: String,
    /// Bytes written (0: nothing to commit).
    pub bytes: u64,
}

/// [`TwoPhaseCommit`] into files in a folder; see the module docs. Wrap it
/// in a [`super::TwoPhaseCommitSink`].
pub struct FileTransactions<T, F, E> {
    target: PathBuf,
    staging: PathBuf,
    subtask: usize,
    suffix: String,
    encode: F,
    emitted_ns: E,
    /// The temporary file being written, with its transaction's epoch.
    file: Option<(u64, File)>,
    buf: Vec<u8>,
    /// A temporary file was created since the hidden folder's last fsync.
    staging_dirty: bool,
    /// Files were renamed into the target since its last fsync.
    target_dirty: bool,
    _records: PhantomData<fn(&T)>,
}

impl<T, F, E> FileTransactions<T, F, E>
where
    F: Fn(&T, &mut Vec<u8>),
    E: Fn(&T) -> u64,
{
    /// Transactions of sink subtask `subtask` into folder `target`.
    /// `encode(record, out)` appends a record's bytes (a line and its `\n`);
    /// `emitted_ns(record)` gives its emission time (0: unknown).
    pub fn new(target: impl Into<PathBuf>, subtask: usize, encode: F, emitted_ns: E) -> Self {
        let target = target.into();
        FileTransactions {
            staging: target.join(IN_PROGRESS_DIR),
            target,
            subtask,
            suffix: ".csv".into(),
            encode,
            emitted_ns,
            file: None,
            buf: Vec::new(),
            staging_dirty: false,
            target_dirty: false,
            _records: PhantomData,
        }
    }

    /// Sets the ending of file names (default `.csv`).
    pub fn suffix(mut self, suffix: impl Into<String>) -> Self {
        self.suffix = suffix.into();
        self
    }

    fn temp_path(&self, txn: &FileTxn) -> PathBuf {
        self.target.join(&txn.temp)
    }

    /// Writes the buffer to the temporary file of `txn`.
    fn write_out(&mut self, txn: &FileTxn) -> Result<()> {
        let temp = self.temp_path(txn);
        fault(FAULT_WRITE, "write", &temp)?;
        if self.file.as_ref().is_none_or(|(e, _)| *e != txn.epoch) {
            let f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&temp)
                .ctx("create", &temp)?;
            self.file = Some((txn.epoch, f));
            self.staging_dirty = true;
        }
        let (_, f) = self.file.as_mut().expect("opened above");
        f.write_all(&self.buf).ctx("write", &temp)?;
        self.buf.clear();
        Ok(())
    }

    /// The highest epoch of this subtask's committed files in the target.
    fn newest_committed(&self) -> Result<Option<u64>> {
        Ok(fsutil::list_names(&self.target)?
            .iter()
            .filter(|n| !n.starts_with('.'))
            .filter_map(|n| fsutil::parse_part_name(n, &self.suffix))
            .filter(|&(s, _)| s == self.subtask)
            .map(|(_, e)| e)
            .max())
    }
}

impl<T, F, E> TwoPhaseCommit<T> for FileTransactions<T, F, E>
where
    T: Send + 'static,
    F: Fn(&T, &mut Vec<u8>) + Send + 'static,
    E: Fn(&T) -> u64 + Send + 'static,
{
    type Txn = FileTxn;

    fn begin_transaction(&mut self, epoch: u64) -> Result<FileTxn, BoxError> {
        let name = fsutil::part_name(self.subtask, epoch, &self.suffix);
        Ok(FileTxn {
            epoch,
            temp: format!("{IN_PROGRESS_DIR}/{name}.tmp"),
            name,
            bytes: 0,
        })
    }

    fn write(&mut self, txn: &mut FileTxn, batch: &mut Vec<T>) -> Result<(), BoxError> {
        for r in batch.drain(..) {
            let before = self.buf.len();
            (self.encode)(&r, &mut self.buf);
            txn.bytes += (self.buf.len() - before) as u64;
            if self.buf.len() >= BUF_BYTES {
                self.write_out(txn)?;
            }
        }
        Ok(())
    }

    fn pre_commit(&mut self, txn: &mut FileTxn) -> Result<(), BoxError> {
        if txn.bytes == 0 {
            return Ok(());
        }
        if !self.buf.is_empty() || self.file.is_none() {
            self.write_out(txn)?;
        }
        let temp = self.temp_path(txn);
        let (_, f) = self.file.take().expect("written above");
        fault(FAULT_PRECOMMIT_FSYNC, "fsync", &temp)?;
        f.sync_data().ctx("fsync", &temp)?;
        drop(f);
        if self.staging_dirty {
            sync_dir(&self.staging, FAULT_PRECOMMIT_DIRSYNC)?;
            self.staging_dirty = false;
        }
        Ok(())
    }

    fn commit(&mut self, txn: &FileTxn) -> Result<(), BoxError> {
        if txn.bytes == 0 {
            return Ok(());
        }
        let temp = self.temp_path(txn);
        let target = self.target.join(&txn.name);
        fault(FAULT_COMMIT_RENAME, "rename into place", &temp)?;
        match std::fs::rename(&temp, &target) {
            Ok(()) => {}
            // Committed before: the rename happened, maybe not its fsync.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && target.exists() => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::LostTransaction {
                    sink: "two-phase file",
                    epoch: txn.epoch,
                    temp,
                    target,
                }
                .into())
            }
            Err(e) => return Err(Error::io(format!("rename to {}", target.display()), &temp, e).into()),
        }
        self.target_dirty = true;
        Ok(())
    }

    fn sync_commits(&mut self) -> Result<(), BoxError> {
        if self.target_dirty {
            sync_dir(&self.target, FAULT_COMMIT_DIRSYNC)?;
            self.target_dirty = false;
        }
        Ok(())
    }

    fn abort(&mut self, txn: &FileTxn) -> Result<(), BoxError> {
        if self.file.as_ref().is_some_and(|(e, _)| *e == txn.epoch) {
            self.file = None;
            self.buf.clear();
        }
        let temp = self.temp_path(txn);
        fault(FAULT_ABORT, "delete", &temp)?;
        remove_if_exists(&temp)?;
        Ok(())
    }

    fn recover(&mut self, restored: Option<u64>) -> Result<(), BoxError> {
        self.file = None;
        self.buf.clear();
        create_dir_durable(&self.target)?;
        create_dir_durable(&self.staging)?;
        let floor = restored.unwrap_or(0);
        if let Some(newest) = self.newest_committed()?.filter(|&e| restored.is_none() || e > floor) {
            return Err(Error::TargetAhead {
                sink: "two-phase file",
                subtask: self.subtask,
                target: self.target.display().to_string(),
                committed: newest,
                restored,
            }
            .into());
        }
        let mut removed = false;
        for name in fsutil::list_names(&self.staging)? {
            match fsutil::parse_part_name(&name, &self.suffix) {
                Some((s, e)) if s == self.subtask && e > floor => {
                    removed |= remove_if_exists(&self.staging.join(&name))?;
                }
                _ => {}
            }
        }
        if removed {
            sync_dir(&self.staging, FAULT_ABORT)?;
        }
        Ok(())
    }

    #[inline]
    fn emitted_ns(&self, record: &T) -> u64 {
        (self.emitted_ns)(record)
    }
}

/// The committed files of `target` (regular, not hidden), in name order:
/// epoch order for each subtask.
pub fn committed_files(target: &Path) -> Result<Vec<PathBuf>> {
    Ok(fsutil::list_names(target)?
        .into_iter()
        .filter(|n| !n.starts_with('.'))
        .map(|n| target.join(n))
        .filter(|p| p.is_file())
        .collect())
}
