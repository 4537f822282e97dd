//! The write-ahead-log sink: exactly-once file output for any target that
//! can take a file by rename.
//!
//! Each sink subtask appends its records, framed with length, epoch and
//! CRC-32 ([`codec`]), to a log of segment files in its own folder
//! `<wal_dir>/subtask-<i>/`. The records written between barrier `n-1` and
//! barrier `n` form **epoch** `n` (precisely: records carry the id of the
//! last barrier plus one).
//!
//! The protocol, one durable step at a time (each step names its fault
//! point):
//!
//! 1. `write`: frames go into a buffer, written to the current segment when
//!    full (`wal.append`); a full segment is fsynced and the next one begun
//!    (`wal.roll`). Nothing is fsynced per record.
//! 2. `pre_commit(n)` (barrier `n`): the log is written and fsynced, with
//!    its folder if a segment was created (`wal.fsync`): one group commit
//!    for the whole epoch. The checkpoint stores the log's end position.
//! 3. `commit(n)` (checkpoint `n` complete): the output of every epoch up
//!    to `n` not yet committed (kept in memory up to
//!    [`WalSinkConfig::memory_bytes`], otherwise read back from the log and
//!    verified) is written, one file per epoch, to hidden temporary files
//!    in the target folder
//!    (`wal.commit.write`), each fsynced (`wal.commit.fsync`), renamed to
//!    `part-<subtask>-<epoch><suffix>` (`wal.commit.rename`), and the
//!    folder is fsynced (`wal.commit.dirsync`). Then the commit marker
//!    records `n` and the log position where its records end
//!    (`wal.commit.marker`), and segments wholly before it are deleted
//!    (`wal.commit.delete`).
//! 4. `restore(n, state)`: the log between the marker and the checkpoint's
//!    end position is verified (any damage there is an error naming the
//!    segment file and byte offset) and its epochs, all `<= n`, are
//!    committed again as in step 3. Re-committing an epoch that was
//!    committed before the crash rewrites the same file under the same
//!    name, so output lands exactly once. Everything after the checkpoint's
//!    end is discarded: the tail of that segment is cut off (a torn record
//!    there is reported in [`WalRecovery::torn_tail`]), later segments are
//!    deleted (`wal.restore.truncate`).
//!
//! `abort(n)` keeps epoch `n`: its records are committed with the next
//! completed checkpoint. Without checkpointing, `finish` commits everything
//! as one epoch. A sink that starts without a checkpoint finds an empty log
//! (it deletes leftovers of an attempt that never completed a checkpoint)
//! and refuses a target whose marker shows committed output.
//!
//! Visibility latency is recorded when an epoch is committed (see
//! [`crate::latency`]); records re-committed by a restore have no stamps
//! and are not counted.

pub mod codec;
mod commit;
mod log;
mod marker;

use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use weir_core::{BoxError, Sink, SinkContext};

use crate::error::IoContext;
use crate::fsutil::{self, create_dir_durable, fault, remove_if_exists, sync_dir};
use crate::latency::{StampRuns, Visible};
use crate::{Error, Result};
use codec::{SinkState, WalPos, SEGMENT_HEADER_BYTES};
use commit::{Background, Closed, Committer, Committing, Done};
use log::{list_segments, segment_path, LogReader, LogWriter};
use marker::{Committed, Marker};

pub use commit::QUEUED_COMMITS;
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
    /// A segment is closed once it holds this many bytes (default 64 MiB).
    pub segment_bytes: u64,
    /// Frames are written to the segment when this many bytes are
    /// buffered (default 1 MiB).
    pub buffer_bytes: usize,
    /// Ending of output file names (default `.csv`).
    pub suffix: String,
    /// Uncommitted output kept in memory for the commit, in bytes (default
    /// 64 MiB). An epoch that does not fit is read back from the log at
    /// commit (verified) instead; 0 always reads back.
    pub memory_bytes: usize,
    /// Commit on a committer thread of the subtask's own (default false):
    /// the fsyncs of a commit then overlap with the next epoch's writes
    /// instead of stalling the sink's worker; `commit` returns once the
    /// commit is queued, and a failed commit fails the sink's next call.
    pub background_commit: bool,
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
            background_commit: false,
        }
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
    /// Epochs committed (again) by the restore.
    pub recommitted_epochs: Vec<u64>,
    /// Records in them.
    pub recommitted_records: u64,
    /// Whole records after the checkpoint's end, discarded.
    pub discarded_records: u64,
    /// Bytes cut off after the checkpoint's end in its last segment.
    pub discarded_bytes: u64,
    /// Later segments deleted.
    pub discarded_segments: usize,
    /// Where a record torn by the crash started (segment file, byte offset).
    pub torn_tail: Option<(PathBuf, u64)>,
}

