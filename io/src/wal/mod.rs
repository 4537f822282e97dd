//! The write-ahead-log sink: exactly-once file output for any target that
//! can take a file by rename.
//!
//! Each sink subtask appends its records, framed with length, epoch and
//! CRC-32 ([`codec`]), to a log of segment files in its own folder
//! `<wal_dir>/subtask-<i>/`. The records written between barrier `n-1` and
//! barrier `n` form **epoch** `n` (precisely: records carry the id of the
//! last barrier plus one).
//!
//! No worker ever waits for the disk: each subtask has two threads of its
//! own ([`weir_core::io_thread::IoThread`]). The worker only encodes
//! frames into a buffer and keeps the log's position itself (segment,
//! offset: it decides where every frame goes and when a segment is full);
//! the **log thread** computes the frames' CRCs (the larger part of a
//! short record's cost, [`codec::finish_frame_unsealed`]), writes and
//! fsyncs the log, and the **committer
//! thread** commits. The worker hands a buffer to the log thread when it
//! holds [`WalSinkConfig::buffer_bytes`], at a segment's end, at a barrier
//! and at the end, so the thread wakes a bounded number of times a second.
//! With [`APPENDS_IN_FLIGHT`] buffers in flight, or the target's
//! [`EpochTarget::COMMITS_IN_FLIGHT`] commits in flight (default
//! [`QUEUED_COMMITS`]) and [`EpochTarget::MAX_EPOCHS_PER_COMMIT`] completed
//! epochs held back behind them, [`Sink::ready`] says false and the task
//! reads no input (backpressure, like a full ring): nothing is dropped,
//! memory stays bounded. A thread's error fails the sink's next call.
//!
//! The protocol, one durable step at a time (each step names its fault
//! point and the thread it runs on):
//!
//! 1. `write`: frames go into a buffer, which the log thread writes to the
//!    current segment (`wal.append`; it creates the segment, with its
//!    header, at its first buffer); a segment is closed once it holds
//!    [`WalSinkConfig::segment_bytes`] at a record boundary (a frame never
//!    spans two segments): the log thread fsyncs it (`wal.roll`) and the
//!    next buffer goes to the next segment. Nothing is fsynced per record.
//! 2. `pre_commit(n)` (barrier `n`): the buffer and a sync go to the log
//!    thread, which fsyncs the segment, with its folder if a segment was
//!    created (`wal.fsync`): one group commit for the whole epoch. The
//!    checkpoint stores the log's end position, known on the worker, and
//!    is acknowledged only once that sync is done (a job of the runtime's
//!    snapshot pool waits for it, see [`weir_core::PreCommit::with_sync`]).
//!    An epoch kept in memory also goes to the committer thread now, for a
//!    target that stages ([`EpochTarget::STAGES`], files): it writes the
//!    epoch's hidden temporary file (`wal.commit.write`) and fsyncs it
//!    (`wal.commit.fsync`) while the checkpoint completes, so that step 3
//!    only renames. At most [`STAGES_IN_FLIGHT`] wait on the thread; an
//!    epoch beyond them is written at its commit instead.
//! 3. `commit(n)` (checkpoint `n` complete): the committer thread gets the
//!    closed epochs up to `n` as one request (the worker does not wait);
//!    while the target's commits in flight are at their bound, completed
//!    checkpoints are held back and go in the next request together
//!    (coalescing: one publish for several checkpoints, in chunks of at
//!    most [`EpochTarget::MAX_EPOCHS_PER_COMMIT`] epochs and
//!    [`EpochTarget::MAX_BYTES_PER_COMMIT`] bytes).
//!    The output of every epoch up to `n` not yet committed (kept in
//!    memory up to [`WalSinkConfig::memory_bytes`], otherwise read back
//!    from the log and verified: its records are durable, since the
//!    checkpoint completed after their sync) is written, one file per
//!    epoch, to hidden temporary files in the target folder
//!    (`wal.commit.write`), each fsynced (`wal.commit.fsync`), unless it
//!    was staged at step 2; then each is renamed to
//!    `part-<subtask>-<epoch><suffix>` (`wal.commit.rename`): readers see
//!    them from here. The record of the commit is lazy
//!    ([`EpochTarget::LAZY_RECORD`]): at the first commit
//!    [`RECORD_INTERVAL_MS`] after the last record, when a log segment
//!    could be deleted, and at the end of the input, the folder is
//!    fsynced (`wal.commit.dirsync`), then the commit marker records `n`
//!    and the log position where its records end (`wal.commit.marker`),
//!    and segments wholly before it are deleted (`wal.commit.delete`),
//!    while the log thread writes a later one. A crash before the record
//!    leaves an older marker: the restore publishes the later epochs
//!    again, from the log, as the same files.
//! 4. `restore(n, state)`, on the thread that starts the job, before the
//!    sink's threads start: a target whose marker, or whose newest
//!    visible file, shows an epoch after `n` is refused
//!    ([`crate::Error::TargetAhead`]); the log between the marker and the
//!    checkpoint's end position is verified (any damage there is an error
//!    naming the segment file and byte offset) and its epochs, all `<= n`,
//!    are committed again as in step 3. Re-committing an epoch that was
//!    committed before the crash rewrites the same file under the same
//!    name, so output lands exactly once; an epoch whose file is visible
//!    already, of exactly the epoch's length, is adopted instead
//!    ([`EpochTarget::adopt`]: it was fsynced before its rename, so it is
//!    whole) and made durable by the record's folder fsync, not written
//!    again (at a 10 ms interval, up to a second of epochs: rewriting them
//!    took a restarted job 45-50 ms per sink subtask). Everything after the checkpoint's
//!    end is discarded: the tail of that segment is cut off (a torn record
//!    there is reported in [`WalRecovery::torn_tail`]), later segments are
//!    deleted (`wal.restore.truncate`). The restore's record is made
//!    durable before the job goes on. The log goes on in a new segment.
//!
//! `abort(n)` keeps epoch `n`: its records are committed with the next
//! completed checkpoint. Without checkpointing, `finish` commits everything
//! as one epoch (the commit waits for the log's last sync); after `finish`
//! the sink is ready once both threads are done. A sink that starts
//! without a checkpoint finds an empty log: its threads carry the start
//! out, the committer first (it creates the target folder, removes this
//! subtask's temporaries and refuses a target whose marker or visible
//! files show committed output), then the log thread (it deletes leftovers of an attempt that
//! never completed a checkpoint, never those of a refused start); no
//! checkpoint completes before both succeeded.
//!
//! Where committed epochs go is the sink's [`EpochTarget`]: by default
//! [`FileTarget`], the files of step 3; another target (a Kafka topic, say)
//! replaces step 3's files and marker with its own way of publishing and
//! recording a commit ([`WalSink::with_target`]), and keeps the rest.
//!
//! Visibility latency is recorded when an epoch is committed (see
//! [`crate::latency`]); records re-committed by a restore have no stamps
//! and are not counted.

pub mod codec;
mod commit;
mod log;
mod marker;
pub mod target;

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use weir_core::vfs::OpenOptions;

use weir_core::io_thread::{IoThread, Ticket};
use weir_core::{BoxError, PreCommit, Sink, SinkContext};

use crate::error::IoContext;
use crate::fsutil::{create_dir_durable, fault, remove_if_exists, sync_dir};
use crate::latency::{StampRuns, Visible};
use crate::{Error, Result};
use codec::{SinkState, WalPos, SEGMENT_HEADER_BYTES};
use commit::{Closed, CommitIo, CommitReply, CommitRequest, Committer, Fresh, Progress, SharedProgress};
pub(crate) use log::LogReader;
use log::{list_segments, segment_path, LogIo, LogReply, LogRequest};
#[cfg(feature = "fuzzing")]
pub(crate) use marker::decode_marker;
pub use marker::Committed;
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) use marker::Marker;
pub use target::{EpochTarget, FileTarget};

pub use commit::{MAX_EPOCHS_PER_COMMIT, QUEUED_COMMITS, RECORD_INTERVAL_MS};
pub use log::{FAULT_APPEND, FAULT_FSYNC, FAULT_ROLL};
pub use marker::FAULT_MARKER;

/// Fault point before a committed epoch's temporary file is created.
pub const FAULT_COMMIT_WRITE: &str = "wal.commit.write";
/// Fault point before a committed epoch's temporary file is fsynced.
pub const FAULT_COMMIT_FSYNC: &str = "wal.commit.fsync";
/// Fault point before a temporary file is renamed to its committed name.
pub const FAULT_COMMIT_RENAME: &str = "wal.commit.rename";
/// Fault point before the target folder is fsynced after the renames.
pub const FAULT_COMMIT_DIRSYNC: &str = "wal.commit.dirsync";
/// Fault point before committed segments are deleted.
pub const FAULT_COMMIT_DELETE: &str = "wal.commit.delete";
/// Fault point before a restore cuts off the log after the checkpoint.
pub const FAULT_RESTORE_TRUNCATE: &str = "wal.restore.truncate";

