//! Two-phase commit into a folder of files: the file example of the
//! end-to-end seeds.
//!
//! - begin: a transaction of epoch `e` is the temporary file
//!   `.part-<subtask>-<e><suffix>.tmp` in the target folder (a hidden name:
//!   readers of the target never take it for output), created at the first
//!   write (`2pc.file.write`, also before each buffer written);
//! - pre-commit: the buffer is written, the file fsynced and closed
//!   (`2pc.file.precommit.fsync`), and the target folder fsynced so that
//!   the file's name survives a crash (`2pc.file.precommit.dirsync`);
//! - commit: the file is renamed to `part-<subtask>-<e><suffix>` in the
//!   same folder (`2pc.file.commit.rename`): readers see it from then on.
//!   The rename is made durable by the folder's next fsync, at the next
//!   barrier, before that checkpoint is acknowledged: the pre-commit's
//!   (which covers the new temporary file's name and the renames in one
//!   disk wait), or `sync_commits`'s when that barrier has nothing to
//!   pre-commit (`2pc.file.commit.dirsync`). Until then the checkpoint
//!   being committed still records the transaction, and a restore from it
//!   commits it again. (On ext4 the file sync's journal commit has then
//!   carried the renames along: one folder fsync per barrier and subtask,
//!   where a hidden subfolder for temporary files cost two.)
//!   Idempotent: if the temporary file is gone and the committed one exists,
//!   the commit happened before; only the folder is fsynced again. Neither
//!   existing is an error (lost output);
//! - abort: the temporary file is deleted (`2pc.file.abort`).
//!
//! Every step runs on the sink's own thread (see [`super`]): the writes
//! and fsyncs block there, never on a worker.
//!
//! On recovery, temporary files of this subtask newer than the restored
//! checkpoint are deleted (also in [`IN_PROGRESS_DIR`], where checkpoints
//! of earlier versions recorded them; restoring those still commits them
//! from there), and a committed file newer than it (or any, for a start
//! without a checkpoint) makes the sink refuse to run.

use std::io::Write;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use weir_core::vfs::{File, OpenOptions};

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

/// The hidden subfolder where earlier versions kept transactions in
/// progress: a transaction recorded there by an older checkpoint is still
/// committed from it on restore, and recovery deletes stale ones there.
/// New transactions are hidden files in the target folder itself.
pub const IN_PROGRESS_DIR: &str = ".inprogress";

/// Bytes buffered before a write to the temporary file: 1 MiB.
const BUF_BYTES: usize = 1 << 20;

/// The handle of a file transaction, as a checkpoint records it.
///
/// Decoding one refuses file names that could reach outside the target
/// folder (absolute, with a path separator or `..`): a damaged or forged
/// checkpoint must not make a restore rename or delete other files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RecordedFileTxn")]
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

/// A [`FileTxn`] as decoded, before its names are checked.
#[derive(Deserialize)]
struct RecordedFileTxn {
    epoch: u64,
    temp: String,
    name: String,
    bytes: u64,
}

/// Whether `name` names a file directly in the target folder: not empty,
/// no path separator, no `..`, no NUL (so not absolute either).
fn is_plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && !name.contains(['/', '\\', '\0']) && !name.contains("..")
}

impl TryFrom<RecordedFileTxn> for FileTxn {
    type Error = String;

    fn try_from(r: RecordedFileTxn) -> std::result::Result<Self, String> {
        // Older versions kept the temporary file in the hidden subfolder.
        let temp_ok = match r.temp.strip_prefix(IN_PROGRESS_DIR).and_then(|t| t.strip_prefix('/')) {
            Some(rest) => is_plain_name(rest),
            None => is_plain_name(&r.temp),
        };
        for (what, name, ok) in [
            ("temporary file", &r.temp, temp_ok),
            ("file", &r.name, is_plain_name(&r.name)),
        ] {
            if !ok {
                return Err(format!(
                    "the {what} name {name:?} of the transaction of epoch {} is not a plain name in the target folder (absolute, a path separator or `..`): the checkpoint is damaged or forged",
                    r.epoch
                ));
            }
        }
        Ok(FileTxn {
            epoch: r.epoch,
            temp: r.temp,
            name: r.name,
            bytes: r.bytes,
        })
    }
}

