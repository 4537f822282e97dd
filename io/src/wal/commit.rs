//! Committing closed epochs of a WAL sink subtask: their output files,
//! the commit marker and the deletion of committed segments; inline on the
//! sink's thread, or on a background committer thread.
//!
//! [`Committer`] does one commit: for each epoch, in order, a hidden
//! temporary file in the target folder gets the epoch's output (kept in
//! memory, or read back from the log and verified) and is fsynced; then all
//! of them are renamed into place, the folder is fsynced once, the marker
//! records the commit, and segments wholly before it are deleted.
//!
//! [`Committing::Background`] runs the same on a thread of its own, so that
//! the fsyncs of a commit overlap with the sink's writes instead of
//! stalling its worker. At most [`QUEUED_COMMITS`] commits wait; a commit
//! that fails stops the thread, and the sink reports the failure at its
//! next call. Dropping the sink waits for the commit in progress.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::thread::JoinHandle;

use weir_core::clock;

use super::codec::{self, WalPos};
use super::log::{segment_path, LogReader};
use super::marker::{Committed, Marker};
use super::{FAULT_COMMIT_DELETE, FAULT_COMMIT_DIRSYNC, FAULT_COMMIT_FSYNC, FAULT_COMMIT_RENAME, FAULT_COMMIT_WRITE};
use crate::error::IoContext;
use crate::fsutil::{self, fault, remove_if_exists, sync_dir};
use crate::latency::StampRuns;
use crate::{Error, Result};

/// Bytes of committed output written to a file at once: 1 MiB.
const OUT_CHUNK: usize = 1 << 20;

/// Commits queued for the background committer before `commit` waits: 4.
/// Bounds the memory of epochs in flight; a committer this far behind means
/// the target is slower than the input.
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

/// A commit handed to the background committer.
struct Job {
    n: u64,
    epochs: Vec<Closed>,
}

/// A commit done (or failed), handed back with its epochs for recycling.
pub(super) struct Done {
    pub(super) n: u64,
    pub(super) result: Result<Vec<u64>>,
    pub(super) epochs: Vec<Closed>,
    /// When the output became visible.
    pub(super) visible_ns: u64,
}

/// Where commits run.
pub(super) enum Committing {
    /// On the sink's thread, inside `commit`.
    Inline(Box<Committer>),
    /// On a committer thread.
    Background(Background),
}

impl std::fmt::Debug for Committing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Committing::Inline(c) => f.debug_tuple("Inline").field(c).finish(),
            Committing::Background(b) => write!(f, "Background({} in flight)", b.in_flight),
        }
    }
}

/// The handle of a committer thread.
pub(super) struct Background {
    jobs: Option<SyncSender<Job>>,
    done: Receiver<Done>,
    thread: Option<JoinHandle<()>>,
    /// Commits sent and not yet reported done.
    pub(super) in_flight: usize,
}

impl Background {
    /// Starts a committer thread for `committer`.
    pub(super) fn start(mut committer: Committer) -> Result<Self> {
        let (job_tx, job_rx) = mpsc::sync_channel::<Job>(QUEUED_COMMITS);
        let (done_tx, done_rx) = mpsc::channel::<Done>();
        let name = format!("weir-wal-commit-{}", committer.subtask);
        let dir = committer.dir.clone();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                for job in job_rx {
                    let result = committer.commit(job.n, &job.epochs);
                    let failed = result.is_err();
                    let done = Done {
                        n: job.n,
                        result,
                        epochs: job.epochs,
                        visible_ns: committer.visible_ns(),
                    };
                    if done_tx.send(done).is_err() || failed {
                        return;
                    }
                }
            })
            .map_err(|e| Error::io("start a committer thread for", &dir, e))?;
        Ok(Background {
            jobs: Some(job_tx),
            done: done_rx,
            thread: Some(thread),
            in_flight: 0,
        })
    }

    /// Queues a commit; waits while [`QUEUED_COMMITS`] are queued.
    pub(super) fn send(&mut self, n: u64, epochs: Vec<Closed>) -> Result<()> {
        let sent = self.jobs.as_ref().map(|j| j.send(Job { n, epochs }));
        match sent {
            Some(Ok(())) => {
                self.in_flight += 1;
                Ok(())
            }
            _ => Err(Error::io(
                "queue a commit for",
                std::path::Path::new("the committer thread"),
                std::io::Error::other("the committer thread stopped after a failed commit"),
            )),
        }
    }

    /// The next finished commit: waits for one if `wait`, else only takes
    /// one that is ready.
    pub(super) fn next(&mut self, wait: bool) -> Option<Done> {
        if self.in_flight == 0 {
            return None;
        }
        let done = if wait {
            self.done.recv().ok()
        } else {
            self.done.try_recv().ok()
        };
        if done.is_some() {
            self.in_flight -= 1;
        }
        done
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        // Closing the queue ends the thread after the commit in progress.
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