/// Every fault point of the WAL sink, in protocol order.
pub const FAULT_POINTS: &[&str] = &[
    FAULT_APPEND,
    FAULT_ROLL,
    FAULT_FSYNC,
    FAULT_COMMIT_WRITE,
    FAULT_COMMIT_FSYNC,
    FAULT_COMMIT_RENAME,
    FAULT_COMMIT_DIRSYNC,
    FAULT_MARKER,
    FAULT_COMMIT_DELETE,
    FAULT_RESTORE_TRUNCATE,
];

/// Where and how a [`WalSink`] writes. Shared by all subtasks of a sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalSinkConfig {
    /// Folder of the logs; subtask `i` uses `subtask-<i>` in it.
    pub wal_dir: PathBuf,
    /// Folder of the committed output files.
    pub target_dir: PathBuf,
    /// A segment is closed once it holds this many bytes (default 64 MiB):
    /// at the record boundary that reaches it, or, while the log thread
    /// lags ([`APPENDS_IN_FLIGHT`] buffers in flight), with the next buffer
    /// it takes (at most one scheduling turn's output later).
    pub segment_bytes: u64,
    /// Frames are handed to the log thread, to be written to the segment,
    /// when this many bytes are buffered (default 1 MiB); the sink holds at
    /// most [`APPENDS_IN_FLIGHT`] such buffers before it says it is not
    /// ready.
    pub buffer_bytes: usize,
    /// Ending of output file names (default `.csv`).
    pub suffix: String,
    /// Uncommitted output kept in memory for the commit, in bytes (default
    /// 64 MiB). An epoch that does not fit is read back from the log at
    /// commit (verified) instead; 0 always reads back.
    pub memory_bytes: usize,
}

impl WalSinkConfig {
    /// Logs in `wal_dir`, output in `target_dir`, other settings default.
    pub fn new(wal_dir: impl Into<PathBuf>, target_dir: impl Into<PathBuf>) -> Self {
        WalSinkConfig {
            wal_dir: wal_dir.into(),
            target_dir: target_dir.into(),
            segment_bytes: 64 << 20,
            buffer_bytes: 1 << 20,
            suffix: ".csv".into(),
            memory_bytes: 64 << 20,
        }
    }

    /// Logs in `wal_dir` for a sink whose target is not a folder of files
    /// (the Kafka exactly-once sink): `target_dir` and `suffix` are unused.
    pub fn log_only(wal_dir: impl Into<PathBuf>) -> Self {
        Self::new(wal_dir, PathBuf::new())
    }

    /// Checks the sizes: a segment of at least 4 KiB, a buffer of 1 byte to
    /// 256 MiB.
    pub fn validate(&self) -> Result<()> {
        if self.segment_bytes < 4096 {
            return Err(Error::InvalidConfig {
                setting: "segment_bytes",
                value: self.segment_bytes.to_string(),
                reason: "must be at least 4096",
            });
        }
        if self.buffer_bytes == 0 || self.buffer_bytes > 256 << 20 {
            return Err(Error::InvalidConfig {
                setting: "buffer_bytes",
                value: self.buffer_bytes.to_string(),
                reason: "must be 1 to 268435456",
            });
        }
        Ok(())
    }
}

/// What the last [`Sink::restore`] of a [`WalSink`] found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WalRecovery {
    /// The restored checkpoint.
    pub checkpoint: u64,
    /// The epoch the commit marker recorded before the restore.
    pub committed_before: u64,
    /// In a dedup recovery, the epoch through which the failed instance it
    /// replaces had published (its record not durable yet): the restore
    /// read the log from there on, not from the marker's record.
    pub resumed_from: Option<u64>,
    /// Epochs committed (again) by the restore.
    pub recommitted_epochs: Vec<u64>,
    /// Records in them.
    pub recommitted_records: u64,
    /// Of those epochs, how many the target showed in full already and
    /// the restore only made durable ([`EpochTarget::adopt`]).
    pub adopted_epochs: usize,
    /// Whole records after the checkpoint's end, discarded.
    pub discarded_records: u64,
    /// Bytes cut off after the checkpoint's end in its last segment.
    pub discarded_bytes: u64,
    /// Later segments deleted.
    pub discarded_segments: usize,
    /// Where a record torn by the crash started (segment file, byte offset).
    pub torn_tail: Option<(PathBuf, u64)>,
}

/// Log buffers in flight to the log thread beyond which the sink says it
/// is not ready: 4. Two would already keep the worker and the thread busy
/// at once (the thread writes one buffer while the worker fills the next);
/// four absorb a write that stalls for a few buffers' time (writeback, a
/// busy disk) before the task is backpressured. Memory stays within this
/// many buffers ([`WalSinkConfig::buffer_bytes`] each, 4 MiB by default)
/// plus one scheduling turn's output.
pub const APPENDS_IN_FLIGHT: usize = 4;

/// Requests the log thread holds at most: the appends above and, beyond
/// them, the append and sync of barriers and of the end, which the
/// runtime cannot refuse. The sink says it is not ready once half of this
/// is in flight, so only a pile of barriers behind a stalled disk could
/// fill it (and then the worker waits, the last resort of the bound).
const LOG_QUEUE: usize = 64;

/// Spare output buffers kept for reuse: enough for the epochs of a few
/// checkpoints in flight.
const SPARE_BUFFERS: usize = 4;

/// Capacity an epoch's output buffer (kept in memory for the commit)
/// starts with, at least: 8 MiB, or [`WalSinkConfig::memory_bytes`] if
/// less; after an epoch that needed more, what it needed. A buffer that
/// grows doubles, copying what it holds on the worker: with empty buffers,
/// a 1000 ms interval (epochs of some 5 MB at 200,000 records/s) puts
/// those copies into the WAL sink's processing p99.9, several times what it
/// is with 8 MiB (docs/notebook/benchmarks-2026-12.md, "The WAL sink's
/// epoch buffer at a 1000 ms interval"). Capacity costs address space, not
/// memory, until it is written.
const EPOCH_BUFFER_BYTES: usize = 8 << 20;

/// Epochs handed to the committer thread to stage ahead of their commit
/// ([`EpochTarget::STAGES`]) and not yet done, at most: 4. Staging runs
/// while checkpoints complete, so a few in flight cover a 10 ms interval
/// with completions 20-40 ms late; beyond them an epoch is written at its
/// commit, as without staging, and the committer's queue never fills
/// (its capacity counts these).
pub const STAGES_IN_FLIGHT: usize = 4;

/// A started sink subtask: its two threads and the worker's bookkeeping.
///
/// The worker encodes frames into `buf` and keeps the log position
/// itself: the log thread writes what it is handed where it is told. The
/// committer thread commits closed epochs once their checkpoint completed.
struct Running<G: EpochTarget> {
    log: IoThread<LogIo>,
    committer: IoThread<CommitIo<G>>,
    buffer_bytes: usize,
    segment_bytes: u64,
    /// Frames not yet handed to the log thread, all of segment `seg`; the
    /// sink encodes records straight into it.
    buf: Vec<u8>,
    /// The segment being filled, and its bytes already handed to the log
    /// thread (its header included): the log's end is `(seg, seg_base +
    /// buf.len())`.
    seg: u64,
    seg_base: u64,
    /// An append to `seg` was submitted: the log thread created it.
    seg_created: bool,
    /// `write` hands `buf` over once it holds this many bytes: a buffer's
    /// worth, or what is left of the segment, whichever is less.
    hand_over_at: usize,
    /// Appends submitted whose reply was not taken yet, and their bytes.
    appends_in_flight: usize,
    bytes_in_flight: usize,
    /// Log buffers back from the thread, for reuse.
    spare_bufs: Vec<Vec<u8>>,
    /// After a fresh start, the committer's `Start` ticket until its reply
    /// was taken: a pre-commit waits for it too.
    start_ticket: Option<Ticket>,
    /// The highest checkpoint whose commit was asked for (by `commit`, or
    /// `finish`): closed epochs up to it wait here only while
    /// [`EpochTarget::COMMITS_IN_FLIGHT`] commits are in flight.
    commit_through: u64,
    commits_in_flight: usize,
    /// Epochs handed to the committer thread to stage, not yet replied.
    stages_in_flight: usize,
    /// Publishes the committer thread reported (one per chunk of a commit).
    publishes: u64,
    /// The last epoch known committed (the last commit reported done).
    committed_epoch: u64,
    /// `finish` was called: ready once everything is done.
    finishing: bool,
    /// At the end, the request to make a lazy record durable was sent
    /// ([`CommitRequest::Record`]).
    end_recorded: bool,
    /// The worker's waker was handed to the threads.
    waker_set: bool,
    /// Epoch of the records being written: the last barrier plus one.
    open_tag: u64,
    open_records: u64,
    open_stamps: StampRuns,
    /// Output bytes of the open epoch, while `open_in_memory`.
    open_payload: Vec<u8>,
    /// Capacity a fresh `open_payload` starts with (see
    /// [`EPOCH_BUFFER_BYTES`]).
    payload_hint: usize,
    open_in_memory: bool,
    closed: VecDeque<Closed>,
    /// Bytes of output kept in memory by epochs not yet committed.
    memory_used: usize,
    memory_limit: usize,
    spare_stamps: Vec<StampRuns>,
    spare_payloads: Vec<Vec<u8>>,
    spare_epochs: Vec<Vec<Closed>>,
    visible: Visible,
}

