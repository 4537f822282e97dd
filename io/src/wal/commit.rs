//! Committing closed epochs of a WAL sink subtask: their output, the
//! target's record of the commit and the deletion of committed segments,
//! on the subtask's committer thread (a restore commits on its own thread).
//!
//! [`Committer`] does one commit: each epoch, in order, goes to the
//! [`EpochTarget`] (its records kept in memory, or read back from the log
//! and verified); the target publishes them and records the commit (for
//! files: renames; the folder fsync and the marker follow lazily, see
//! [`EpochTarget::LAZY_RECORD`] and [`RECORD_INTERVAL_MS`]); once the
//! record is durable, segments wholly before it are deleted.
//!
//! [`CommitIo`] is the committer thread's handler (see
//! [`weir_core::io_thread`]), so that the fsyncs of a commit overlap with
//! the sink's writes instead of stalling its worker. At most
//! [`EpochTarget::COMMITS_IN_FLIGHT`] commits are in flight (checkpoints
//! completed meanwhile are held back and merged into the next); a
//! commit that fails stops the
//! thread, and the sink reports the failure at its next call. Dropping the
//! sink waits for the commit in progress.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use weir_core::io_thread::{IoHandler, Ticket};
use weir_core::{clock, BoxError, SyncJob};

use super::codec::{self, WalPos};
use super::log::{segment_path, LogReader};
use super::marker::Committed;
use super::target::EpochTarget;
use super::FAULT_COMMIT_DELETE;
use crate::fsutil::{self, fault, remove_if_exists};
use crate::latency::StampRuns;
use crate::{Error, Result};

/// Commits in flight on the committer thread, by default (see
/// [`EpochTarget::COMMITS_IN_FLIGHT`]), beyond which the sink holds
/// further completed checkpoints back and merges them into one commit: 4.
/// Four let a target whose commits are cheap (files) overlap them with
/// the sink's next barriers; the memory of closed epochs stays bounded by
/// [`MAX_EPOCHS_PER_COMMIT`] held back behind them (then the task is
/// backpressured).
pub const QUEUED_COMMITS: usize = 4;

/// Epochs one publish of a commit holds at most, by default: 64 (see
/// [`EpochTarget::MAX_EPOCHS_PER_COMMIT`]). Bounds the closed epochs a
/// sink holds back for one commit (their stamps and buffers), and so the
/// work of one publish: enough for 640 ms of checkpoints at a 10 ms
/// interval, far more than a publish takes.
pub const MAX_EPOCHS_PER_COMMIT: usize = 64;

/// How long the record of a commit may stay not durable, for a target
/// with [`EpochTarget::LAZY_RECORD`] (files): 1 s. The committer syncs the
/// record (files: the folder and the marker, two fsyncs) at the first
/// commit this long after the last sync, besides when a log segment could
/// be deleted and at the end; at 100 checkpoints a second that is two
/// fsyncs a second instead of two per commit. What it bounds: the epochs
/// a restore publishes again after a crash (a second of output, read
/// back from the log) and the log kept for them.
pub const RECORD_INTERVAL_MS: u64 = 1_000;

/// An epoch closed by a barrier, not yet committed.
#[derive(Debug)]
pub(super) struct Closed {
    pub(super) tag: u64,
    /// Log position after its last record; the epoch starts where the
    /// previous one ends (or at the commit marker's position).
    pub(super) end: WalPos,
    /// Its output bytes, if they were kept in memory (and not handed to
    /// the committer thread to stage).
    pub(super) payload: Option<Vec<u8>>,
    /// Bytes of output the target staged for it ahead of its commit
    /// ([`CommitRequest::Stage`]); `None`: not staged.
    pub(super) staged: Option<u64>,
    pub(super) stamps: StampRuns,
    /// The log thread's ticket of the sync that makes its records durable
    /// (0: durable already, found by a restore).
    pub(super) sync: Ticket,
}

