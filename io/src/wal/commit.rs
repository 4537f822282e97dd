//! Committing closed epochs of a WAL sink subtask: their output files,
//! the commit marker and the deletion of committed segments, on the
//! subtask's committer thread (a restore commits on its own thread).
//!
//! [`Committer`] does one commit: for each epoch, in order, a hidden
//! temporary file in the target folder gets the epoch's output (kept in
//! memory, or read back from the log and verified) and is fsynced; then all
//! of them are renamed into place, the folder is fsynced once, the marker
//! records the commit, and segments wholly before it are deleted.
//!
//! [`CommitIo`] is the committer thread's handler (see
//! [`weir_core::io_thread`]), so that the fsyncs of a commit overlap with
//! the sink's writes instead of stalling its worker. At most
//! [`QUEUED_COMMITS`] commits are in flight; a commit that fails stops the
//! thread, and the sink reports the failure at its next call. Dropping the
//! sink waits for the commit in progress.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use weir_core::io_thread::{IoHandler, Ticket};
use weir_core::{clock, BoxError, SyncJob};

use super::codec::{self, WalPos};
use super::log::{segment_path, LogReader};
use super::marker::{Committed, Marker};
use super::{FAULT_COMMIT_DELETE, FAULT_COMMIT_DIRSYNC, FAULT_COMMIT_FSYNC, FAULT_COMMIT_RENAME, FAULT_COMMIT_WRITE};
use crate::error::IoContext;
use crate::fsutil::{self, create_dir_durable, fault, remove_if_exists, sync_dir};
use crate::latency::StampRuns;
use crate::{Error, Result};

/// Bytes of committed output written to a file at once: 1 MiB.
const OUT_CHUNK: usize = 1 << 20;

/// Commits in flight on the committer thread beyond which the sink holds
/// further commits back (merged into one) and says it is not ready: 4.
/// Bounds the memory of closed epochs (their stamps, and output kept in
/// memory); a committer this far behind means the target is slower than
/// the input, and the task is backpressured.
pub const QUEUED_COMMITS: usize = 4;

/// An epoch closed by a barrier, not yet committed.
#[derive(Debug)]
pub(super) struct Closed {
    pub(super) tag: u64,
    /// Log position after its last record; the epoch starts where the
    /// previous one ends (or at the commit marker's position).
    pub(super) end: WalPos,
    /// Its output bytes, if they were kept in memory.
    pub(super) payload: Option<Vec<u8>>,
    pub(super) stamps: StampRuns,
    /// The log thread's ticket of the sync that makes its records durable
    /// (0: durable already, found by a restore).
    pub(super) sync: Ticket,
}

/// The committed output of one commit being written.
#[derive(Debug)]
struct Parts {
    target: PathBuf,
    subtask: usize,
    suffix: String,
    out: Vec<u8>,
    /// The epoch being written: its file and temporary path.
    current: Option<(u64, File, PathBuf)>,
    /// Epochs written and fsynced, waiting to be renamed: (epoch, temp).
    written: Vec<(u64, PathBuf)>,
    /// When the last `publish` renamed its files into place: the moment
    /// readers could see them (the folder fsync and the marker follow).
    published_ns: u64,
}

impl Parts {
    fn begin(&mut self, epoch: u64) -> Result<()> {
        let name = fsutil::part_name(self.subtask, epoch, &self.suffix);
        let temp = self.target.join(format!(".{name}.tmp"));
        fault(FAULT_COMMIT_WRITE, "create", &temp)?;
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&temp)
            .ctx("create", &temp)?;
        self.out.clear();
        self.current = Some((epoch, file, temp));
        Ok(())
    }

    #[inline]
    fn write(&mut self, payload: &[u8]) -> Result<()> {
        self.out.extend_from_slice(payload);
        if self.out.len() >= OUT_CHUNK {
            self.write_out()?;
        }
        Ok(())
    }

    /// Writes a whole epoch's bytes, kept in memory, at once.
    fn write_all(&mut self, bytes: &[u8]) -> Result<()> {
        self.write_out()?;
        let (_, file, temp) = self.current.as_mut().expect("writing inside an epoch");
        file.write_all(bytes).ctx("write", temp)
    }

    fn write_out(&mut self) -> Result<()> {
        let (_, file, temp) = self.current.as_mut().expect("writing inside an epoch");
        file.write_all(&self.out).ctx("write", temp)?;
        self.out.clear();
        Ok(())
    }

    /// Ends the current epoch's file: written out and fsynced.
    fn end(&mut self) -> Result<()> {
        self.write_out()?;
        let (epoch, file, temp) = self.current.take().expect("ending an epoch");
        fault(FAULT_COMMIT_FSYNC, "fsync", &temp)?;
        weir_core::disk::sync_data(&file).ctx("fsync", &temp)?;
        self.written.push((epoch, temp));
        Ok(())
    }

    /// Renames every written epoch into place and fsyncs the folder;
    /// returns the epochs.
    fn publish(&mut self) -> Result<Vec<u64>> {
        for (epoch, temp) in &self.written {
            let target = self.target.join(fsutil::part_name(self.subtask, *epoch, &self.suffix));
            fault(FAULT_COMMIT_RENAME, "rename into place", temp)?;
            std::fs::rename(temp, &target).ctx(&format!("rename to {}", target.display()), temp)?;
        }
        self.published_ns = clock::now_ns();
        if !self.written.is_empty() {
            sync_dir(&self.target, FAULT_COMMIT_DIRSYNC)?;
        }
        Ok(self.written.drain(..).map(|(e, _)| e).collect())
    }
}