impl<G: EpochTarget> std::fmt::Debug for Running<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("pos", &self.pos())
            .field("appends_in_flight", &self.appends_in_flight)
            .field("commits_in_flight", &self.commits_in_flight)
            .field("open_tag", &self.open_tag)
            .field("closed", &self.closed.len())
            .finish()
    }
}

impl<G: EpochTarget> Running<G> {
    /// The position after the last frame appended (handed over or not).
    #[inline]
    fn pos(&self) -> WalPos {
        WalPos {
            seg: self.seg,
            off: self.seg_base + self.buf.len() as u64,
        }
    }

    /// Encoded bytes not yet written by the log thread.
    fn buffered(&self) -> usize {
        self.buf.len() + self.bytes_in_flight
    }

    /// Whether `buf` should go to the log thread: a buffer's worth, or the
    /// segment is full.
    fn due(&self) -> bool {
        self.buf.len() >= self.buffer_bytes || self.pos().off >= self.segment_bytes
    }

    /// Where the next buffer is due, from the segment's bytes handed over.
    fn next_hand_over_at(&self) -> usize {
        let room = self.segment_bytes.saturating_sub(self.seg_base).max(1);
        (self.buffer_bytes as u64).min(room) as usize
    }

    /// Stops keeping the open epoch in memory if it no longer fits.
    #[inline]
    fn check_memory(&mut self) {
        if self.open_in_memory && self.memory_used + self.open_payload.len() > self.memory_limit {
            self.open_in_memory = false;
            self.open_payload = Vec::new();
        }
    }

    /// Hands this sink's worker to the threads for wake-ups, once.
    fn wake_me(&mut self, ctx: &SinkContext<'_>) {
        if !self.waker_set {
            self.log.set_waker(ctx.waker());
            self.committer.set_waker(ctx.waker());
            self.waker_set = true;
        }
    }

    /// `buf` reached `hand_over_at` in `write`: hands it over, unless
    /// [`APPENDS_IN_FLIGHT`] are in flight (then it keeps filling, and
    /// `ready` says false after this turn).
    #[cold]
    #[inline(never)]
    fn on_full(&mut self) -> Result<(), BoxError> {
        if self.appends_in_flight >= APPENDS_IN_FLIGHT {
            self.take_replies()?;
        }
        if self.appends_in_flight >= APPENDS_IN_FLIGHT {
            // Look again after another buffer's worth.
            self.hand_over_at = self.buf.len().saturating_add(self.buffer_bytes);
            return Ok(());
        }
        self.hand_over()
    }

    /// Hands `buf` to the log thread, closing the segment if it is full (a
    /// frame never spans two segments: `buf` ends at a record boundary).
    fn hand_over(&mut self) -> Result<(), BoxError> {
        let close = self.pos().off >= self.segment_bytes;
        let cap = self.buffer_bytes + (self.buffer_bytes >> 2);
        let next = self.spare_bufs.pop().unwrap_or_else(|| Vec::with_capacity(cap));
        let buf = std::mem::replace(&mut self.buf, next);
        let len = buf.len();
        self.log.submit(LogRequest::Append {
            seq: self.seg,
            buf,
            close,
        })?;
        self.appends_in_flight += 1;
        self.bytes_in_flight += len;
        if close {
            self.seg += 1;
            self.seg_base = SEGMENT_HEADER_BYTES as u64;
            self.seg_created = false;
        } else {
            self.seg_base += len as u64;
            self.seg_created = true;
        }
        self.hand_over_at = self.next_hand_over_at();
        Ok(())
    }

    /// Hands over whatever `buf` holds; with `create`, also an empty
    /// append if segment `seg` was not created yet (a checkpoint's end
    /// position must name a segment that exists).
    fn flush_log(&mut self, create: bool) -> Result<(), BoxError> {
        if !self.buf.is_empty() || (create && !self.seg_created) {
            self.hand_over()?;
        }
        Ok(())
    }

    /// What `ready` and `wait_idle` do besides taking replies: hand over a
    /// due buffer and the commits held back, as room allows.
    fn pump(&mut self) -> Result<(), BoxError> {
        if self.due() && self.appends_in_flight < APPENDS_IN_FLIGHT {
            self.hand_over()?;
        }
        self.submit_commits()?;
        if G::LAZY_RECORD && self.finishing && !self.end_recorded && !self.commit_pending() {
            // After the last commit: the end leaves its record durable.
            self.committer.submit(CommitRequest::Record)?;
            self.end_recorded = true;
        }
        Ok(())
    }

    /// Whether closed epochs wait for a commit that was asked for.
    fn commit_pending(&self) -> bool {
        self.closed.front().is_some_and(|c| c.tag <= self.commit_through)
    }

    /// Everything handed to the threads is done and its reply taken.
    fn idle(&self) -> bool {
        self.buf.is_empty() && !self.commit_pending() && self.log.in_flight() == 0 && self.committer.in_flight() == 0
    }

    /// Closed epochs of completed checkpoints not yet handed to the
    /// committer thread (held back while its commits in flight are at the
    /// bound), counted up to `limit`.
    fn held_back(&self, limit: usize) -> usize {
        self.closed
            .iter()
            .take(limit)
            .take_while(|c| c.tag <= self.commit_through)
            .count()
    }

    /// Whether the sink takes more records now (the backpressure bound):
    /// room for appends, and room for commits: a request may go to the
    /// committer thread, or the one held back is not full yet (the input
    /// goes on, and the checkpoints completing meanwhile join it).
    fn can_take_more(&self) -> bool {
        self.appends_in_flight < APPENDS_IN_FLIGHT
            && self.buffered() < APPENDS_IN_FLIGHT * self.buffer_bytes
            && self.log.in_flight() < LOG_QUEUE / 2
            && (self.commits_in_flight < G::COMMITS_IN_FLIGHT
                || self.held_back(G::MAX_EPOCHS_PER_COMMIT) < G::MAX_EPOCHS_PER_COMMIT)
    }

    /// Closes the open epoch at barrier `n` (`checkpoint`: `Some(n)`, or
    /// `None` at the end) and hands the log to the thread with a sync;
    /// returns the log's end and the sync's ticket.
    fn barrier(&mut self, n: u64, checkpoint: Option<u64>) -> Result<(WalPos, Ticket), BoxError> {
        assert!(
            n >= self.open_tag,
            "barrier {n} after epoch {} was opened: barrier ids must increase",
            self.open_tag
        );
        let end = self.pos();
        self.flush_log(true)?;
        let sync = self.log.submit(LogRequest::Sync { checkpoint })?;
        if self.open_records > 0 {
            let payload = if self.open_in_memory {
                self.payload_hint = self.payload_hint.max(self.open_payload.len()).min(self.memory_limit);
                let fresh = self.fresh_payload();
                let p = std::mem::replace(&mut self.open_payload, fresh);
                self.memory_used += p.len();
                Some(p)
            } else {
                None
            };
            let fresh = self.spare_stamps.pop().unwrap_or_default();
            let (payload, staged) = self.stage(payload)?;
            self.closed.push_back(Closed {
                tag: self.open_tag,
                end,
                payload,
                staged,
                stamps: std::mem::replace(&mut self.open_stamps, fresh),
                sync,
            });
        }
        self.open_tag = n + 1;
        self.open_records = 0;
        if self.open_payload.capacity() < self.payload_hint {
            // Dropped when the last epoch outgrew the memory bound.
            self.open_payload = self.fresh_payload();
        }
        self.open_payload.clear();
        self.open_in_memory = true;
        Ok((end, sync))
    }

    /// Hands the output of the epoch being closed (`open_tag`), if kept in
    /// memory, to the committer thread to write ahead of its commit, when
    /// the target stages and fewer than [`STAGES_IN_FLIGHT`] are in
    /// flight; returns what the closed epoch keeps: its payload, or the
    /// bytes staged.
    fn stage(&mut self, payload: Option<Vec<u8>>) -> Result<(Option<Vec<u8>>, Option<u64>), BoxError> {
        match payload {
            Some(p) if G::STAGES && self.stages_in_flight < STAGES_IN_FLIGHT => {
                let bytes = p.len() as u64;
                self.committer.submit(CommitRequest::Stage {
                    tag: self.open_tag,
                    payload: p,
                })?;
                self.stages_in_flight += 1;
                Ok((None, Some(bytes)))
            }
            p => Ok((p, None)),
        }
    }

    /// Submits the commit of every closed epoch up to `commit_through`, as
    /// one request, unless [`EpochTarget::COMMITS_IN_FLIGHT`] are in flight
    /// (then `ready` or `wait_idle` submits it later, merged with any later
    /// one).
    fn submit_commits(&mut self) -> Result<(), BoxError> {
        if self.commits_in_flight >= G::COMMITS_IN_FLIGHT || !self.commit_pending() {
            return Ok(());
        }
        let k = self.closed.iter().take_while(|c| c.tag <= self.commit_through).count();
        let mut epochs = self.spare_epochs.pop().unwrap_or_default();
        epochs.extend(self.closed.drain(..k));
        // The committer may read these epochs back from the log: it waits
        // for the sync that covers them (done already for a completed
        // checkpoint; not yet, maybe, at the end).
        let sync = epochs.iter().map(|c| c.sync).max().unwrap_or(0);
        let after = (sync > 0).then(|| self.log.completion(sync));
        self.committer.submit(CommitRequest::Commit {
            n: self.commit_through,
            epochs,
            after,
        })?;
        self.commits_in_flight += 1;
        Ok(())
    }