/// How far a committer got: what it published, and its last durable
/// record. A failed instance leaves it to its replacement's restore in the
/// same process ([`weir_core::carry`]), which then reads the log from
/// `published` on instead of from the record (up to
/// [`RECORD_INTERVAL_MS`] of log), once it agrees with the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Progress {
    /// Every epoch through this one is published (visible), the record of
    /// it not necessarily durable.
    pub(super) published: Committed,
    /// The last record known durable.
    pub(super) recorded: Committed,
}

/// The committer's [`Progress`], shared with its sink (set once it
/// started).
pub(super) type SharedProgress = Arc<Mutex<Option<Progress>>>;

/// Everything a commit touches: the target (which records the commit),
/// the log (read).
#[derive(Debug)]
pub(super) struct Committer<G> {
    dir: PathBuf,
    pub(super) subtask: usize,
    target: G,
    /// What the target records as committed.
    pub(super) committed: Committed,
    /// The last record known durable: `committed`, or an earlier one while
    /// the target's record is lazy ([`EpochTarget::LAZY_RECORD`]).
    recorded: Committed,
    /// When `recorded` was made durable ([`clock`] nanoseconds).
    recorded_ns: u64,
    /// Segments before this one were deleted.
    oldest_seg: u64,
    reader: LogReader,
    /// Publishes done (one per chunk of a commit).
    publishes: u64,
    /// `committed` and `recorded`, for the sink.
    progress: SharedProgress,
}

impl<G: EpochTarget> Committer<G> {
    /// A committer for the log in `dir` into `target` (opened), which
    /// records `committed`; it keeps `progress` up to date.
    pub(super) fn new(dir: PathBuf, subtask: usize, target: G, committed: Committed, progress: SharedProgress) -> Self {
        Self::resume(
            dir,
            subtask,
            target,
            Progress {
                published: committed,
                recorded: committed,
            },
            progress,
        )
    }

    /// [`Committer::new`] for a restore that continues where a failed
    /// instance of this process left ([`Progress`]): epochs through
    /// `at.published` are published, their record durable only through
    /// `at.recorded`; the target is told, so that its next record makes
    /// them durable ([`EpochTarget::resume_unrecorded`]).
    pub(super) fn resume(dir: PathBuf, subtask: usize, mut target: G, at: Progress, progress: SharedProgress) -> Self {
        if at.published != at.recorded {
            target.resume_unrecorded(at.published);
        }
        let c = Committer {
            dir,
            subtask,
            target,
            committed: at.published,
            recorded: at.recorded,
            recorded_ns: clock::now_ns(),
            oldest_seg: at.recorded.pos.seg,
            reader: LogReader::default(),
            publishes: 0,
            progress,
        };
        c.share();
        c
    }

    /// Tells the sink how far this committer got.
    fn share(&self) {
        *self.progress.lock().unwrap_or_else(|p| p.into_inner()) = Some(Progress {
            published: self.committed,
            recorded: self.recorded,
        });
    }