/// Spare output buffers kept for reuse: enough for the epochs of a few
/// checkpoints in flight.
const SPARE_BUFFERS: usize = 4;

/// The log and bookkeeping of a started sink subtask.
#[derive(Debug)]
struct Running {
    writer: LogWriter,
    committing: Committing,
    /// The last epoch known committed (for a background committer: the
    /// last one reported done).
    committed_epoch: u64,
    /// Why a background commit failed; every later call fails with it.
    failed: Option<String>,
    /// Epoch of the records being written: the last barrier plus one.
    open_tag: u64,
    open_records: u64,
    open_stamps: StampRuns,
    /// Output bytes of the open epoch, while `open_in_memory`.
    open_payload: Vec<u8>,
    open_in_memory: bool,
    closed: VecDeque<Closed>,
    /// Bytes of output kept in memory by epochs not yet committed.
    memory_used: usize,
    memory_limit: usize,
    spare_stamps: Vec<StampRuns>,
    spare_payloads: Vec<Vec<u8>>,
    visible: Visible,
}

impl Running {
    /// Stops keeping the open epoch in memory if it no longer fits.
    #[inline]
    fn check_memory(&mut self) {
        if self.open_in_memory && self.memory_used + self.open_payload.len() > self.memory_limit {
            self.open_in_memory = false;
            self.open_payload = Vec::new();
        }
    }

    /// Closes the open epoch at barrier `n` and makes the log durable;
    /// returns the log's end.
    fn pre_commit(&mut self, n: u64) -> Result<WalPos> {
        self.collect(false)?;
        assert!(
            n >= self.open_tag,
            "barrier {n} after epoch {} was opened: barrier ids must increase",
            self.open_tag
        );
        let end = self.writer.pos();
        if self.open_records > 0 {
            let payload = if self.open_in_memory {
                let fresh = self.spare_payloads.pop().unwrap_or_default();
                let p = std::mem::replace(&mut self.open_payload, fresh);
                self.memory_used += p.len();
                Some(p)
            } else {
                None
            };
            let fresh = self.spare_stamps.pop().unwrap_or_default();
            self.closed.push_back(Closed {
                tag: self.open_tag,
                end,
                payload,
                stamps: std::mem::replace(&mut self.open_stamps, fresh),
            });
        }
        self.writer.sync()?;
        self.open_tag = n + 1;
        self.open_records = 0;
        self.open_payload.clear();
        self.open_in_memory = true;
        Ok(end)
    }

    /// Commits (or queues the commit of) every closed epoch up to `n`.
    fn commit_through(&mut self, n: u64) -> Result<()> {
        self.collect(false)?;
        let k = self.closed.iter().take_while(|c| c.tag <= n).count();
        if k == 0 {
            return Ok(());
        }
        let epochs: Vec<Closed> = self.closed.drain(..k).collect();
        match &mut self.committing {
            Committing::Inline(c) => {
                c.commit(n, &epochs)?;
                let visible_ns = c.visible_ns();
                self.committed_epoch = n;
                self.recycle(epochs, visible_ns);
            }
            Committing::Background(b) => b.send(n, epochs)?,
        }
        Ok(())
    }

    /// Takes the results of background commits (all of them, waiting, if
    /// `wait`); fails if one failed.
    fn collect(&mut self, wait: bool) -> Result<()> {
        if let Some(f) = &self.failed {
            return Err(Error::io(
                "commit",
                std::path::Path::new("the committer thread"),
                std::io::Error::other(f.clone()),
            ));
        }
        let Committing::Background(b) = &mut self.committing else {
            return Ok(());
        };
        let mut finished = Vec::new();
        while let Some(done) = b.next(wait) {
            finished.push(done);
        }
        for Done {
            n,
            result,
            epochs,
            visible_ns,
        } in finished
        {
            if let Err(e) = result {
                self.failed = Some(format!("background commit of checkpoint {n} failed: {e}"));
                return Err(e);
            }
            self.committed_epoch = self.committed_epoch.max(n);
            self.recycle(epochs, visible_ns);
        }
        Ok(())
    }