    /// Takes the threads' replies: recycles buffers, notes commits and
    /// their visibility; fails with a thread's error.
    fn take_replies(&mut self) -> Result<(), BoxError> {
        while let Some(reply) = self.committer.try_reply()? {
            match reply {
                CommitReply::Started => self.start_ticket = None,
                CommitReply::Recorded => {}
                CommitReply::Staged { payload } => {
                    self.stages_in_flight -= 1;
                    self.recycle_payload(payload);
                }
                CommitReply::Committed {
                    n,
                    epochs,
                    visible_ns,
                    publishes,
                } => {
                    self.commits_in_flight -= 1;
                    self.publishes = self.publishes.max(publishes);
                    self.committed_epoch = self.committed_epoch.max(n);
                    self.recycle(epochs, visible_ns);
                }
            }
        }
        while let Some(reply) = self.log.try_reply()? {
            if let LogReply::Appended { buf, len } = reply {
                self.appends_in_flight -= 1;
                self.bytes_in_flight -= len;
                if self.spare_bufs.len() <= APPENDS_IN_FLIGHT {
                    self.spare_bufs.push(buf);
                }
            }
        }
        Ok(())
    }

    /// An empty output buffer for the next epoch, of at least
    /// `payload_hint` bytes of capacity: a spare if one is that large.
    fn fresh_payload(&mut self) -> Vec<u8> {
        match self.spare_payloads.pop() {
            Some(p) if p.capacity() >= self.payload_hint => p,
            _ => Vec::with_capacity(self.payload_hint),
        }
    }

    /// An epoch's output buffer is done with (committed or staged): its
    /// bytes no longer count as kept in memory; kept for reuse.
    fn recycle_payload(&mut self, mut p: Vec<u8>) {
        self.memory_used -= p.len();
        if self.spare_payloads.len() < SPARE_BUFFERS {
            p.clear();
            self.spare_payloads.push(p);
        }
    }

    /// Committed epochs became visible at `visible_ns`: their latencies are
    /// due, their buffers free.
    fn recycle(&mut self, mut epochs: Vec<Closed>, visible_ns: u64) {
        for mut c in epochs.drain(..) {
            self.visible.add(&c.stamps, visible_ns);
            c.stamps.clear();
            self.spare_stamps.push(c.stamps);
            if let Some(p) = c.payload {
                self.recycle_payload(p);
            }
        }
        if self.spare_epochs.len() < 2 {
            self.spare_epochs.push(epochs);
        }
    }
}

/// One subtask of a write-ahead-log sink; see the module docs.
///
/// `encode(record, out)` appends a record's output bytes to `out` (for
/// line output, the line and its `\n`); `emitted_ns(record)` gives its
/// emission time on [`weir_core::clock`] for the visibility latency (0:
/// unknown, not recorded).
///
/// ```
/// use weir_core::harness::Harness;
/// use weir_core::Sink;
/// use weir_io::{WalSink, WalSinkConfig};
///
/// let dir = tempfile::tempdir().unwrap();
/// let config = WalSinkConfig::new(dir.path().join("wal"), dir.path().join("out"));
/// let encode = |r: &u64, out: &mut Vec<u8>| {
///     out.extend_from_slice(r.to_string().as_bytes());
///     out.push(b'\n');
/// };
/// let mut sink = WalSink::new(config, 0, encode, |_: &u64| 0);
/// let mut h = Harness::new(0, 1);
/// h.write_sink(&mut sink, &mut vec![1, 2, 3]).unwrap();
/// let state = sink.pre_commit(1).unwrap(); // barrier 1: durable, not visible
/// // (epoch 1's file may be written already, under a hidden name)
/// assert!(weir_io::committed_files(&dir.path().join("out")).unwrap().is_empty());
/// sink.commit(1).unwrap(); // checkpoint 1 complete: committed on the sink's thread
/// sink.wait_idle().unwrap(); // (blocking: for tests and tools)
/// let out = std::fs::read_to_string(dir.path().join("out/part-000-000000001.csv")).unwrap();
/// assert_eq!(out, "1\n2\n3\n");
/// # let _ = state;
/// ```
pub struct WalSink<T, F, E, G: EpochTarget = FileTarget> {
    config: WalSinkConfig,
    subtask: usize,
    encode: F,
    emitted_ns: E,
    /// Makes this subtask's target (not opened), at each start.
    make_target: TargetFactory<G>,
    /// `None` until restored or started fresh.
    run: Option<Running<G>>,
    recovery: Option<WalRecovery>,
    /// How far the committer thread got, for a replacement of this
    /// instance ([`Drop`]).
    progress: SharedProgress,
    _records: PhantomData<fn(&T)>,
}

/// The threads stop (the commit in progress ends first); then, for a
/// target whose record is lazy, how far this instance published is left
/// to its replacement, if it is dropped in a dedup recovery
/// ([`weir_core::carry`]): the replacement's restore reads the log from
/// there instead of from the durable record.
impl<T, F, E, G: EpochTarget> Drop for WalSink<T, F, E, G> {
    fn drop(&mut self) {
        self.run = None;
        if G::LAZY_RECORD {
            let progress = *self.progress.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(p) = progress {
                weir_core::carry::leave(&subtask_log_dir(&self.config, self.subtask), p);
            }
        }
    }
}

/// Makes a WAL sink subtask's [`EpochTarget`], not opened yet; called
/// at every start of the subtask (a fresh start, each restore).
pub type TargetFactory<G> = Box<dyn Fn() -> G + Send>;

impl<T, F, E> WalSink<T, F, E, FileTarget>
where
    F: Fn(&T, &mut Vec<u8>),
    E: Fn(&T) -> u64,
{
    /// The sink instance of `subtask`, committing files into
    /// [`WalSinkConfig::target_dir`] ([`FileTarget`]). Nothing is touched
    /// on disk until the first call of the sink: a restore, or a fresh
    /// start at the first write, barrier or finish (which its threads carry
    /// out).
    pub fn new(config: WalSinkConfig, subtask: usize, encode: F, emitted_ns: E) -> Self {
        let (target, suffix) = (config.target_dir.clone(), config.suffix.clone());
        let log_dir = subtask_log_dir(&config, subtask);
        let make = move || FileTarget::new(target.clone(), subtask, suffix.clone(), log_dir.clone());
        Self::with_target(config, subtask, Box::new(make), encode, emitted_ns)
    }
}