/// Everything a commit touches: the target, the marker, the log (read).
#[derive(Debug)]
pub(super) struct Committer {
    dir: PathBuf,
    subtask: usize,
    marker: Marker,
    /// What the marker records.
    pub(super) committed: Committed,
    /// Segments before this one were deleted.
    oldest_seg: u64,
    reader: LogReader,
    parts: Parts,
}

impl Committer {
    /// A committer for the log in `dir` whose marker records `committed`.
    pub(super) fn new(
        dir: PathBuf,
        subtask: usize,
        target: PathBuf,
        suffix: String,
        marker: Marker,
        committed: Committed,
    ) -> Self {
        Committer {
            dir,
            subtask,
            marker,
            committed,
            oldest_seg: committed.pos.seg,
            reader: LogReader::default(),
            parts: Parts {
                target,
                subtask,
                suffix,
                out: Vec::with_capacity(OUT_CHUNK + (OUT_CHUNK >> 2)),
                current: None,
                written: Vec::new(),
                published_ns: 0,
            },
        }
    }

    /// Commits `epochs` (closed, in log order, the first starting at the
    /// marker's position) and records `n` in the marker; returns the
    /// epochs that got a file.
    pub(super) fn commit(&mut self, n: u64, epochs: &[Closed]) -> Result<Vec<u64>> {
        let Some(last) = epochs.last() else {
            return Ok(Vec::new());
        };
        let to = last.end;
        self.parts.current = None;
        self.parts.written.clear();
        let mut start = self.committed.pos;
        for c in epochs {
            debug_assert!(c.tag <= n && c.tag > self.committed.epoch);
            self.parts.begin(c.tag)?;
            match &c.payload {
                Some(bytes) => self.parts.write_all(bytes)?,
                None => {
                    // Not in memory: read the epoch back from the log, verified.
                    let (dir, parts, tag) = (&self.dir, &mut self.parts, c.tag);
                    self.reader
                        .read_range(dir, self.subtask as u32, start, c.end, |t, payload, end| {
                            if t != tag {
                                let at = end.off - (codec::HEADER_BYTES + payload.len()) as u64;
                                return Err(Error::corrupt(
                                    "WAL record",
                                    &segment_path(dir, end.seg),
                                    at,
                                    format!("a record of epoch {t} among those of epoch {tag}"),
                                ));
                            }
                            parts.write(payload)
                        })?;
                }
            }
            self.parts.end()?;
            start = c.end;
        }
        let files = self.parts.publish()?;
        let value = Committed { epoch: n, pos: to };
        self.marker.write(value)?;
        self.committed = value;
        self.delete_segments_before(to.seg)?;
        Ok(files)
    }

    /// When the last commit's files became visible (renamed into the
    /// target, before the folder fsync and the marker that make the commit
    /// durable).
    pub(super) fn visible_ns(&self) -> u64 {
        self.parts.published_ns
    }

    /// Deletes the segments before `seg`: all their records are committed.
    fn delete_segments_before(&mut self, seg: u64) -> Result<()> {
        if self.oldest_seg >= seg {
            return Ok(());
        }
        // Safe while the log thread appends: this runs for a completed
        // checkpoint (or at the end, after the log sync that `after`
        // waited for), so every append to a segment before `seg` (the one
        // the commit's last epoch ends in) was submitted before that sync
        // and handled before it completed; the log thread only ever moves
        // on to later segments, and never touches these again.
        fault(FAULT_COMMIT_DELETE, "delete committed WAL segments in", &self.dir)?;
        for s in self.oldest_seg..seg {
            remove_if_exists(&segment_path(&self.dir, s))?;
        }
        // Not fsynced: a deleted segment that reappears after a crash lies
        // before the marker's position and is never read; the next delete
        // or restore removes it again.
        self.oldest_seg = seg;
        Ok(())
    }
}