/// [`TwoPhaseCommit`] into files in a folder; see the module docs. Wrap it
/// in a [`super::TwoPhaseCommitSink`].
pub struct FileTransactions<T, F, E> {
    target: PathBuf,
    subtask: usize,
    suffix: String,
    encode: F,
    emitted_ns: E,
    /// The temporary file being written, with its transaction's epoch.
    file: Option<(u64, File)>,
    buf: Vec<u8>,
    /// A temporary file was created in, or one renamed into, the target
    /// folder since its last fsync.
    target_dirty: bool,
    /// A transaction was pre-committed since the folder's last fsync.
    precommitted: bool,
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
            target,
            subtask,
            suffix: ".csv".into(),
            encode,
            emitted_ns,
            file: None,
            buf: Vec::new(),
            target_dirty: false,
            precommitted: false,
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
            self.target_dirty = true;
        }
        let (_, f) = self.file.as_mut().expect("opened above");
        f.write_all(&self.buf).ctx("write", &temp)?;
        self.buf.clear();
        Ok(())
    }

    /// The highest epoch of this subtask's committed files in the target.
    fn newest_committed(&self) -> Result<Option<u64>> {
        fsutil::newest_visible_part(&self.target, &self.suffix, self.subtask)
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
            temp: format!(".{name}.tmp"),
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

    /// Writes what is buffered, fsyncs and closes the file, then fsyncs
    /// the folder: the new file's name, and the renames of commits since
    /// the last barrier, in one disk wait (the sink's `sync_commits` right
    /// after then finds nothing to do).
    fn pre_commit(&mut self, txn: &mut FileTxn) -> Result<(), BoxError> {
        if txn.bytes > 0 {
            if !self.buf.is_empty() || self.file.is_none() {
                self.write_out(txn)?;
            }
            let temp = self.temp_path(txn);
            let (_, f) = self.file.take().expect("written above");
            self.precommitted = true;
            fault(FAULT_PRECOMMIT_FSYNC, "fsync", &temp)?;
            f.sync_data().ctx("fsync", &temp)?;
        }
        self.sync_commits()
    }

    fn commit(&mut self, txn: &FileTxn) -> Result<(), BoxError> {
        if txn.bytes == 0 {
            return Ok(());
        }
        let temp = self.temp_path(txn);
        let target = self.target.join(&txn.name);
        fault(FAULT_COMMIT_RENAME, "rename into place", &temp)?;
        match weir_core::vfs::rename(&temp, &target) {
            Ok(()) => {}
            // Committed before: the rename happened, maybe not its fsync.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && weir_core::vfs::exists(&target) => {}
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

    /// The target folder's fsync, if a temporary file was created or a
    /// commit renamed since the last.
    fn sync_commits(&mut self) -> Result<(), BoxError> {
        // The fault point says which step of the protocol this is: the
        // pre-commit's (a new file's name) or only the commits'.
        let point = if std::mem::take(&mut self.precommitted) {
            FAULT_PRECOMMIT_DIRSYNC
        } else {
            FAULT_COMMIT_DIRSYNC
        };
        if !std::mem::take(&mut self.target_dirty) {
            return Ok(());
        }
        Ok(sync_dir(&self.target, point)?)
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
        // Temporary files of this subtask after the restored checkpoint:
        // hidden names in the target, or the older versions' subfolder.
        let legacy = self.target.join(IN_PROGRESS_DIR);
        for (dir, hidden) in [(&self.target, true), (&legacy, false)] {
            if !hidden && !weir_core::vfs::exists(dir) {
                continue;
            }
            let mut removed = false;
            for name in fsutil::list_names(dir)? {
                let part = if hidden {
                    name.strip_prefix('.').and_then(|n| n.strip_suffix(".tmp"))
                } else {
                    name.strip_suffix(".tmp")
                };
                match part.and_then(|n| fsutil::parse_part_name(n, &self.suffix)) {
                    Some((s, e)) if s == self.subtask && e > floor => {
                        removed |= remove_if_exists(&dir.join(&name))?;
                    }
                    _ => {}
                }
            }
            if removed {
                sync_dir(dir, FAULT_ABORT)?;
            }
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
        .filter(|p| weir_core::vfs::metadata(p).is_ok_and(|m| !m.is_dir()))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sink(target: &Path) -> FileTransactions<u32, impl Fn(&u32, &mut Vec<u8>), impl Fn(&u32) -> u64> {
        FileTransactions::new(
            target,
            0,
            |r: &u32, out: &mut Vec<u8>| writeln!(out, "{r}").unwrap(),
            |_: &u32| 0,
        )
    }

    /// A recorded transaction whose file names could reach outside the
    /// target folder is refused when the checkpoint is decoded: `..`, a
    /// path separator, an absolute path; the legacy subfolder still works.
    #[test]
    fn recorded_names_outside_the_target_are_refused() {
        let txn = |temp: &str, name: &str| FileTxn {
            epoch: 3,
            temp: temp.into(),
            name: name.into(),
            bytes: 1,
        };
        let decode = |t: &FileTxn| {
            let state = crate::twophase::encode_state(&crate::twophase::RecordedRef {
                pending: vec![(3, t)],
                open: None,
            })
            .unwrap();
            crate::twophase::decode_state::<FileTxn>(3, &state).map(|_| ())
        };
        decode(&txn(".part-000-000000003.csv.tmp", "part-000-000000003.csv")).unwrap();
        decode(&txn(".inprogress/part-000-000000003.csv.tmp", "part-000-000000003.csv")).unwrap();
        for (temp, name) in [
            ("../x.tmp", "part.csv"),
            ("x.tmp", "../../etc/passwd"),
            ("x.tmp", "/etc/passwd"),
            ("/tmp/x.tmp", "part.csv"),
            ("sub/x.tmp", "part.csv"),
            ("x.tmp", "a\\b"),
            (".inprogress/../x.tmp", "part.csv"),
            ("x.tmp", ".."),
            ("x.tmp", ""),
        ] {
            let e = decode(&txn(temp, name)).unwrap_err().to_string();
            // postcard reports a refusal from `TryFrom` without its text.
            assert!(e.contains("cannot decode the transactions"), "{temp} {name}: {e}");
            assert!(e.contains("checkpoint 3"), "{e}");
        }
    }

    /// A transaction is a hidden file in the target folder until its
    /// commit renames it; one recorded by an older version in the hidden
    /// subfolder is still committed from there.
    #[test]
    fn transactions_are_hidden_files_in_the_target_and_older_ones_commit_from_the_subfolder() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("out");
        let mut s = sink(&target);
        s.recover(None).unwrap();
        let mut txn = s.begin_transaction(1).unwrap();
        assert_eq!(txn.temp, ".part-000-000000001.csv.tmp");
        s.write(&mut txn, &mut vec![1, 2]).unwrap();
        s.pre_commit(&mut txn).unwrap();
        assert!(committed_files(&target).unwrap().is_empty());
        s.commit(&txn).unwrap();
        s.sync_commits().unwrap();
        let files = committed_files(&target).unwrap();
        assert_eq!(files, vec![target.join("part-000-000000001.csv")]);
        assert_eq!(std::fs::read_to_string(&files[0]).unwrap(), "1\n2\n");

        // As an older version recorded it: the temporary file in the
        // subfolder, committed on restore.
        let legacy = target.join(IN_PROGRESS_DIR);
        std::fs::create_dir_all(&legacy).unwrap();
        std::fs::write(legacy.join("part-000-000000002.csv.tmp"), "3\n").unwrap();
        let old = FileTxn {
            epoch: 2,
            temp: format!("{IN_PROGRESS_DIR}/part-000-000000002.csv.tmp"),
            name: "part-000-000000002.csv".into(),
            bytes: 2,
        };
        let mut s = sink(&target);
        s.recover(Some(2)).unwrap();
        s.commit(&old).unwrap();
        s.sync_commits().unwrap();
        assert_eq!(
            std::fs::read_to_string(target.join("part-000-000000002.csv")).unwrap(),
            "3\n"
        );
    }

    /// Recovery deletes this subtask's temporary files after the restored
    /// checkpoint, hidden in the target or in the older subfolder, and
    /// nothing else.
    #[test]
    fn recovery_deletes_only_this_subtasks_newer_temporary_files() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("out");
        let legacy = target.join(IN_PROGRESS_DIR);
        std::fs::create_dir_all(&legacy).unwrap();
        let keep = [
            target.join("part-000-000000003.csv"),      // committed
            target.join(".part-000-000000003.csv.tmp"), // at the restored epoch
            target.join(".part-001-000000009.csv.tmp"), // another subtask's
            target.join(".notes.tmp"),                  // not a part
            legacy.join("part-001-000000009.csv.tmp"),  // another subtask's
        ];
        let gone = [
            target.join(".part-000-000000004.csv.tmp"),
            legacy.join("part-000-000000005.csv.tmp"),
        ];
        for p in keep.iter().chain(&gone) {
            std::fs::write(p, "x\n").unwrap();
        }
        sink(&target).recover(Some(3)).unwrap();
        for p in &keep {
            assert!(p.exists(), "{} kept", p.display());
        }
        for p in &gone {
            assert!(!p.exists(), "{} deleted", p.display());
        }
    }
}