impl<T, F, E, G> WalSink<T, F, E, G>
where
    F: Fn(&T, &mut Vec<u8>),
    E: Fn(&T) -> u64,
    G: EpochTarget,
{
    /// The sink instance of `subtask`, committing into the targets
    /// `make_target` makes (one per start of the subtask); the log goes to
    /// [`WalSinkConfig::wal_dir`] (`target_dir` and `suffix` are the file
    /// target's and unused here). `encode` must write each record so that
    /// the target can tell records apart in a concatenation of them.
    pub fn with_target(
        config: WalSinkConfig,
        subtask: usize,
        make_target: TargetFactory<G>,
        encode: F,
        emitted_ns: E,
    ) -> Self {
        WalSink {
            config,
            subtask,
            encode,
            emitted_ns,
            make_target,
            run: None,
            recovery: None,
            progress: SharedProgress::default(),
            _records: PhantomData,
        }
    }

    /// What the last restore found and did.
    pub fn last_recovery(&self) -> Option<&WalRecovery> {
        self.recovery.as_ref()
    }

    /// The last epoch known committed: as the commit marker records it
    /// after a restore, then as the committer thread reported (0 before
    /// the sink started or if nothing was committed). [`WalSink::wait_idle`]
    /// brings it up to date.
    pub fn committed_epoch(&self) -> u64 {
        self.run.as_ref().map_or(0, |r| r.committed_epoch)
    }

    /// Publishes of committed output this sink instance made, as its
    /// committer thread last reported (a restore's included): one per chunk of a
    /// commit, so fewer than the checkpoints committed when completed
    /// checkpoints were held back and published together (for Kafka: the
    /// transactions). [`WalSink::wait_idle`] brings it up to date.
    pub fn publishes(&self) -> u64 {
        self.run.as_ref().map_or(0, |r| r.publishes)
    }

    /// Encoded bytes handed to the sink and not yet written to the log by
    /// its thread (being filled, or in appends in flight). The sink says it
    /// is not ready beyond [`APPENDS_IN_FLIGHT`] buffers, so this stays
    /// below that many [`WalSinkConfig::buffer_bytes`] plus what one
    /// scheduling turn writes.
    pub fn buffered_bytes(&self) -> usize {
        self.run.as_ref().map_or(0, Running::buffered)
    }

    /// Waits (blocking) until the sink's threads did everything handed to
    /// them (appends and syncs, commits, also those held back for room),
    /// and the last commit's record is durable (a lazy one too,
    /// [`EpochTarget::LAZY_RECORD`]), and takes their replies; fails with a
    /// thread's error. For tests and tools, never on a worker. Does not
    /// hand over a buffer that is not due: what `write` buffered stays
    /// buffered until a barrier or the end.
    pub fn wait_idle(&mut self) -> Result<(), BoxError> {
        let Some(run) = self.run.as_mut() else {
            return Ok(());
        };
        loop {
            run.take_replies()?;
            run.pump()?;
            let log = run.log.wait_for(run.log.last_ticket());
            let commits = run.committer.wait_for(run.committer.last_ticket());
            log?;
            commits?;
            run.take_replies()?;
            if !run.commit_pending() && !run.due() {
                break;
            }
        }
        if G::LAZY_RECORD {
            let t = run.committer.submit(CommitRequest::Record)?;
            run.committer.wait_for(t)?;
            run.take_replies()?;
        }
        Ok(())
    }

    /// This subtask's log folder.
    pub fn log_dir(&self) -> PathBuf {
        subtask_log_dir(&self.config, self.subtask)
    }

    /// The started subtask; a fresh start at the first call, handed to
    /// the threads (nothing here touches the disk).
    fn running(&mut self) -> Result<&mut Running<G>, BoxError> {
        if self.run.is_none() {
            self.config.validate()?;
            self.run = Some(self.start(None, 1, 1)?);
        }
        Ok(self.run.as_mut().expect("started above"))
    }

    /// Starts the threads: the committer with `committer` (after a
    /// restore) or its half of a fresh start (`None`: then the log thread
    /// does the other half once the committer's succeeded); writing goes on
    /// in segment `next_seg`, epoch `open_tag`.
    fn start(&self, committer: Option<Committer<G>>, next_seg: u64, open_tag: u64) -> Result<Running<G>, BoxError> {
        let dir = self.log_dir();
        let log = IoThread::spawn(
            &format!("weir-wal-log-{:03}", self.subtask),
            LogIo::new(dir.clone(), self.subtask as u32),
            LOG_QUEUE,
        )
        .map_err(|e| Error::io("start the log thread of", &dir, e))?;
        let fresh = committer.is_none();
        let (handler, committed_epoch) = match committer {
            Some(c) => {
                let epoch = c.committed.epoch;
                (CommitIo::Ready(Box::new(c)), epoch)
            }
            None => (
                CommitIo::Fresh(Fresh {
                    dir: dir.clone(),
                    subtask: self.subtask,
                    target: Some((self.make_target)()),
                    progress: self.progress.clone(),
                }),
                0,
            ),
        };
        // Room for the start, every commit and every stage in flight, and
        // the end's record: never waits.
        let committer = IoThread::spawn(
            &format!("weir-wal-commit-{:03}", self.subtask),
            handler,
            G::COMMITS_IN_FLIGHT + 2 + if G::STAGES { STAGES_IN_FLIGHT } else { 0 },
        )
        .map_err(|e| Error::io("start the committer thread of", &dir, e))?;
        let (buffer_bytes, segment_bytes) = (self.config.buffer_bytes, self.config.segment_bytes);
        let payload_hint = EPOCH_BUFFER_BYTES.min(self.config.memory_bytes);
        let mut run = Running {
            log,
            committer,
            buffer_bytes,
            segment_bytes,
            buf: Vec::with_capacity(buffer_bytes + (buffer_bytes >> 2)),
            seg: next_seg,
            seg_base: SEGMENT_HEADER_BYTES as u64,
            seg_created: false,
            hand_over_at: buffer_bytes,
            appends_in_flight: 0,
            bytes_in_flight: 0,
            spare_bufs: Vec::new(),
            start_ticket: None,
            commit_through: 0,
            commits_in_flight: 0,
            stages_in_flight: 0,
            publishes: 0,
            committed_epoch,
            finishing: false,
            end_recorded: false,
            waker_set: false,
            open_tag,
            open_records: 0,
            open_stamps: StampRuns::default(),
            open_payload: Vec::with_capacity(payload_hint),
            payload_hint,
            open_in_memory: true,
            closed: VecDeque::new(),
            memory_used: 0,
            memory_limit: self.config.memory_bytes,
            spare_stamps: Vec::new(),
            spare_payloads: Vec::new(),
            spare_epochs: Vec::new(),
            visible: Visible::default(),
        };
        run.hand_over_at = run.next_hand_over_at();
        if fresh {
            let t = run.committer.submit(CommitRequest::Start)?;
            let after = run.committer.completion(t);
            run.log.submit(LogRequest::Start { after })?;
            run.start_ticket = Some(t);
        }
        Ok(run)
    }

    /// Creates the log folder and opens a target, which says what it
    /// records as committed (for a restore, on its own thread). `again`:
    /// an earlier instance of this process started on these folders (it
    /// left its [`Progress`]), so they exist durably already.
    fn prepare(&self, again: bool) -> Result<(G, Option<Committed>)> {
        self.config.validate()?;
        let mut target = (self.make_target)();
        let committed = if again {
            target.open_again()?
        } else {
            create_dir_durable(&self.log_dir())?;
            target.open()?
        };
        Ok((target, committed))
    }

    fn restore_from(&mut self, n: u64, state: &[u8]) -> Result<(), BoxError> {
        let bad = |reason: String| Error::BadState {
            sink: format!("WAL sink subtask {}", self.subtask),
            checkpoint: n,
            reason,
        };
        let st = SinkState::decode(state).map_err(bad)?;
        if st.subtask as usize != self.subtask || st.epoch != n {
            return Err(bad(format!(
                "the state belongs to subtask {} at checkpoint {}",
                st.subtask, st.epoch
            ))
            .into());
        }
        // Stops the threads of the instance restored over, after the
        // request each has in hand: none of their I/O overlaps with this.
        self.run = None;
        let (committer, end, report) = self.recover(n, st)?;
        // Write on in a new segment, on the threads.
        self.run = Some(self.start(Some(committer), end.seg + 1, n + 1)?);
        self.recovery = Some(report);
        Ok(())
    }

    /// The synchronous part of a restore: verifies the log up to the
    /// checkpoint, cuts off what follows, commits again what it
    /// pre-committed; returns the committer and the checkpoint's end.
    fn recover(&self, n: u64, st: SinkState) -> Result<(Committer<G>, WalPos, WalRecovery)> {
        let bad = |reason: String| Error::BadState {
            sink: format!("WAL sink subtask {}", self.subtask),
            checkpoint: n,
            reason,
        };
        // A failed instance of this subtask, dropped in this process just
        // before (a dedup recovery), left how far it published since its
        // durable record (`Progress`).
        let left = if G::LAZY_RECORD {
            weir_core::carry::take::<Progress>(&self.log_dir())
        } else {
            None
        };
        let (mut target, committed) = self.prepare(left.is_some())?;
        let dir = self.log_dir();
        let mut committed = default_committed(committed);
        // What the failed instance left: the log is read from where it
        // published through (a few epochs), not from the durable record
        // (up to RECORD_INTERVAL_MS of log: 20 ms of reading under load),
        // once it agrees with the disk: the same durable record, the
        // target showing its newest epoch, within the checkpoint.
        // Otherwise, as after a crash, from the record.
        let mut newest_output = target.newest_output().unwrap_or(0);
        let resumed = left.filter(|p| {
            p.recorded == committed
                && p.published.epoch >= committed.epoch
                && p.published.pos >= committed.pos
                && p.published.epoch <= n
                && p.published.pos <= st.end
                && newest_output >= p.published.epoch
        });
        if left.is_some() && resumed.is_none() {
            // It does not agree: the target is opened as after a crash
            // (the marker made durable before anything relies on it).
            tracing::warn!(subtask = self.subtask, left = ?left, on_disk = ?committed,
                "what the failed WAL sink instance left does not agree with its log folder; restoring from the disk alone");
            let (t, c) = self.prepare(false)?;
            (target, committed) = (t, default_committed(c));
            newest_output = target.newest_output().unwrap_or(0);
        }
        let from = resumed.map_or(committed, |p| p.published);
        // A lazy record may lag the output: the newest visible epoch counts too.
        let newest = committed.epoch.max(newest_output);
        if newest > n {
            return Err(Error::TargetAhead {
                sink: target.kind(),
                subtask: self.subtask,
                target: target.describe(),
                committed: newest,
                restored: Some(n),
            });
        }
        if committed.pos > st.end {
            return Err(bad(format!(
                "the commit marker's position ({}) is after the checkpoint's end ({})",
                committed.pos, st.end
            )));
        }
        let end_path = segment_path(&dir, st.end.seg);
        let end_len = weir_core::vfs::metadata(&end_path)
            .map_err(|_| {
                Error::corrupt(
                    "WAL segment",
                    &end_path,
                    0,
                    format!("missing, but checkpoint {n} ends in it at byte {}", st.end.off),
                )
            })?
            .len();
        if end_len < st.end.off {
            return Err(Error::corrupt(
                "WAL segment",
                &end_path,
                end_len,
                format!(
                    "the segment ends before checkpoint {n}'s end at byte {}: data was lost",
                    st.end.off
                ),
            ));
        }

        // 1. Verify the uncommitted records up to the checkpoint and find their epochs.
        let mut reader = LogReader::default();
        let mut closed: VecDeque<Closed> = VecDeque::new();
        // Payload bytes per closed epoch, for the target's adoption below.
        let mut bytes: Vec<u64> = Vec::new();
        let mut records = 0u64;
        reader.read_range(&dir, self.subtask as u32, from.pos, st.end, |tag, payload, end| {
            records += 1;
            let grew = match closed.back_mut() {
                Some(c) if c.tag == tag => {
                    c.end = end;
                    false
                }
                last if tag > from.epoch && tag <= n && last.as_ref().is_none_or(|c| c.tag < tag) => {
                    closed.push_back(Closed {
                        tag,
                        end,
                        payload: None,
                        staged: None,
                        stamps: StampRuns::default(),
                        sync: 0,
                    });
                    true
                }
                _ => {
                    let at = end.off - (codec::HEADER_BYTES + payload.len()) as u64;
                    return Err(Error::corrupt(
                        "WAL record",
                        &segment_path(&dir, end.seg),
                        at,
                        format!(
                            "epoch {tag} out of order: expected epochs {} to {n} in order",
                            from.epoch + 1
                        ),
                    ));
                }
            };
            if grew {
                bytes.push(0);
            }
            *bytes.last_mut().expect("an epoch per record") += payload.len() as u64;
            Ok(())
        })?;

        // 2. Discard everything after the checkpoint's end.
        let (tail_records, _, stopped) = reader.scan_tail(&dir, self.subtask as u32, st.end.seg, st.end.off)?;
        if let Some(s) = &stopped {
            // Torn by the crash, or damaged: cut off with the rest of the
            // tail either way (nothing after the checkpoint's end is used),
            // and reported.
            weir_core::corruption::report(
                &end_path,
                s.offset,
                &format!(
                    "WAL segment {}: the record at byte {} after checkpoint {n}'s end does not verify ({}), torn by a crash or damaged: cut off with the rest of the log after the checkpoint",
                    end_path.display(),
                    s.offset,
                    s.reason
                ),
            );
        }
        let mut report = WalRecovery {
            checkpoint: n,
            committed_before: committed.epoch,
            resumed_from: resumed.map(|p| p.published.epoch),
            discarded_records: tail_records,
            discarded_bytes: end_len - st.end.off,
            torn_tail: stopped.map(|s| (end_path.clone(), s.offset)),
            ..WalRecovery::default()
        };
        let f = OpenOptions::new().write(true).open(&end_path).ctx("open", &end_path)?;
        if end_len > st.end.off {
            fault(
                FAULT_RESTORE_TRUNCATE,
                "cut off the log after the checkpoint in",
                &end_path,
            )?;
            f.set_len(st.end.off).ctx("truncate", &end_path)?;
        }
        // Synced even when its length is right already: that length may be
        // an earlier restore's cut whose fsync failed or never ran, and the
        // log goes on in the next segment. A crash must not bring back the
        // old tail, whose records a later restore would read as this
        // segment's (found by the storage simulation, WAL seed 39: an
        // earlier run's records of the next epoch were committed twice).
        f.sync_all().ctx("truncate", &end_path)?;
        let mut removed = false;
        for seq in list_segments(&dir)? {
            if seq > st.end.seg || seq < committed.pos.seg {
                fault(FAULT_RESTORE_TRUNCATE, "delete", &segment_path(&dir, seq))?;
                remove_if_exists(&segment_path(&dir, seq))?;
                report.discarded_segments += usize::from(seq > st.end.seg);
                removed = true;
            }
        }
        if removed {
            sync_dir(&dir, FAULT_RESTORE_TRUNCATE)?;
        }

        // 3. Commit again what the checkpoint pre-committed. An epoch
        // whose output the target shows in full already (published by the
        // failed attempt, its record not yet durable: the record is lazy)
        // is not written again, only made durable with the record: at a
        // 10 ms interval a restore otherwise rewrites and fsyncs up to a
        // second of epoch files (measured: 95 epochs, 45-50 ms per subtask).
        let mut target = target;
        let mut closed: Vec<Closed> = closed.into();
        for (c, &b) in closed.iter_mut().zip(&bytes) {
            if target.adopt(c.tag, b)? {
                c.staged = Some(b);
                report.adopted_epochs += 1;
            }
        }
        let mut committer = match resumed {
            Some(p) => Committer::resume(dir, self.subtask, target, p, self.progress.clone()),
            None => Committer::new(dir, self.subtask, target, committed, self.progress.clone()),
        };
        // Durable before the job goes on: the restore's record does not
        // lag. Continuing a failed instance of this process, lazy as its
        // would have been: a crash before the committer records leaves
        // the durable record, from which a restore publishes again (the
        // log up to the checkpoint is durable, its tail cut off durably
        // above).
        report.recommitted_epochs = committer.commit(n, &closed, resumed.is_none())?;
        report.recommitted_records = records;
        Ok((committer, st.end, report))
    }
}