    /// Commits `epochs` (closed, in log order, the first starting at the
    /// marker's position) and records `n` in the marker; returns the
    /// epochs that got output. With `durable`, the record is durable when
    /// this returns, whatever the target's [`EpochTarget::LAZY_RECORD`].
    ///
    /// The epochs are published in chunks of at most
    /// [`EpochTarget::MAX_EPOCHS_PER_COMMIT`] epochs, a chunk ending at the
    /// first epoch that brings it to [`EpochTarget::MAX_BYTES_PER_COMMIT`]
    /// bytes: one publish (for Kafka, one transaction) per chunk. A chunk
    /// records its last epoch and where that epoch ends in the log; the
    /// last chunk records `n`. Each record is "every epoch up to here is
    /// published", true when it is written (the chunks go in log order),
    /// and it only grows, so a crash between two chunks leaves a record
    /// that a restore continues from, as after any commit.
    pub(super) fn commit(&mut self, n: u64, epochs: &[Closed], durable: bool) -> Result<Vec<u64>> {
        let mut published = Vec::new();
        let mut start = self.committed.pos;
        let (mut chunk_epochs, mut chunk_bytes) = (0usize, 0u64);
        for (i, c) in epochs.iter().enumerate() {
            debug_assert!(c.tag <= n && c.tag > self.committed.epoch);
            if let Some(bytes) = c.staged {
                // Written and synced by the target ahead of the commit
                // (`stage`): published below like the others.
                chunk_bytes += bytes;
            } else {
                self.write_epoch(c, start, &mut chunk_bytes)?;
            }
            start = c.end;
            chunk_epochs += 1;
            let last = i + 1 == epochs.len();
            if last || chunk_epochs >= G::MAX_EPOCHS_PER_COMMIT || chunk_bytes >= G::MAX_BYTES_PER_COMMIT {
                let value = Committed {
                    epoch: if last { n } else { c.tag },
                    pos: c.end,
                };
                published.extend(self.target.publish(value)?);
                self.committed = value;
                self.publishes += 1;
                self.share();
                if !G::LAZY_RECORD || self.record_due() {
                    self.record()?;
                }
                (chunk_epochs, chunk_bytes) = (0, 0);
            }
        }
        if durable {
            self.record()?;
        }
        Ok(published)
    }

    /// Whether a lazy record should be made durable now: a log segment
    /// could be deleted, or [`RECORD_INTERVAL_MS`] passed since the last.
    fn record_due(&self) -> bool {
        self.committed.pos.seg > self.recorded.pos.seg
            || clock::now_ns().saturating_sub(self.recorded_ns) >= RECORD_INTERVAL_MS * 1_000_000
    }

    /// Makes the record of the last commit durable (the target's
    /// [`EpochTarget::sync_record`]), then deletes the segments before it.
    pub(super) fn record(&mut self) -> Result<()> {
        if self.recorded != self.committed {
            self.target.sync_record()?;
            self.recorded = self.committed;
            self.share();
        }
        self.recorded_ns = clock::now_ns();
        self.delete_segments_before(self.recorded.pos.seg)
    }

    /// Writes epoch `payload`'s output to the target ahead of its commit
    /// (begin, write, end: for files, written and synced under a hidden
    /// name); a later [`Committer::commit`] of epoch `tag` publishes it.
    /// For a target with [`EpochTarget::STAGES`] only.
    pub(super) fn stage(&mut self, tag: u64, payload: &[u8]) -> Result<()> {
        debug_assert!(G::STAGES && tag > self.committed.epoch);
        self.target.begin(tag)?;
        self.target.write(payload)?;
        self.target.end()
    }

    /// Begins, writes and ends epoch `c`, which starts at log position
    /// `start`: from memory, or read back from the log and verified.
    fn write_epoch(&mut self, c: &Closed, start: WalPos, chunk_bytes: &mut u64) -> Result<()> {
        self.target.begin(c.tag)?;
        match &c.payload {
            Some(bytes) => {
                *chunk_bytes += bytes.len() as u64;
                self.target.write(bytes)?
            }
            None => {
                // Not in memory: read the epoch back from the log, verified.
                let (dir, target, tag) = (&self.dir, &mut self.target, c.tag);
                let bytes = chunk_bytes;
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
                        *bytes += payload.len() as u64;
                        target.write(payload)
                    })?;
            }
        }
        self.target.end()
    }

    /// Publishes done so far (one per chunk of a commit).
    pub(super) fn publishes(&self) -> u64 {
        self.publishes
    }

    /// When the last commit's output became visible (for files: renamed
    /// into the target, before the folder fsync and the marker that make
    /// the commit durable).
    pub(super) fn visible_ns(&self) -> u64 {
        self.target.visible_ns()
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
    /// The committer half of a start without a checkpoint: open the
    /// target and refuse ([`Error::TargetAhead`]) if it records committed
    /// output.
    Start,
    /// Stage epoch `tag` (closed, its checkpoint not complete yet): the
    /// target writes and syncs `payload` as that epoch's output, which a
    /// later commit of the epoch only publishes (files: renames). For a
    /// target with [`EpochTarget::STAGES`].
    Stage { tag: u64, payload: Vec<u8> },
    /// Commit `epochs` (closed, in log order, the first starting at the
    /// marker's position) and record checkpoint `n` in the marker, once
    /// `after` (the log sync that made their records durable) succeeded.
    Commit {
        n: u64,
        epochs: Vec<Closed>,
        after: Option<SyncJob>,
    },
    /// Make the record of the last commit durable now (at the end of the
    /// input: a lazy record, [`EpochTarget::LAZY_RECORD`], is not left
    /// behind).
    Record,
}