    /// Committed epochs became visible at `visible_ns`: their latencies are
    /// due, their buffers free.
    fn recycle(&mut self, epochs: Vec<Closed>, visible_ns: u64) {
        for mut c in epochs {
            self.visible.add(&c.stamps, visible_ns);
            c.stamps.clear();
            self.spare_stamps.push(c.stamps);
            if let Some(mut p) = c.payload {
                self.memory_used -= p.len();
                if self.spare_payloads.len() < SPARE_BUFFERS {
                    p.clear();
                    self.spare_payloads.push(p);
                }
            }
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
/// assert!(std::fs::read_dir(dir.path().join("out")).unwrap().next().is_none());
/// sink.commit(1).unwrap(); // checkpoint 1 complete: visible
/// let out = std::fs::read_to_string(dir.path().join("out/part-000-000000001.csv")).unwrap();
/// assert_eq!(out, "1\n2\n3\n");
/// # let _ = state;
/// ```
pub struct WalSink<T, F, E> {
    config: WalSinkConfig,
    subtask: usize,
    encode: F,
    emitted_ns: E,
    /// `None` until restored or started fresh.
    run: Option<Running>,
    recovery: Option<WalRecovery>,
    _records: PhantomData<fn(&T)>,
}

impl<T, F, E> WalSink<T, F, E>
where
    F: Fn(&T, &mut Vec<u8>),
    E: Fn(&T) -> u64,
{
    /// The sink instance of `subtask`. Nothing is touched on disk until the
    /// first call of the sink: a restore, or a fresh start at the first
    /// write, barrier or finish.
    pub fn new(config: WalSinkConfig, subtask: usize, encode: F, emitted_ns: E) -> Self {
        WalSink {
            config,
            subtask,
            encode,
            emitted_ns,
            run: None,
            recovery: None,
            _records: PhantomData,
        }
    }

    /// What the last restore found and did.
    pub fn last_recovery(&self) -> Option<&WalRecovery> {
        self.recovery.as_ref()
    }

    /// The last epoch committed, as the commit marker records it (0 before
    /// the sink started or if nothing was committed).
    pub fn committed_epoch(&self) -> u64 {
        self.run.as_ref().map_or(0, |r| r.committed_epoch)
    }

    /// Waits until every commit queued to the background committer is
    /// done (immediately true without one); fails if one failed.
    pub fn wait_for_commits(&mut self) -> Result<()> {
        match self.run.as_mut() {
            Some(run) => run.collect(true),
            None => Ok(()),
        }
    }

    /// This subtask's log folder.
    pub fn log_dir(&self) -> PathBuf {
        subtask_log_dir(&self.config, self.subtask)
    }

    fn running(&mut self) -> Result<&mut Running> {
        if self.run.is_none() {
            self.run = Some(self.fresh_start()?);
        }
        Ok(self.run.as_mut().expect("started above"))
    }

    /// A committer for this subtask whose marker records `committed`.
    fn committer(&self, marker: Marker, committed: Committed) -> Committer {
        Committer::new(
            self.log_dir(),
            self.subtask,
            self.config.target_dir.clone(),
            self.config.suffix.clone(),
            marker,
            committed,
        )
    }

    /// The bookkeeping of a started subtask: commits through `committer`,
    /// writing on in a new segment `next_seg`, epoch `open_tag`.
    fn open(&self, committer: Committer, next_seg: u64, open_tag: u64) -> Result<Running> {
        let writer = LogWriter::create(
            &self.log_dir(),
            self.subtask as u32,
            next_seg,
            self.config.buffer_bytes,
            self.config.segment_bytes,
        )?;
        let committed_epoch = committer.committed.epoch;
        let committing = if self.config.background_commit {
            Committing::Background(Background::start(committer)?)
        } else {
            Committing::Inline(Box::new(committer))
        };
        Ok(Running {
            writer,
            committing,
            committed_epoch,
            failed: None,
            open_tag,
            open_records: 0,
            open_stamps: StampRuns::default(),
            open_payload: Vec::new(),
            open_in_memory: true,
            closed: VecDeque::new(),
            memory_used: 0,
            memory_limit: self.config.memory_bytes,
            spare_stamps: Vec::new(),
            spare_payloads: Vec::new(),
            visible: Visible::default(),
        })
    }

    /// Creates the folders and reads the marker.
    fn prepare(&self) -> Result<(Marker, Option<Committed>)> {
        self.config.validate()?;
        let dir = self.log_dir();
        create_dir_durable(&dir)?;
        create_dir_durable(&self.config.target_dir)?;
        self.remove_temporaries()?;
        Marker::open(dir.join("committed"))
    }

    /// Removes this subtask's hidden temporary files from the target: the
    /// leftovers of a commit cut short, which a commit writes anew.
    fn remove_temporaries(&self) -> Result<()> {
        for name in fsutil::list_names(&self.config.target_dir)? {
            if name.starts_with('.') && name.ends_with(".tmp") {
                if let Some((s, _)) = fsutil::parse_part_name(&name, &self.config.suffix) {
                    if s == self.subtask {
                        remove_if_exists(&self.config.target_dir.join(&name))?;
                    }
                }
            }
        }
        Ok(())
    }

    /// A start without a checkpoint: an empty log, nothing committed.
    fn fresh_start(&self) -> Result<Running> {
        let (marker, committed) = self.prepare()?;
        if let Some(c) = committed.filter(|c| c.epoch > 0) {
            return Err(Error::TargetAhead {
                sink: "wal",
                subtask: self.subtask,
                target: self.config.target_dir.display().to_string(),
                committed: c.epoch,
                restored: None,
            });
        }
        let dir = self.log_dir();
        let old = list_segments(&dir)?;
        for &seq in &old {
            remove_if_exists(&segment_path(&dir, seq))?;
        }
        if !old.is_empty() {
            sync_dir(&dir, FAULT_RESTORE_TRUNCATE)?;
        }
        let start = Committed {
            epoch: 0,
            pos: WalPos {
                seg: 1,
                off: SEGMENT_HEADER_BYTES as u64,
            },
        };
        self.open(self.committer(marker, start), 1, 1)
    }

    fn restore_from(&mut self, n: u64, state: &[u8]) -> Result<()> {
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
            )));
        }
        self.run = None;
        let (marker, committed) = self.prepare()?;
        let dir = self.log_dir();
        let committed = committed.unwrap_or(Committed {
            epoch: 0,
            pos: WalPos {
                seg: 1,
                off: SEGMENT_HEADER_BYTES as u64,
            },
        });
        if committed.epoch > n {
            return Err(Error::TargetAhead {
                sink: "wal",
                subtask: self.subtask,
                target: self.config.target_dir.display().to_string(),
                committed: committed.epoch,
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
        let end_len = std::fs::metadata(&end_path)
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
        let mut records = 0u64;
        reader.read_range(&dir, self.subtask as u32, committed.pos, st.end, |tag, payload, end| {
            records += 1;
            match closed.back_mut() {
                Some(c) if c.tag == tag => c.end = end,
                last if tag > committed.epoch && tag <= n && last.as_ref().is_none_or(|c| c.tag < tag) => closed
                    .push_back(Closed {
                        tag,
                        end,
                        payload: None,
                        stamps: StampRuns::default(),
                    }),
                _ => {
                    let at = end.off - (codec::HEADER_BYTES + payload.len()) as u64;
                    return Err(Error::corrupt(
                        "WAL record",
                        &segment_path(&dir, end.seg),
                        at,
                        format!(
                            "epoch {tag} out of order: expected epochs {} to {n} in order",
                            committed.epoch + 1
                        ),
                    ));
                }
            }
            Ok(())
        })?;

        // 2. Discard everything after the checkpoint's end.
        let (tail_records, _, stopped) = reader.scan_tail(&dir, self.subtask as u32, st.end.seg, st.end.off)?;
        let mut report = WalRecovery {
            checkpoint: n,
            committed_before: committed.epoch,
            discarded_records: tail_records,
            discarded_bytes: end_len - st.end.off,
            torn_tail: stopped.map(|s| (end_path.clone(), s.offset)),
            ..WalRecovery::default()
        };
        if end_len > st.end.off {
            fault(
                FAULT_RESTORE_TRUNCATE,
                "cut off the log after the checkpoint in",
                &end_path,
            )?;
            let f = OpenOptions::new().write(true).open(&end_path).ctx("open", &end_path)?;
            f.set_len(st.end.off)
                .and_then(|_| weir_core::disk::sync_all(&f))
                .ctx("truncate", &end_path)?;
        }
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

        // 3. Commit again what the checkpoint pre-committed; write on in a new segment.
        let mut committer = self.committer(marker, committed);
        let closed: Vec<Closed> = closed.into();
        report.recommitted_epochs = committer.commit(n, &closed)?;
        report.recommitted_records = records;
        let mut run = self.open(committer, st.end.seg + 1, n + 1)?;
        run.committed_epoch = run.committed_epoch.max(committed.epoch);
        self.run = Some(run);
        self.recovery = Some(report);
        Ok(())
    }
}

impl<T, F, E> Sink<T> for WalSink<T, F, E>
where
    T: Send + 'static,
    F: Fn(&T, &mut Vec<u8>) + Send + 'static,
    E: Fn(&T) -> u64 + Send + 'static,
{
    fn write(&mut self, batch: &mut Vec<T>, ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
        self.running()?;
        let (encode, emitted_ns) = (&self.encode, &self.emitted_ns);
        let run = self.run.as_mut().expect("started above");
        run.collect(false)?;
        run.visible.flush(ctx);
        crate::latency::record_arrival(ctx, batch, emitted_ns);
        run.writer.maybe_roll()?;
        let tag = run.open_tag;
        let n = batch.len() as u64;
        for record in batch.drain(..) {
            let at = codec::begin_frame(&mut run.writer.buf);
            encode(&record, &mut run.writer.buf);
            if let Err(len) = codec::finish_frame(&mut run.writer.buf, at, tag) {
                return Err(Error::RecordTooLarge {
                    sink: "wal",
                    subtask: self.subtask,
                    len,
                    limit: codec::MAX_PAYLOAD_BYTES,
                }
                .into());
            }
            if run.open_in_memory {
                run.open_payload
                    .extend_from_slice(&run.writer.buf[at + codec::HEADER_BYTES..]);
            }
            run.open_stamps.push(emitted_ns(&record));
            run.writer.maybe_flush()?;
        }
        run.open_records += n;
        run.check_memory();
        Ok(())
    }

    fn finish(&mut self, ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
        let run = self.running()?;
        if run.open_records > 0 {
            // Without checkpointing (or after the last barrier): commit now.
            let tag = run.open_tag;
            run.pre_commit(tag)?;
        }
        if let Some(last) = run.closed.back().map(|c| c.tag) {
            run.commit_through(last)?;
        }
        run.collect(true)?;
        run.writer.sync()?;
        run.visible.flush(ctx);
        Ok(())
    }

    fn pre_commit(&mut self, checkpoint: u64) -> Result<Vec<u8>, BoxError> {
        let subtask = self.subtask as u32;
        let end = self.running()?.pre_commit(checkpoint)?;
        Ok(SinkState {
            subtask,
            epoch: checkpoint,
            end,
        }
        .encode())
    }

    fn commit(&mut self, checkpoint: u64) -> Result<(), BoxError> {
        if let Some(run) = self.run.as_mut() {
            run.commit_through(checkpoint)?;
        }
        Ok(())
    }

    fn abort(&mut self, _checkpoint: u64) -> Result<(), BoxError> {
        // Flink semantics: the epoch stays; the next completed checkpoint commits it.
        Ok(())
    }

    fn restore(&mut self, checkpoint: u64, state: &[u8]) -> Result<(), BoxError> {
        Ok(self.restore_from(checkpoint, state)?)
    }
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
        drop(sink);
        assert!(list_segments(&log).unwrap().len() >= 4);
        let mut sink = WalSink::new(cfg.clone(), 0, line, |_: &u64| 0);
        sink.restore(3, &state3).unwrap();
        let r = sink.last_recovery().unwrap();
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
}