impl<T, F, E, G> Sink<T> for WalSink<T, F, E, G>
where
    T: Send + 'static,
    F: Fn(&T, &mut Vec<u8>) + Send + 'static,
    E: Fn(&T) -> u64 + Send + 'static,
    G: EpochTarget,
{
    fn write(&mut self, batch: &mut Vec<T>, ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
        self.running()?;
        let (encode, emitted_ns) = (&self.encode, &self.emitted_ns);
        let run = self.run.as_mut().expect("started above");
        run.wake_me(ctx);
        run.take_replies()?;
        run.visible.flush(ctx);
        crate::latency::record_arrival(ctx, batch, emitted_ns);
        let tag = run.open_tag;
        let n = batch.len() as u64;
        for record in batch.drain(..) {
            let at = codec::begin_frame(&mut run.buf);
            encode(&record, &mut run.buf);
            // Unsealed: the log thread writes the CRC (`LogRequest::Append`).
            if let Err(len) = codec::finish_frame_unsealed(&mut run.buf, at, tag) {
                return Err(Error::RecordTooLarge {
                    sink: "wal",
                    subtask: self.subtask,
                    len,
                    limit: codec::MAX_PAYLOAD_BYTES,
                }
                .into());
            }
            if run.open_in_memory {
                run.open_payload.extend_from_slice(&run.buf[at + codec::HEADER_BYTES..]);
            }
            run.open_stamps.push(emitted_ns(&record));
            if run.buf.len() >= run.hand_over_at {
                run.on_full()?;
            }
        }
        run.open_records += n;
        run.check_memory();
        Ok(())
    }

    fn open(&mut self, ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
        // The threads, and the fresh start's requests, before the first record.
        self.running()?.wake_me(ctx);
        Ok(())
    }

    fn ready(&mut self, ctx: &mut SinkContext<'_>) -> Result<bool, BoxError> {
        let Some(run) = self.run.as_mut() else {
            return Ok(true);
        };
        run.wake_me(ctx);
        run.take_replies()?;
        if run.finishing {
            run.visible.flush_all(ctx);
        } else {
            run.visible.flush(ctx);
        }
        run.pump()?;
        if run.finishing {
            return Ok(run.idle());
        }
        Ok(run.can_take_more())
    }

    fn finish(&mut self, ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
        let run = self.running()?;
        run.wake_me(ctx);
        run.take_replies()?;
        if run.open_records > 0 {
            // Without checkpointing (or after the last barrier): commit now.
            let tag = run.open_tag;
            run.barrier(tag, None)?;
        } else {
            run.flush_log(false)?;
            run.log.submit(LogRequest::Sync { checkpoint: None })?;
        }
        if let Some(last) = run.closed.back().map(|c| c.tag) {
            run.commit_through = run.commit_through.max(last);
        }
        run.submit_commits()?;
        run.finishing = true;
        run.visible.flush(ctx);
        Ok(())
    }

    fn pre_commit(&mut self, checkpoint: u64) -> Result<Vec<u8>, BoxError> {
        self.pre_commit_detached(checkpoint)?.wait()
    }

    fn pre_commit_detached(&mut self, checkpoint: u64) -> Result<PreCommit, BoxError> {
        let subtask = self.subtask as u32;
        let run = self.running()?;
        run.take_replies()?;
        let (end, sync) = run.barrier(checkpoint, Some(checkpoint))?;
        let synced = run.log.completion(sync);
        // After a fresh start, the committer's half of it too: a target
        // that refuses (or a start that failed) never lets a checkpoint
        // complete. (The log thread's start waits for it as well.)
        let started = run.start_ticket.map(|t| run.committer.completion(t));
        let state = SinkState {
            subtask,
            epoch: checkpoint,
            end,
        }
        .encode();
        Ok(PreCommit::with_sync(
            state,
            Box::new(move || {
                if let Some(started) = started {
                    started()?;
                }
                synced()
            }),
        ))
    }

    fn commit(&mut self, checkpoint: u64) -> Result<(), BoxError> {
        if let Some(run) = self.run.as_mut() {
            run.take_replies()?;
            run.commit_through = run.commit_through.max(checkpoint);
            run.submit_commits()?;
        }
        Ok(())
    }

    fn abort(&mut self, _checkpoint: u64) -> Result<(), BoxError> {
        // Flink semantics: the epoch stays; the next completed checkpoint commits it.
        Ok(())
    }

    fn restore(&mut self, checkpoint: u64, state: &[u8]) -> Result<(), BoxError> {
        self.restore_from(checkpoint, state)
    }
}