/// What the committer thread hands back, in request order.
pub(super) enum CommitReply {
    Started,
    /// The record of the last commit is durable.
    Recorded,
    /// An epoch was staged; its buffer comes back.
    Staged {
        payload: Vec<u8>,
    },
    /// The epochs committed, for their buffers and stamps, and when their
    /// output became visible.
    Committed {
        n: u64,
        epochs: Vec<Closed>,
        visible_ns: u64,
        /// The committer's publishes so far.
        publishes: u64,
    },
}

/// Where a fresh start puts things, for the committer thread.
#[derive(Debug)]
pub(super) struct Fresh<G> {
    pub(super) dir: PathBuf,
    pub(super) subtask: usize,
    /// Not opened yet.
    pub(super) target: Option<G>,
    pub(super) progress: SharedProgress,
}

/// The committer thread of one WAL sink subtask: owns the [`Committer`]
/// (the target; it reads the log and deletes committed segments).
#[derive(Debug)]
pub(super) enum CommitIo<G> {
    /// Started by a restore, which opened the target on its own thread.
    Ready(Box<Committer<G>>),
    /// Waiting for [`CommitRequest::Start`].
    Fresh(Fresh<G>),
}

impl<G: EpochTarget> CommitIo<G> {
    fn start(f: &mut Fresh<G>) -> Result<Committer<G>> {
        let mut target = f.target.take().expect("a fresh start happens once");
        let committed = target.open()?;
        let newest = committed
            .map_or(0, |c| c.epoch)
            .max(target.newest_output().unwrap_or(0));
        if newest > 0 {
            return Err(Error::TargetAhead {
                sink: target.kind(),
                subtask: f.subtask,
                target: target.describe(),
                committed: newest,
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
            target,
            start,
            f.progress.clone(),
        ))
    }
}

impl<G: EpochTarget> IoHandler for CommitIo<G> {
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
            CommitRequest::Stage { tag, payload } => {
                let CommitIo::Ready(c) = self else {
                    return Err("a stage before the committer started".into());
                };
                let subtask = c.subtask;
                c.stage(tag, &payload).map_err(|e| -> BoxError {
                    format!("WAL sink subtask {subtask}: writing epoch {tag} ahead of its commit failed: {e}").into()
                })?;
                Ok(CommitReply::Staged { payload })
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
                c.commit(n, &epochs, false).map_err(|e| -> BoxError {
                    format!("WAL sink subtask {subtask}: commit of checkpoint {n} failed: {e}").into()
                })?;
                Ok(CommitReply::Committed {
                    n,
                    epochs,
                    visible_ns: c.visible_ns(),
                    publishes: c.publishes(),
                })
            }
            CommitRequest::Record => {
                let CommitIo::Ready(c) = self else {
                    return Err("a record before the committer started".into());
                };
                let subtask = c.subtask;
                c.record().map_err(|e| -> BoxError {
                    format!("WAL sink subtask {subtask}: recording the last commit failed: {e}").into()
                })?;
                Ok(CommitReply::Recorded)
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