/// What the sink's worker asks of its committer thread ([`CommitIo`]).
pub(super) enum CommitRequest {
    /// The committer half of a start without a checkpoint: create the
    /// target folder, remove this subtask's temporaries, open the marker,
    /// and refuse ([`Error::TargetAhead`]) if it shows committed output.
    Start,
    /// Commit `epochs` (closed, in log order, the first starting at the
    /// marker's position) and record checkpoint `n` in the marker, once
    /// `after` (the log sync that made their records durable) succeeded.
    Commit {
        n: u64,
        epochs: Vec<Closed>,
        after: Option<SyncJob>,
    },
}

/// What the committer thread hands back, in request order.
pub(super) enum CommitReply {
    Started,
    /// The epochs committed, for their buffers and stamps, and when their
    /// output became visible.
    Committed {
        n: u64,
        epochs: Vec<Closed>,
        visible_ns: u64,
    },
}

/// Where a fresh start puts things, for the committer thread.
#[derive(Debug)]
pub(super) struct Fresh {
    pub(super) dir: PathBuf,
    pub(super) subtask: usize,
    pub(super) target: PathBuf,
    pub(super) suffix: String,
}

/// The committer thread of one WAL sink subtask: owns the [`Committer`]
/// (the target, the marker; it reads the log and deletes committed
/// segments).
#[derive(Debug)]
pub(super) enum CommitIo {
    /// Started by a restore, which opened the marker on its own thread.
    Ready(Box<Committer>),
    /// Waiting for [`CommitRequest::Start`].
    Fresh(Fresh),
}

impl CommitIo {
    fn start(f: &Fresh) -> Result<Committer> {
        create_dir_durable(&f.target)?;
        remove_temporaries(&f.target, &f.suffix, f.subtask)?;
        let (marker, committed) = Marker::open(f.dir.join("committed"))?;
        if let Some(c) = committed.filter(|c| c.epoch > 0) {
            return Err(Error::TargetAhead {
                sink: "wal",
                subtask: f.subtask,
                target: f.target.display().to_string(),
                committed: c.epoch,
                restored: None,
            });
        }
        let start = Committed {
            epoch: 0,
            pos: WalPos {
                seg: 1,
                off: codec::SEGMENT_HEADER_BYTES as u64,
            },
        };
        Ok(Committer::new(
            f.dir.clone(),
            f.subtask,
            f.target.clone(),
            f.suffix.clone(),
            marker,
            start,
        ))
    }
}

impl IoHandler for CommitIo {
    type Request = CommitRequest;
    type Reply = CommitReply;

    fn handle(&mut self, request: CommitRequest) -> std::result::Result<CommitReply, BoxError> {
        match request {
            CommitRequest::Start => {
                if let CommitIo::Fresh(f) = self {
                    *self = CommitIo::Ready(Box::new(Self::start(f)?));
                }
                Ok(CommitReply::Started)
            }
            CommitRequest::Commit { n, epochs, after } => {
                let CommitIo::Ready(c) = self else {
                    return Err("a commit before the committer started".into());
                };
                let subtask = c.subtask;
                if let Some(after) = after {
                    after().map_err(|e| -> BoxError {
                        format!(
                            "WAL sink subtask {subtask}: checkpoint {n} not committed: the log sync it needs failed: {e}"
                        )
                        .into()
                    })?;
                }
                c.commit(n, &epochs).map_err(|e| -> BoxError {
                    format!("WAL sink subtask {subtask}: commit of checkpoint {n} failed: {e}").into()
                })?;
                Ok(CommitReply::Committed {
                    n,
                    epochs,
                    visible_ns: c.visible_ns(),
                })
            }
        }
    }
}

/// Removes the hidden temporary files of `subtask` from `target`: the
/// leftovers of a commit cut short, which a commit writes anew.
pub(super) fn remove_temporaries(target: &Path, suffix: &str, subtask: usize) -> Result<()> {
    for name in fsutil::list_names(target)? {
        if name.starts_with('.') && name.ends_with(".tmp") {
            if let Some((s, _)) = fsutil::parse_part_name(&name, suffix) {
                if s == subtask {
                    remove_if_exists(&target.join(&name))?;
                }
            }
        }
    }
    Ok(())
}