/// What a marker records, or the start of the log if it records nothing.
fn default_committed(recorded: Option<Committed>) -> Committed {
    recorded.unwrap_or(Committed {
        epoch: 0,
        pos: WalPos {
            seg: 1,
            off: SEGMENT_HEADER_BYTES as u64,
        },
    })
}

/// The folder of subtask logs of `config` (for tools and tests).
pub fn subtask_log_dir(config: &WalSinkConfig, subtask: usize) -> PathBuf {
    config.wal_dir.join(format!("subtask-{subtask:03}"))
}

/// Path of segment `seq` of a subtask log folder (for tools and tests).
pub fn segment_file(log_dir: &Path, seq: u64) -> PathBuf {
    segment_path(log_dir, seq)
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_core::harness::Harness;

    fn line(r: &u64, out: &mut Vec<u8>) {
        out.extend_from_slice(format!("{r:07}\n").as_bytes());
    }

    fn config(dir: &Path) -> WalSinkConfig {
        WalSinkConfig {
            segment_bytes: 4096,
            buffer_bytes: 512,
            ..WalSinkConfig::new(dir.join("wal"), dir.join("out"))
        }
    }

    fn output(dir: &Path) -> Vec<u64> {
        let mut all = Vec::new();
        for f in crate::committed_files(&dir.join("out")).unwrap() {
            let text = std::fs::read_to_string(f).unwrap();
            all.extend(text.lines().map(|l| l.parse::<u64>().unwrap()));
        }
        all
    }

    /// The hidden temporary files in `dir/out`, sorted.
    fn hidden(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir.join("out"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        names.sort();
        names
    }

    #[test]
    fn an_epoch_within_the_starting_capacity_never_moves_its_buffer() {
        let dir = tempfile::tempdir().unwrap();
        let mut h = Harness::new(0, 1);
        // Far above what the epochs below keep in memory, however late the
        // committer is, so that each stays in memory: the capacity is the bound.
        let limit = 1 << 20;
        let cfg = WalSinkConfig {
            memory_bytes: limit,
            segment_bytes: 1 << 20,
            ..config(dir.path())
        };
        let mut sink = WalSink::new(cfg, 0, line, |_: &u64| 0);
        let mut next = 0u64;
        for epoch in 1..=3u64 {
            h.write_sink(&mut sink, &mut vec![next]).unwrap();
            next += 1;
            let run = sink.run.as_ref().expect("started by the first write");
            assert!(
                run.open_payload.capacity() >= limit,
                "epoch {epoch} starts at the bound"
            );
            let at = run.open_payload.as_ptr();
            // 7,000 records of 8 bytes: 56,000 bytes, within the bound.
            while next < epoch * 7_000 {
                let mut batch: Vec<u64> = (next..next + 100).collect();
                next += 100;
                h.write_sink(&mut sink, &mut batch).unwrap();
            }
            let run = sink.run.as_ref().unwrap();
            assert!(run.open_in_memory && run.open_payload.len() > 50_000);
            assert_eq!(run.open_payload.as_ptr(), at, "epoch {epoch}: the buffer grew, copying");
            sink.pre_commit(epoch).unwrap();
            sink.commit(epoch).unwrap();
            sink.wait_idle().unwrap();
        }
        assert_eq!(output(dir.path()), (0..next).collect::<Vec<_>>());
    }

    #[test]
    fn epochs_in_memory_are_written_before_their_checkpoint_completes_and_shown_only_by_its_commit() {
        let dir = tempfile::tempdir().unwrap();
        let mut h = Harness::new(0, 1);
        let mut sink = WalSink::new(config(dir.path()), 0, line, |_: &u64| 0);
        h.write_sink(&mut sink, &mut vec![1, 2]).unwrap();
        sink.pre_commit(1).unwrap();
        h.write_sink(&mut sink, &mut vec![3]).unwrap();
        let state2 = sink.pre_commit(2).unwrap();
        // Both epochs are staged by the committer thread, in the
        // background: their files exist, hidden, before either checkpoint
        // completed.
        let expected = [".part-000-000000001.csv.tmp", ".part-000-000000002.csv.tmp"];
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while hidden(dir.path()) != expected {
            assert!(
                std::time::Instant::now() < deadline,
                "not staged: {:?}",
                hidden(dir.path())
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(output(dir.path()).is_empty(), "nothing is visible before a commit");
        // Checkpoint 1 completes: its epoch only, renamed; epoch 2 stays hidden.
        sink.commit(1).unwrap();
        sink.wait_idle().unwrap();
        assert_eq!(output(dir.path()), vec![1, 2]);
        assert_eq!(hidden(dir.path()), [expected[1]]);
        sink.commit(2).unwrap();
        sink.wait_idle().unwrap();
        assert_eq!(output(dir.path()), vec![1, 2, 3]);
        assert!(hidden(dir.path()).is_empty());
        // A staged epoch whose checkpoint never completes is removed by the
        // next start, never shown.
        h.write_sink(&mut sink, &mut vec![4]).unwrap();
        sink.pre_commit(3).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while hidden(dir.path()).is_empty() {
            assert!(std::time::Instant::now() < deadline, "epoch 3 not staged");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        drop(sink);
        let mut again = WalSink::new(config(dir.path()), 0, line, |_: &u64| 0);
        again.restore(2, &state2).unwrap();
        assert!(hidden(dir.path()).is_empty(), "{:?}", hidden(dir.path()));
        assert_eq!(output(dir.path()), vec![1, 2, 3]);
    }

    /// A restore after a failure finds the epochs the failed attempt
    /// published but whose lazy record never became durable: a file of
    /// the epoch's full length is adopted, not written again; one of
    /// another length is written again; the output is whole either way.
    #[test]
    fn a_restore_adopts_published_epoch_files_and_rewrites_a_damaged_one() {
        for damage in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let cfg = config(dir.path());
            let mut h = Harness::new(0, 1);
            let mut sink = WalSink::new(cfg.clone(), 0, line, |_: &u64| 0);
            let mut state = Vec::new();
            for e in 1..=3u64 {
                h.write_sink(&mut sink, &mut ((e - 1) * 100..e * 100).collect())
                    .unwrap();
                state = sink.pre_commit(e).unwrap();
                sink.commit(e).unwrap();
            }
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while output(dir.path()).len() < 300 {
                assert!(std::time::Instant::now() < deadline, "epochs 1-3 not published");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            // The failed attempt's threads stop; its record stays lazy.
            drop(sink);
            // The newest epoch's record lags (the first commit's is synced).
            let part3 = dir.path().join("out/part-000-000000003.csv");
            if damage {
                let f = std::fs::OpenOptions::new().write(true).open(&part3).unwrap();
                f.set_len(10).unwrap();
            }
            let mut again = WalSink::new(cfg.clone(), 0, line, |_: &u64| 0);
            again.restore(3, &state).unwrap();
            let r = again.last_recovery().unwrap().clone();
            assert!(r.committed_before < 3, "the record lagged: {r:?}");
            let redone: Vec<u64> = (r.committed_before + 1..=3).collect();
            assert_eq!(r.recommitted_epochs, redone, "{r:?}");
            let rewritten = usize::from(damage);
            assert_eq!(r.adopted_epochs, redone.len() - rewritten, "{r:?}");
            assert_eq!(output(dir.path()), (0..300).collect::<Vec<_>>());
            assert_eq!(again.committed_epoch(), 3);
        }
    }

    /// A dedup recovery: the failed instance is dropped and its
    /// replacement restored in one `Carried` scope, as the job thread does.
    /// The replacement reads the log from where its predecessor published
    /// (epoch 3), not from the lazy record (none yet), commits only the
    /// checkpoint's last epoch, cuts off the tail, and its next record
    /// makes the published epochs durable. What was left is checked
    /// against the disk: with epoch 3's file gone, the restore reads from
    /// the record instead and writes it again. Restored from checkpoint 3,
    /// which its predecessor published in full, it commits nothing, and
    /// its record still becomes durable.
    #[test]
    fn a_replacement_in_a_dedup_recovery_continues_where_its_predecessor_published() {
        use weir_core::carry::Carried;
        for (file_gone, at) in [(false, 4u64), (true, 4), (false, 3)] {
            let dir = tempfile::tempdir().unwrap();
            // Large segments: the record stays lazy (RECORD_INTERVAL_MS).
            let cfg = WalSinkConfig {
                segment_bytes: 1 << 20,
                ..config(dir.path())
            };
            let mut h = Harness::new(0, 1);
            let mut sink = WalSink::new(cfg.clone(), 0, line, |_: &u64| 0);
            let mut states = vec![Vec::new()];
            for e in 1..=3u64 {
                h.write_sink(&mut sink, &mut ((e - 1) * 100..e * 100).collect())
                    .unwrap();
                states.push(sink.pre_commit(e).unwrap());
                sink.commit(e).unwrap();
            }
            // Published, not recorded (`wait_idle` would record).
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while output(dir.path()).len() < 300 {
                assert!(std::time::Instant::now() < deadline, "epochs 1-3 not published");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            // Checkpoint 4 completes after the failure: its epoch is not
            // published; records of epoch 5 follow it in the log.
            h.write_sink(&mut sink, &mut (300..400).collect()).unwrap();
            states.push(sink.pre_commit(4).unwrap());
            h.write_sink(&mut sink, &mut (400..450).collect()).unwrap();
            let state = states[at as usize].clone();
            let mut recovery = Carried::default();
            recovery.enter(|| drop(sink));
            if file_gone {
                std::fs::remove_file(dir.path().join("out/part-000-000000003.csv")).unwrap();
            }
            let mut again = WalSink::new(cfg.clone(), 0, line, |_: &u64| 0);
            recovery.enter(|| again.restore(at, &state)).unwrap();
            let r = again.last_recovery().unwrap().clone();
            assert!(r.committed_before < 3, "the record lagged: {r:?}");
            if file_gone {
                assert_eq!(r.resumed_from, None, "{r:?}");
                let redone: Vec<u64> = (r.committed_before + 1..=at).collect();
                assert_eq!(r.recommitted_epochs, redone, "{r:?}");
                // Those still shown are adopted; epoch 3 is written again.
                assert_eq!(r.adopted_epochs, redone.len() - 2, "{r:?}");
            } else {
                assert_eq!(r.resumed_from, Some(3), "{r:?}");
                let (epochs, records) = if at == 4 { (vec![4], 100) } else { (vec![], 0) };
                assert_eq!(r.recommitted_epochs, epochs, "{r:?}");
                assert_eq!(r.recommitted_records, records, "only epochs after 3 were read: {r:?}");
            }
            // What followed the checkpoint's end in the log is cut off.
            assert!(r.discarded_records <= 150, "{r:?}");
            let rows = (0..at * 100).collect::<Vec<_>>();
            assert_eq!(output(dir.path()), rows);
            // The end records the commit durably: the marker says `at`.
            let mut b = Harness::new(0, 1);
            b.finish_sink(&mut again).unwrap();
            let marker = subtask_log_dir(&cfg, 0).join("committed");
            assert_eq!(marker::Marker::open(marker).unwrap().1.map(|c| c.epoch), Some(at));
            // Outside a recovery nothing is carried: a new process's
            // restore from the same checkpoint adopts what is there.
            drop(again);
            let mut fresh = WalSink::new(cfg.clone(), 0, line, |_: &u64| 0);
            fresh.restore(at, &state).unwrap();
            assert_eq!(fresh.last_recovery().unwrap().resumed_from, None);
            assert_eq!(output(dir.path()), rows);
        }
    }

    #[test]
    fn segments_roll_are_deleted_once_committed_and_restore_across_them() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(dir.path());
        let mut h = Harness::new(0, 1);
        let mut sink = WalSink::new(cfg.clone(), 0, line, |_: &u64| 0);
        // Epoch 1: ~3 segments of 24-byte frames; committed.
        h.write_sink(&mut sink, &mut (0..500).collect()).unwrap();
        let _ = sink.pre_commit(1).unwrap();
        sink.commit(1).unwrap();
        sink.wait_idle().unwrap();
        let log = sink.log_dir();
        let segs = list_segments(&log).unwrap();
        assert_eq!(segs.len(), 1, "committed segments are deleted: {segs:?}");
        // Epochs 2 and 3 span several segments; checkpoint 3 completes, the
        // crash comes before its commit, with epoch 4 half written.
        h.write_sink(&mut sink, &mut (500..900).collect()).unwrap();
        let _ = sink.pre_commit(2).unwrap();
        h.write_sink(&mut sink, &mut (900..1300).collect()).unwrap();
        let state3 = sink.pre_commit(3).unwrap();
        h.write_sink(&mut sink, &mut (1300..1700).collect()).unwrap();
        // The crash comes once the log thread wrote what it was handed.
        sink.wait_idle().unwrap();
        drop(sink);
        assert!(list_segments(&log).unwrap().len() >= 4);
        let mut sink = WalSink::new(cfg.clone(), 0, line, |_: &u64| 0);
        sink.restore(3, &state3).unwrap();
        let r = sink.last_recovery().unwrap();
        // `wait_idle` made epoch 1's lazy record durable.
        assert_eq!(r.recommitted_epochs, vec![2, 3]);
        assert_eq!(r.recommitted_records, 800);
        assert!(r.discarded_segments >= 1 || r.discarded_records > 0, "{r:?}");
        assert_eq!(output(dir.path()), (0..1300).collect::<Vec<_>>());
        assert_eq!(sink.committed_epoch(), 3);
        // Go on after the restore: ids are never reused, epoch 4 is closed by barrier 6.
        h.write_sink(&mut sink, &mut (1300..1700).collect()).unwrap();
        let _ = sink.pre_commit(6).unwrap();
        sink.commit(6).unwrap();
        h.finish_sink(&mut sink).unwrap();
        assert_eq!(output(dir.path()), (0..1700).collect::<Vec<_>>());
        assert!(dir.path().join("out/part-000-000000004.csv").exists());
        assert!(list_segments(&log).unwrap().len() <= 2);
    }

    #[test]
    fn bad_states_and_settings_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(dir.path());
        let mut sink = WalSink::new(cfg.clone(), 0, line, |_: &u64| 0);
        let e = Sink::<u64>::restore(&mut sink, 1, b"garbage").unwrap_err().to_string();
        assert!(e.contains("WAL sink subtask 0: bad state in checkpoint 1"), "{e}");
        let other = SinkState {
            subtask: 1,
            epoch: 1,
            end: WalPos { seg: 1, off: 24 },
        };
        let e = Sink::<u64>::restore(&mut sink, 1, &other.encode())
            .unwrap_err()
            .to_string();
        assert!(e.contains("subtask 1"), "{e}");
        let tiny = WalSinkConfig {
            segment_bytes: 10,
            ..cfg
        };
        let mut sink = WalSink::new(tiny, 0, line, |_: &u64| 0);
        let e = Harness::new(0, 1)
            .write_sink(&mut sink, &mut vec![1])
            .unwrap_err()
            .to_string();
        assert!(e.contains("segment_bytes"), "{e}");
    }

    /// The commit marker as a restore would read it.
    fn marker_epoch(sink_log: &Path) -> Option<u64> {
        Marker::open(sink_log.join("committed")).unwrap().1.map(|c| c.epoch)
    }

    #[test]
    fn a_restore_refuses_output_newer_than_its_checkpoint_even_while_the_record_lags() {
        let dir = tempfile::tempdir().unwrap();
        let mut h = Harness::new(0, 1);
        let mut sink = WalSink::new(config(dir.path()), 0, line, |_: &u64| 0);
        h.write_sink(&mut sink, &mut vec![1]).unwrap();
        let state1 = sink.pre_commit(1).unwrap();
        sink.commit(1).unwrap();
        h.write_sink(&mut sink, &mut vec![2]).unwrap();
        sink.pre_commit(2).unwrap();
        sink.commit(2).unwrap();
        // Not `wait_idle`, which would make the record durable: the crash
        // comes once both epochs are visible.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while output(dir.path()) != [1, 2] {
            assert!(std::time::Instant::now() < deadline, "the commits never showed");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let log = sink.log_dir();
        drop(sink);
        // Checkpoint 2 is lost (say, damaged), so the job restores 1: the
        // output of epoch 2 would be written again, cut differently. The
        // lazy marker may not show it yet; the visible file does.
        let lagging = marker_epoch(&log).unwrap_or(0) < 2;
        let mut again = WalSink::new(config(dir.path()), 0, line, |_: &u64| 0);
        let e = again.restore(1, &state1).unwrap_err().to_string();
        assert!(
            e.contains("committed through epoch 2") && e.contains("restores checkpoint 1"),
            "{e}"
        );
        // Not just the marker's doing, when it lagged (nearly always: the
        // two commits came well within `RECORD_INTERVAL_MS`).
        if lagging {
            assert!(marker_epoch(&log).unwrap_or(0) < 2);
        }
    }

    #[test]
    fn the_end_of_the_input_leaves_the_last_commit_recorded_durably() {
        let dir = tempfile::tempdir().unwrap();
        let mut h = Harness::new(0, 1);
        let mut sink = WalSink::new(config(dir.path()), 0, line, |_: &u64| 0);
        h.write_sink(&mut sink, &mut vec![1]).unwrap();
        sink.pre_commit(1).unwrap();
        sink.commit(1).unwrap();
        h.write_sink(&mut sink, &mut vec![2, 3]).unwrap();
        sink.pre_commit(2).unwrap();
        sink.commit(2).unwrap();
        h.write_sink(&mut sink, &mut vec![4]).unwrap();
        h.finish_sink(&mut sink).unwrap();
        let log = sink.log_dir();
        // `finish` commits the open epoch 3; the sink is ready only once
        // its record is durable, so it is there without waiting further.
        assert_eq!(marker_epoch(&log), Some(3));
        drop(sink);
        assert_eq!(output(dir.path()), vec![1, 2, 3, 4]);
    }
}
