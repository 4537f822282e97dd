//! Two-phase commit: exactly-once output into any target that has
//! transactions which can be prepared durably and committed idempotently.
//!
//! In the spirit of Flink's `TwoPhaseCommitSinkFunction`, a target
//! implements [`TwoPhaseCommit`] (begin a transaction, write into it,
//! pre-commit it, commit it, abort it) and [`TwoPhaseCommitSink`] drives it
//! through weir's checkpoint lifecycle:
//!
//! - `write`: records go into the open transaction, begun for epoch
//!   `last barrier + 1`.
//! - `pre_commit(n)` (barrier `n`): the open transaction, if it holds
//!   records, is pre-committed (durable, invisible) and becomes pending
//!   under checkpoint `n`; the commits since the last barrier are made
//!   durable ([`TwoPhaseCommit::sync_commits`]); the next transaction is
//!   begun. The checkpoint records the handles ([`TwoPhaseCommit::Txn`])
//!   of every pending transaction and of the open one, and is acknowledged
//!   only once all of this succeeded.
//! - `commit(n)` (checkpoint `n` complete): the pending transactions of
//!   checkpoints up to `n` are committed, in order.
//! - `abort(n)` (checkpoint `n` failed): nothing is discarded; the pending
//!   transactions are committed with the next completed checkpoint.
//! - `restore(n, state)`: the target first cleans up what newer
//!   transactions left behind ([`TwoPhaseCommit::recover`]); then the
//!   pending transactions recorded in checkpoint `n` are committed again
//!   (commit is idempotent: they may or may not have been committed before
//!   the failure) and the recorded open one is aborted.
//! - Without checkpointing, `finish` pre-commits and commits the open
//!   transaction.
//!
//! A transaction without records is never pre-committed or committed: it
//! stays open across barriers, so idle epochs cost nothing.
//!
//! The state stored in a checkpoint is the postcard encoding of the
//! handles followed by a CRC-32, verified on restore.
//!
//! ## The target runs on a thread of the sink's own
//!
//! The target and the transaction bookkeeping (the open transaction, the
//! pending ones, the emission stamps of their records) live on the sink's
//! own thread, a [`weir_core::io_thread::IoThread`]: every method of
//! [`TwoPhaseCommit`] runs there, never on a worker, so a target **may
//! block** (write files, fsync, run database transactions) without
//! stalling the other tasks of the worker. A target written by a user gets
//! this for free. The [`TwoPhaseCommitSink`] on the worker is a thin
//! front that hands requests to that thread, which handles them one at a
//! time, in order:
//!
//! - **writes**: the front moves the records of each `write` into a
//!   staging vector (a `memcpy`, nothing else) and hands that vector over
//!   whole (swapped with an empty spare one: no copy) every
//!   [`BATCH_RECORDS`] records, and at every barrier and at the end.
//!   Output of a two-phase sink is invisible until commit, so smaller
//!   hand-overs would gain nothing: the thread wakes once per
//!   [`BATCH_RECORDS`] records, plus once per barrier and per commit. The
//!   thread begins the transaction if none is open, reads the records'
//!   emission stamps ([`TwoPhaseCommit::emitted_ns`]) and writes them into
//!   the transaction; the emptied vector comes back for reuse, with the
//!   records' processing latencies;
//! - **the barrier** (`pre_commit(n)`): the thread does all of the above,
//!   blocking, and stores the checkpoint's state in a slot; the front
//!   returns at once with [`PreCommit::deferred`], a job that waits (on the
//!   runtime's snapshot pool) for that request and hands the state to the
//!   checkpoint. A checkpoint is thus acknowledged only after the target's
//!   pre-commit, with its fsyncs, succeeded;
//! - **commit**, **finish** and **restore** likewise; `finish` is done once
//!   [`Sink::ready`] returns true, and `restore` (which runs on the thread
//!   that starts the job, not on a worker) waits for its request.
//!
//! **Bounded memory, never a dropped record**: when more than
//! [`TwoPhaseCommitSink::max_buffered_records`] records are staged or handed over and not yet
//! written by the thread, [`Sink::ready`] says false and the task reads no
//! input (backpressure, like a full ring) until the thread catches up; its
//! completions wake the worker.
//!
//! **A failure is final**: the first error of the target (or a panic)
//! stops the thread for good. Nothing submitted after it is handled, so
//! nothing is ever committed after a failed pre-commit; the job waiting for
//! that pre-commit fails, which declines its checkpoint; and the sink's
//! next call fails the task, whose restart restores the last completed
//! checkpoint (an I/O error is never retried blindly: after a failed
//! `fsync` a second one can succeed with the data gone).
//!
//! Implementations here: [`FileTransactions`] (a temporary file renamed
//! into the target folder) and [`SqliteTransactions`] (a staging table
//! moved into the target table in one database transaction with a
//! committed-epoch fence).

pub mod file;
pub mod sqlite;

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use weir_core::io_thread::{IoHandler, IoThread};
use weir_core::{clock, BoxError, PreCommit, Sink, SinkContext};

use crate::latency::{Arrived, StampRuns, Visible};
use crate::Error;

pub use file::{FileTransactions, FileTxn, FILE_FAULT_POINTS};
pub use sqlite::{SqliteTransactions, SqliteTxn, SQLITE_FAULT_POINTS};

/// Records the sink hands to its thread in one write request: 1024. The
/// thread wakes once per this many records (plus once per barrier and
/// commit), whatever the size of the batches the sink receives: at a
/// million records a second, a thousand wake-ups.
pub const BATCH_RECORDS: usize = 1024;

/// Spare record vectors kept for reuse: a batch being written while the
/// next is staged.
const SPARE_BATCHES: usize = 2;

/// Records staged or handed to the sink's thread, not yet written, beyond
/// which [`Sink::ready`] says false, by default
/// ([`TwoPhaseCommitSink::max_buffered_records`]): 32,768, some 160 ms at
/// 200,000 records/s, so that the target's pre-commit fsyncs (which hold
/// its thread for milliseconds, tens at the tail of a busy disk) do not
/// stop the job; with 2,048, one slow fsync backpressured the keyed
/// benchmark for over 100 ms. Memory stays below this plus one scheduling
/// turn's output.
pub const DEFAULT_MAX_BUFFERED_RECORDS: usize = 32 * BATCH_RECORDS;

/// The bound [`crate::two_phase_sqlite_sink`] sets: 2,048 records. A
/// barrier's pre-commit waits on the thread for every record handed over
/// before it, so a slow target (SQLite, shared by several subtasks, stages
/// some 50,000 rows a second on a loaded two-core machine) delays every
/// checkpoint by this bound over its throughput (`sqlite_exactly_once`,
/// checkpoint duration median: 2,048 records 51-65 ms, as with the writes
/// on the worker; 4,096 records 87-122 ms; 32,768 records 233 ms).
pub const SQLITE_MAX_BUFFERED_RECORDS: usize = 2 * BATCH_RECORDS;

/// Requests to the sink's thread besides the writes: barriers, commits and
/// the end. 64 bound those that can queue behind a stalled target before
/// the worker waits.
const CONTROL_QUEUE: usize = 64;

/// Spare vectors of commit latencies kept for reuse.
const SPARE_LATENCIES: usize = 4;

/// A transactional target, driven by [`TwoPhaseCommitSink`]; one instance
/// per sink subtask.
///
/// **Every method runs on the sink's own thread**, never on a worker (see
/// the module docs): a target may block in any of them, on a file, an
/// `fsync` or a database, and needs no thread or job of its own. The
/// methods are called one at a time, in the order of the sink's lifecycle.
///
/// Every method may be called again for the same transaction after a
/// failure: `commit` and `abort` must be idempotent.
pub trait TwoPhaseCommit<T>: Send + 'static {
    /// The handle of one transaction: what a checkpoint records to commit
    /// or abort it after a crash. It must name the transaction's durable
    /// resources (a file name, an epoch in a staging table), not hold them.
    type Txn: Serialize + DeserializeOwned + Send + 'static;

    /// Begins the transaction for the records of `epoch` (the id of the
    /// checkpoint expected to close it). Should be cheap: resources can be
    /// created at the first write.
    fn begin_transaction(&mut self, epoch: u64) -> Result<Self::Txn, BoxError>;

    /// Writes every record of `batch` into `txn`, leaving `batch` empty.
    /// Batches hold up to [`BATCH_RECORDS`] records, more at times.
    fn write(&mut self, txn: &mut Self::Txn, batch: &mut Vec<T>) -> Result<(), BoxError>;

    /// Makes `txn` durable, but not yet visible: after this returns, a crash
    /// must not lose it and [`TwoPhaseCommit::commit`] must be able to
    /// finish it from the handle alone. Blocking here (an `fsync`) is what
    /// it is for: the checkpoint is acknowledged only after it returned.
    fn pre_commit(&mut self, txn: &mut Self::Txn) -> Result<(), BoxError>;

    /// Makes the pre-committed `txn` visible. Idempotent: it may be called
    /// again, by this or a new instance, after it succeeded. It may leave
    /// the last step of making the commit durable to
    /// [`TwoPhaseCommit::sync_commits`] (the file sink renames here and
    /// fsyncs the folder there): visibility latency is measured when this
    /// returns.
    fn commit(&mut self, txn: &Self::Txn) -> Result<(), BoxError>;

    /// Makes every commit since the last call durable, where `commit` made
    /// it visible without (the default does nothing: a database commit is
    /// durable when it returns). Called at every barrier, after the open
    /// transaction's pre-commit and before the checkpoint is acknowledged,
    /// after a restore's commits, and at the end of input. A checkpoint
    /// records the transactions pre-committed and not yet committed at its
    /// barrier, so the first checkpoint that no longer records a commit
    /// never completes before that commit is durable; until then, a restore
    /// (from the checkpoint that still records it) commits it again. The
    /// file sink's folder fsync lands here (or in its pre-commit, which
    /// covers the new file's name and the renames since in one disk wait).
    fn sync_commits(&mut self) -> Result<(), BoxError> {
        Ok(())
    }

    /// Discards `txn`. Idempotent.
    fn abort(&mut self, txn: &Self::Txn) -> Result<(), BoxError>;

    /// Called once before anything else: `restored` is the checkpoint being
    /// restored (whose recorded transactions are committed or aborted right
    /// after), or `None` for a start without a checkpoint. Discard whatever
    /// transactions begun after that checkpoint left behind, and refuse a
    /// target that holds output newer than it.
    fn recover(&mut self, _restored: Option<u64>) -> Result<(), BoxError> {
        Ok(())
    }

    /// Emission time of a record on [`weir_core::clock`], for the
    /// processing and visibility latencies; 0 (the default) means unknown.
    /// Called on the sink's thread, once per record, before
    /// [`TwoPhaseCommit::write`]: keep it cheap.
    fn emitted_ns(&self, _record: &T) -> u64 {
        0
    }
}

/// What a checkpoint records, as written.
#[derive(Serialize)]
pub(crate) struct RecordedRef<'a, X> {
    pub(crate) pending: Vec<(u64, &'a X)>,
    pub(crate) open: Option<&'a X>,
}

/// What a checkpoint records, as read back.
#[derive(Deserialize)]
pub(crate) struct Recorded<X> {
    pending: Vec<(u64, X)>,
    open: Option<X>,
}

/// Version byte in front of the recorded state.
const STATE_VERSION: u8 = 1;

/// A transaction pre-committed at a barrier, not yet committed.
struct Pending<X> {
    checkpoint: u64,
    txn: X,
    stamps: StampRuns,
}

/// The open transaction.
struct Open<X> {
    txn: X,
    records: u64,
    stamps: StampRuns,
}

/// Where the sink's thread leaves a checkpoint's state for the job that
/// hands it to the runtime; one per barrier.
type StateSlot = Arc<Mutex<Option<Vec<u8>>>>;

/// `(latency ns, count)` runs.
type Latencies = Vec<(u64, u64)>;

/// Records handed to the sink's thread in one request, and what travels
/// with them; the vectors come back (emptied) for reuse.
struct WriteBufs<T> {
    records: Vec<T>,
    /// One entry per `write` call: the records from the previous entry's
    /// end up to `end` arrived at the sink at `arrived_ns`.
    arrivals: Vec<(usize, u64)>,
    /// Filled by the thread: the records' processing latencies.
    latencies: Latencies,
    /// Records handed over (`records` comes back empty).
    len: usize,
}

impl<T> Default for WriteBufs<T> {
    fn default() -> Self {
        WriteBufs {
            records: Vec::new(),
            arrivals: Vec::new(),
            latencies: Vec::new(),
            len: 0,
        }
    }
}

/// What the sink asks of its thread.
enum Request<T, X> {
    /// A start without a checkpoint: `recover(None)`.
    Start,
    /// A restore of `checkpoint`, which recorded `recorded`.
    Restore { checkpoint: u64, recorded: Recorded<X> },
    /// Write records into the open transaction.
    Write(WriteBufs<T>),
    /// The barrier of `checkpoint`: pre-commit, sync the commits, begin the
    /// next transaction, leave the state in `slot`.
    PreCommit { checkpoint: u64, slot: StateSlot },
    /// Commit the pending transactions up to `checkpoint`; their
    /// visibility latencies go into `latencies`.
    Commit { checkpoint: u64, latencies: Latencies },
    /// The end of input: pre-commit and commit everything.
    Finish { latencies: Latencies },
}

/// What the sink's thread hands back.
enum Reply<T> {
    Done,
    Written(WriteBufs<T>),
    /// The visibility latencies of the transactions just committed.
    Committed(Latencies),
}

/// The sink's thread: the target and the transactions.
struct Target<T, P: TwoPhaseCommit<T>> {
    inner: P,
    last_barrier: u64,
    open: Option<Open<P::Txn>>,
    pending: VecDeque<Pending<P::Txn>>,
    spare_stamps: Vec<StampRuns>,
    _records: PhantomData<fn(T)>,
}

impl<T, P: TwoPhaseCommit<T>> Target<T, P> {
    fn new(inner: P) -> Self {
        Target {
            inner,
            last_barrier: 0,
            open: None,
            pending: VecDeque::new(),
            spare_stamps: Vec::new(),
            _records: PhantomData,
        }
    }

    fn begin(&mut self) -> Result<(), BoxError> {
        if self.open.is_none() {
            let txn = self.inner.begin_transaction(self.last_barrier + 1)?;
            self.open = Some(Open {
                txn,
                records: 0,
                stamps: self.spare_stamps.pop().unwrap_or_default(),
            });
        }
        Ok(())
    }

    fn write(&mut self, mut bufs: WriteBufs<T>) -> Result<WriteBufs<T>, BoxError> {
        self.begin()?;
        let Target { inner, open, .. } = self;
        let open = open.as_mut().expect("begun above");
        let mut start = 0;
        for &(end, arrived_ns) in &bufs.arrivals {
            crate::latency::runs(
                &bufs.records[start..end],
                |r| inner.emitted_ns(r),
                |stamp, n| {
                    open.stamps.push_n(stamp, n);
                    bufs.latencies.push((arrived_ns.saturating_sub(stamp), n));
                },
            );
            start = end;
        }
        open.records += bufs.records.len() as u64;
        inner.write(&mut open.txn, &mut bufs.records)?;
        bufs.records.clear();
        bufs.arrivals.clear();
        Ok(bufs)
    }

    fn pre_commit(&mut self, checkpoint: u64, slot: &StateSlot) -> Result<(), BoxError> {
        let durable = |e: BoxError| -> BoxError {
            format!(
                "two-phase commit sink: the pre-commit of checkpoint {checkpoint} could not be made durable \
                 ({e}); the job restarts from its last completed checkpoint"
            )
            .into()
        };
        self.last_barrier = checkpoint;
        if self.open.as_ref().is_some_and(|o| o.records > 0) {
            let mut open = self.open.take().expect("checked above");
            self.inner.pre_commit(&mut open.txn).map_err(durable)?;
            self.pending.push_back(Pending {
                checkpoint,
                txn: open.txn,
                stamps: open.stamps,
            });
        }
        // Commits since the last barrier, which this checkpoint no longer
        // records, become durable before it is acknowledged.
        self.inner.sync_commits().map_err(durable)?;
        // Begin the next transaction now, so the checkpoint records it and
        // a restore can abort whatever it left behind.
        self.begin()?;
        let state = self.encode_state()?;
        *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(state);
        Ok(())
    }

    /// Commits the pending transactions of checkpoints up to `n`, in order;
    /// appends their visibility latencies to `latencies`.
    fn commit_through(&mut self, n: u64, latencies: &mut Latencies) -> Result<(), BoxError> {
        while self.pending.front().is_some_and(|p| p.checkpoint <= n) {
            let p = self.pending.front().expect("checked above");
            self.inner.commit(&p.txn)?;
            // Visible now.
            let visible_ns = clock::now_ns();
            let mut p = self.pending.pop_front().expect("checked above");
            p.stamps.latencies_at(visible_ns, latencies);
            p.stamps.clear();
            if self.spare_stamps.len() < 4 {
                self.spare_stamps.push(p.stamps);
            }
        }
        Ok(())
    }

    fn finish(&mut self, latencies: &mut Latencies) -> Result<(), BoxError> {
        if let Some(mut open) = self.open.take() {
            if open.records > 0 {
                // Without checkpointing: commit the only transaction now.
                self.inner.pre_commit(&mut open.txn)?;
                self.pending.push_back(Pending {
                    checkpoint: self.last_barrier + 1,
                    txn: open.txn,
                    stamps: open.stamps,
                });
            } else {
                self.inner.abort(&open.txn)?;
            }
        }
        self.commit_through(u64::MAX, latencies)?;
        self.inner.sync_commits()
    }

    fn restore(&mut self, checkpoint: u64, recorded: Recorded<P::Txn>) -> Result<(), BoxError> {
        self.open = None;
        self.pending.clear();
        self.inner.recover(Some(checkpoint))?;
        for (_, txn) in &recorded.pending {
            self.inner.commit(txn)?;
        }
        self.inner.sync_commits()?;
        if let Some(txn) = &recorded.open {
            self.inner.abort(txn)?;
        }
        self.last_barrier = checkpoint;
        Ok(())
    }

    fn encode_state(&self) -> Result<Vec<u8>, BoxError> {
        encode_state(&RecordedRef {
            pending: self.pending.iter().map(|p| (p.checkpoint, &p.txn)).collect(),
            open: self.open.as_ref().map(|o| &o.txn),
        })
    }
}

impl<T: Send + 'static, P: TwoPhaseCommit<T>> IoHandler for Target<T, P> {
    type Request = Request<T, P::Txn>;
    type Reply = Reply<T>;

    fn handle(&mut self, request: Self::Request) -> Result<Reply<T>, BoxError> {
        match request {
            Request::Start => {
                self.inner.recover(None)?;
                Ok(Reply::Done)
            }
            Request::Restore { checkpoint, recorded } => {
                self.restore(checkpoint, recorded)?;
                Ok(Reply::Done)
            }
            Request::Write(bufs) => Ok(Reply::Written(self.write(bufs)?)),
            Request::PreCommit { checkpoint, slot } => {
                self.pre_commit(checkpoint, &slot)?;
                Ok(Reply::Done)
            }
            Request::Commit {
                checkpoint,
                mut latencies,
            } => {
                self.commit_through(checkpoint, &mut latencies)?;
                Ok(Reply::Committed(latencies))
            }
            Request::Finish { mut latencies } => {
                self.finish(&mut latencies)?;
                Ok(Reply::Committed(latencies))
            }
        }
    }
}

/// A [`Sink`] over any [`TwoPhaseCommit`] target; see the module docs. The
/// target runs on the sink's own thread, started at the first call.
///
/// ```
/// use weir_core::harness::Harness;
/// use weir_core::Sink;
/// use weir_io::{FileTransactions, TwoPhaseCommitSink};
///
/// let dir = tempfile::tempdir().unwrap();
/// let encode = |r: &u32, out: &mut Vec<u8>| out.extend_from_slice(format!("{r}\n").as_bytes());
/// let mut sink = TwoPhaseCommitSink::new(FileTransactions::new(dir.path(), 0, encode, |_: &u32| 0));
/// let mut h = Harness::new(0, 1);
/// h.write_sink(&mut sink, &mut vec![1, 2]).unwrap();
/// let _state = sink.pre_commit(1).unwrap(); // flushed, fsynced, closed
/// sink.commit(1).unwrap(); // handed to the sink's thread, which renames
/// sink.wait_idle().unwrap(); // (tests and tools only: blocks)
/// let out = std::fs::read_to_string(dir.path().join("part-000-000000001.csv")).unwrap();
/// assert_eq!(out, "1\n2\n");
/// ```
pub struct TwoPhaseCommitSink<T: Send + 'static, P: TwoPhaseCommit<T>> {
    /// The target, until the sink's thread starts and takes it along.
    target: Option<Target<T, P>>,
    io: Option<IoThread<Target<T, P>>>,
    /// Records not yet handed to the thread, and when they arrived.
    staged: Vec<T>,
    arrivals: Vec<(usize, u64)>,
    /// Records handed to the thread and not yet reported written.
    in_flight_records: usize,
    /// Buffers back from the thread, for reuse.
    spare: Vec<WriteBufs<T>>,
    spare_latencies: Vec<Latencies>,
    /// Records written since the last barrier.
    epoch_records: u64,
    last_barrier: u64,
    /// Checkpoints whose transactions the thread pre-committed (or will),
    /// not yet committed: the thread's list, as this side knows it.
    pending: VecDeque<u64>,
    arrived: Arrived,
    visible: Visible,
    /// `finish` was called: ready once everything is done.
    finishing: bool,
    /// The waker was handed to the thread.
    waker_set: bool,
    /// See [`TwoPhaseCommitSink::max_buffered_records`].
    max_buffered: usize,
}

impl<T: Send + 'static, P: TwoPhaseCommit<T>> TwoPhaseCommitSink<T, P> {
    /// A sink committing through `inner`. Touches nothing: the sink's
    /// thread starts at the first call.
    pub fn new(inner: P) -> Self {
        TwoPhaseCommitSink {
            target: Some(Target::new(inner)),
            io: None,
            staged: Vec::new(),
            arrivals: Vec::new(),
            in_flight_records: 0,
            spare: Vec::new(),
            spare_latencies: Vec::new(),
            epoch_records: 0,
            last_barrier: 0,
            pending: VecDeque::new(),
            arrived: Arrived::default(),
            visible: Visible::default(),
            finishing: false,
            waker_set: false,
            max_buffered: DEFAULT_MAX_BUFFERED_RECORDS,
        }
    }

    /// Sets how many records may be staged or handed to the sink's thread
    /// and not yet written before [`Sink::ready`] says false (default
    /// [`DEFAULT_MAX_BUFFERED_RECORDS`]; at least one batch,
    /// [`BATCH_RECORDS`]). Smaller for a slow target, whose pre-commit
    /// waits for all of them; larger for a target whose syncs stall.
    pub fn max_buffered_records(mut self, records: usize) -> Self {
        self.max_buffered = records.max(BATCH_RECORDS);
        self
    }

    /// Checkpoints whose transactions are pre-committed, waiting for commit
    /// (as handed to the sink's thread: those of the last barriers may
    /// still be in progress there).
    pub fn pending_checkpoints(&self) -> Vec<u64> {
        self.pending.iter().copied().collect()
    }

    /// Records handed to the sink and not yet written into the target by
    /// its thread (staged, or in writes in flight). [`Sink::ready`] says
    /// false from [`TwoPhaseCommitSink::max_buffered_records`] on.
    pub fn buffered_records(&self) -> usize {
        self.staged.len() + self.in_flight_records
    }

    /// Waits (blocking) until the thread handled everything handed to it,
    /// staged records included, and takes its replies: for tests and tools,
    /// never on a worker. Fails with the thread's error if it failed.
    pub fn wait_idle(&mut self) -> Result<(), BoxError> {
        self.hand_over()?;
        if let Some(io) = &self.io {
            io.wait_for(io.last_ticket())?;
        }
        self.take_replies()
    }

    /// The sink's thread, started at the first call: with a fresh start
    /// (`recover(None)`) as its first request unless `restoring`.
    fn thread(&mut self, restoring: bool) -> Result<&mut IoThread<Target<T, P>>, BoxError> {
        if self.io.is_none() {
            let target = self
                .target
                .take()
                .ok_or("two-phase commit sink: its thread could not be started, and took the target along")?;
            let queue = self.max_buffered.div_ceil(BATCH_RECORDS) + 1 + CONTROL_QUEUE;
            let mut io = IoThread::spawn("weir-2pc", target, queue)
                .map_err(|e| format!("two-phase commit sink: cannot start its thread: {e}"))?;
            if !restoring {
                io.submit(Request::Start)?;
            }
            self.io = Some(io);
        }
        Ok(self.io.as_mut().expect("started above"))
    }

    /// The error the thread stopped with, if it failed.
    fn check(&self) -> Result<(), BoxError> {
        self.io.as_ref().map_or(Ok(()), |io| io.check())
    }

    /// Hands the staged records to the thread, if any.
    fn hand_over(&mut self) -> Result<(), BoxError> {
        if self.staged.is_empty() {
            return Ok(());
        }
        let mut bufs = self.spare.pop().unwrap_or_default();
        std::mem::swap(&mut bufs.records, &mut self.staged);
        std::mem::swap(&mut bufs.arrivals, &mut self.arrivals);
        bufs.len = bufs.records.len();
        let len = bufs.len;
        self.thread(false)?.submit(Request::Write(bufs))?;
        self.in_flight_records += len;
        Ok(())
    }

    /// Takes the thread's replies: recycles buffers, notes latencies.
    fn take_replies(&mut self) -> Result<(), BoxError> {
        let Some(io) = self.io.as_mut() else {
            return Ok(());
        };
        while let Some(reply) = io.try_reply()? {
            match reply {
                Reply::Done => {}
                Reply::Written(mut bufs) => {
                    self.in_flight_records -= bufs.len;
                    self.arrived.extend(&bufs.latencies);
                    bufs.latencies.clear();
                    if self.spare.len() <= SPARE_BATCHES {
                        self.spare.push(bufs);
                    }
                }
                Reply::Committed(mut latencies) => {
                    self.visible.extend(&latencies);
                    latencies.clear();
                    if self.spare_latencies.len() < SPARE_LATENCIES {
                        self.spare_latencies.push(latencies);
                    }
                }
            }
        }
        Ok(())
    }

    /// Hands this sink's worker to the thread for wake-ups, once.
    fn wake_me(&mut self, ctx: &SinkContext<'_>) -> Result<(), BoxError> {
        if !self.waker_set {
            self.thread(false)?.set_waker(ctx.waker());
            self.waker_set = true;
        }
        Ok(())
    }
}

/// The state a two-phase commit sink records: see [`decode_state`].
pub(crate) fn encode_state<X: Serialize>(recorded: &RecordedRef<'_, X>) -> Result<Vec<u8>, BoxError> {
    let mut out = vec![STATE_VERSION];
    postcard::to_io(recorded, &mut out)?;
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    Ok(out)
}

/// Decodes and verifies the state a two-phase commit sink recorded in
/// `checkpoint`: version byte, postcard-encoded transactions, CRC-32 of the
/// bytes before. Never panics; allocates at most what the transactions
/// take plus serde's cautious preallocation (1 MiB per sequence).
pub(crate) fn decode_state<X: DeserializeOwned>(checkpoint: u64, state: &[u8]) -> Result<Recorded<X>, Error> {
    let bad = |reason: String| Error::BadState {
        sink: "two-phase commit sink".to_string(),
        checkpoint,
        reason,
    };
    if state.len() < 5 || state[0] != STATE_VERSION {
        return Err(bad(format!(
            "not a version-{STATE_VERSION} state of {} bytes",
            state.len()
        )));
    }
    let (body, crc) = state.split_at(state.len() - 4);
    let stored = u32::from_le_bytes(crc.try_into().expect("4 bytes"));
    let actual = crc32fast::hash(body);
    if stored != actual {
        return Err(bad(format!(
            "CRC mismatch: stored {stored:#010x}, computed {actual:#010x}"
        )));
    }
    postcard::from_bytes(&body[1..]).map_err(|e| bad(format!("cannot decode the transactions: {e}")))
}

impl<T, P> Sink<T> for TwoPhaseCommitSink<T, P>
where
    T: Send + 'static,
    P: TwoPhaseCommit<T>,
{
    fn write(&mut self, batch: &mut Vec<T>, ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
        self.check()?;
        if batch.is_empty() {
            return Ok(());
        }
        self.wake_me(ctx)?;
        let now = ctx.now_ns();
        self.epoch_records += batch.len() as u64;
        self.staged.append(batch);
        match self.arrivals.last_mut() {
            Some(last) if last.1 == now => last.0 = self.staged.len(),
            _ => self.arrivals.push((self.staged.len(), now)),
        }
        if self.staged.len() >= BATCH_RECORDS {
            self.take_replies()?;
            self.hand_over()?;
        }
        Ok(())
    }

    fn open(&mut self, ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
        // The thread, and the fresh start (or nothing, after a restore), before
        // the first record.
        self.wake_me(ctx)
    }

    fn ready(&mut self, ctx: &mut SinkContext<'_>) -> Result<bool, BoxError> {
        if self.io.is_some() {
            self.wake_me(ctx)?;
        }
        self.take_replies()?;
        if self.finishing {
            self.arrived.flush_all(ctx);
            self.visible.flush_all(ctx);
        } else {
            self.arrived.flush(ctx);
            self.visible.flush(ctx);
        }
        if self.finishing {
            return Ok(self.io.as_ref().is_none_or(|io| io.in_flight() == 0));
        }
        Ok(self.buffered_records() < self.max_buffered)
    }

    fn finish(&mut self, _ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
        self.check()?;
        self.hand_over()?;
        let latencies = self.spare_latencies.pop().unwrap_or_default();
        self.thread(false)?.submit(Request::Finish { latencies })?;
        self.pending.clear();
        self.epoch_records = 0;
        self.finishing = true;
        Ok(())
    }

    fn pre_commit(&mut self, checkpoint: u64) -> Result<Vec<u8>, BoxError> {
        self.pre_commit_detached(checkpoint)?.wait()
    }

    fn pre_commit_detached(&mut self, checkpoint: u64) -> Result<PreCommit, BoxError> {
        self.check()?;
        assert!(
            checkpoint > self.last_barrier,
            "barrier {checkpoint} after barrier {}: barrier ids must increase",
            self.last_barrier
        );
        self.last_barrier = checkpoint;
        // Everything written before the barrier, then the barrier, in order.
        self.hand_over()?;
        if std::mem::take(&mut self.epoch_records) > 0 {
            self.pending.push_back(checkpoint);
        }
        let slot = StateSlot::default();
        let io = self.thread(false)?;
        let ticket = io.submit(Request::PreCommit {
            checkpoint,
            slot: Arc::clone(&slot),
        })?;
        let done = io.completion(ticket);
        Ok(PreCommit::deferred(Box::new(move || -> Result<Vec<u8>, BoxError> {
            done()?;
            let state = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
            state.ok_or_else(|| format!("two-phase commit sink: no state for checkpoint {checkpoint}").into())
        })))
    }

    fn commit(&mut self, checkpoint: u64) -> Result<(), BoxError> {
        self.check()?;
        if self.pending.front().is_none_or(|&c| c > checkpoint) {
            // Nothing to commit: the thread would do nothing.
            return Ok(());
        }
        while self.pending.front().is_some_and(|&c| c <= checkpoint) {
            self.pending.pop_front();
        }
        let latencies = self.spare_latencies.pop().unwrap_or_default();
        self.thread(false)?.submit(Request::Commit { checkpoint, latencies })?;
        Ok(())
    }

    fn abort(&mut self, _checkpoint: u64) -> Result<(), BoxError> {
        // Flink semantics: keep the pre-committed transaction; the next
        // completed checkpoint commits it. Nothing for the thread to do.
        self.check()
    }

    fn restore(&mut self, checkpoint: u64, state: &[u8]) -> Result<(), BoxError> {
        let recorded = decode_state::<P::Txn>(checkpoint, state)?;
        // Meant for a new instance; on a used one, what it staged is gone
        // and the restore follows what its thread was handed before.
        self.staged.clear();
        self.arrivals.clear();
        self.pending.clear();
        self.epoch_records = 0;
        self.finishing = false;
        self.last_barrier = checkpoint;
        // On the sink's thread, like every call of the target; this thread
        // (the one that starts the job) waits for it.
        let io = self.thread(true)?;
        let ticket = io.submit(Request::Restore { checkpoint, recorded })?;
        io.wait_for(ticket)?;
        self.take_replies()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::thread::ThreadId;
    use std::time::Duration;
    use weir_core::harness::Harness;

    /// An in-memory target: transactions stage records by epoch, commit
    /// appends them to `committed` once per epoch. Every call is logged
    /// (`(what, epoch)`), and one made on the thread that built the target
    /// (the test's: the worker's part) sets `on_caller`.
    #[derive(Clone)]
    struct Mem {
        caller: ThreadId,
        on_caller: Arc<AtomicBool>,
        log: Arc<Mutex<Vec<(&'static str, u64)>>>,
        staged: Arc<Mutex<BTreeMap<u64, Vec<u64>>>>,
        committed: Arc<Mutex<Vec<u64>>>,
        committed_epochs: Arc<Mutex<Vec<u64>>>,
        /// Pre-commits fail while set.
        refuse: Arc<AtomicBool>,
        /// Sleep per write, and per pre-commit.
        write_sleep: Duration,
        pre_commit_sleep: Duration,
    }

    impl Mem {
        fn new() -> Self {
            Mem {
                caller: std::thread::current().id(),
                on_caller: Arc::default(),
                log: Arc::default(),
                staged: Arc::default(),
                committed: Arc::default(),
                committed_epochs: Arc::default(),
                refuse: Arc::default(),
                write_sleep: Duration::ZERO,
                pre_commit_sleep: Duration::ZERO,
            }
        }

        fn note(&self, what: &'static str, epoch: u64) {
            if std::thread::current().id() == self.caller {
                self.on_caller.store(true, Ordering::SeqCst);
            }
            self.log.lock().unwrap().push((what, epoch));
        }

        fn log(&self) -> Vec<(&'static str, u64)> {
            self.log.lock().unwrap().clone()
        }

        fn committed(&self) -> Vec<u64> {
            self.committed.lock().unwrap().clone()
        }

        fn position(&self, what: &'static str, epoch: u64) -> usize {
            let log = self.log();
            log.iter()
                .position(|e| *e == (what, epoch))
                .unwrap_or_else(|| panic!("no {what} of epoch {epoch} in {log:?}"))
        }
    }

    impl TwoPhaseCommit<u64> for Mem {
        /// (epoch, records)
        type Txn = (u64, u64);

        fn begin_transaction(&mut self, epoch: u64) -> Result<Self::Txn, BoxError> {
            self.note("begin", epoch);
            Ok((epoch, 0))
        }
        fn write(&mut self, txn: &mut Self::Txn, batch: &mut Vec<u64>) -> Result<(), BoxError> {
            self.note("write", txn.0);
            std::thread::sleep(self.write_sleep);
            txn.1 += batch.len() as u64;
            self.staged.lock().unwrap().entry(txn.0).or_default().append(batch);
            Ok(())
        }
        fn pre_commit(&mut self, txn: &mut Self::Txn) -> Result<(), BoxError> {
            self.note("pre_commit", txn.0);
            std::thread::sleep(self.pre_commit_sleep);
            if self.refuse.load(Ordering::SeqCst) {
                return Err("injected: the disk refused".into());
            }
            Ok(())
        }
        fn commit(&mut self, txn: &Self::Txn) -> Result<(), BoxError> {
            self.note("commit", txn.0);
            let mut epochs = self.committed_epochs.lock().unwrap();
            if !epochs.contains(&txn.0) {
                epochs.push(txn.0);
                let rows = self.staged.lock().unwrap().remove(&txn.0).unwrap_or_default();
                assert_eq!(rows.len() as u64, txn.1, "epoch {} lost records", txn.0);
                self.committed.lock().unwrap().extend(rows);
            }
            Ok(())
        }
        fn sync_commits(&mut self) -> Result<(), BoxError> {
            self.note("sync_commits", 0);
            Ok(())
        }
        fn abort(&mut self, txn: &Self::Txn) -> Result<(), BoxError> {
            self.note("abort", txn.0);
            self.staged.lock().unwrap().remove(&txn.0);
            Ok(())
        }
        fn recover(&mut self, restored: Option<u64>) -> Result<(), BoxError> {
            self.note("recover", restored.unwrap_or(0));
            Ok(())
        }
        fn emitted_ns(&self, _record: &u64) -> u64 {
            if std::thread::current().id() == self.caller {
                self.on_caller.store(true, Ordering::SeqCst);
            }
            0
        }
    }

    fn write(sink: &mut TwoPhaseCommitSink<u64, Mem>, h: &mut Harness, records: std::ops::Range<u64>) {
        h.write_sink(sink, &mut records.collect()).unwrap();
    }

    /// Every method of the target runs on the sink's thread: a write, a
    /// barrier, a commit, the end and a restore, with the test's thread
    /// playing the worker (and the job's starting thread).
    #[test]
    fn the_target_never_runs_on_the_callers_thread() {
        let mem = Mem::new();
        let mut sink = TwoPhaseCommitSink::new(mem.clone());
        let mut h = Harness::new(0, 1);
        write(&mut sink, &mut h, 0..10);
        assert!(h.ready_sink(&mut sink).unwrap());
        let state = sink.pre_commit(1).unwrap();
        sink.commit(1).unwrap();
        write(&mut sink, &mut h, 10..15);
        let _ = sink.pre_commit(2).unwrap();
        sink.abort(2).unwrap();
        h.finish_sink(&mut sink).unwrap();
        assert_eq!(mem.committed(), (0..15).collect::<Vec<_>>());
        drop(sink);

        let mut again = TwoPhaseCommitSink::new(mem.clone());
        again.restore(1, &state).unwrap();
        let calls: std::collections::BTreeSet<&str> = mem.log().iter().map(|e| e.0).collect();
        let all = [
            "abort",
            "begin",
            "commit",
            "pre_commit",
            "recover",
            "sync_commits",
            "write",
        ];
        assert_eq!(calls, all.into_iter().collect(), "every method was called");
        assert!(
            !mem.on_caller.load(Ordering::SeqCst),
            "a method of the target ran on the caller's thread: {:?}",
            mem.log()
        );
    }

    /// A failing pre-commit fails its checkpoint's job, then the sink's
    /// every call; the thread handles nothing after it, so nothing of it or
    /// after it is ever committed.
    #[test]
    fn a_failed_pre_commit_fails_the_job_then_every_call_and_commits_nothing_after() {
        let mem = Mem::new();
        let mut sink = TwoPhaseCommitSink::new(mem.clone());
        let mut h = Harness::new(0, 1);
        write(&mut sink, &mut h, 0..2);
        let _ = sink.pre_commit(1).unwrap();
        sink.commit(1).unwrap();
        write(&mut sink, &mut h, 2..3);
        mem.refuse.store(true, Ordering::SeqCst);
        let job = sink.pre_commit_detached(2).unwrap();
        assert!(job.is_detached());
        let err = job.wait().unwrap_err().to_string();
        assert!(
            err.contains("the disk refused") && err.contains("checkpoint 2 could not be made durable"),
            "{err}"
        );
        mem.refuse.store(false, Ordering::SeqCst);
        let logged = mem.log().len();
        let errors = [
            sink.commit(2).unwrap_err(),
            h.ready_sink(&mut sink).unwrap_err(),
            h.write_sink(&mut sink, &mut vec![3]).unwrap_err(),
            sink.pre_commit_detached(3).unwrap_err(),
            sink.abort(3).unwrap_err(),
            h.finish_sink(&mut sink).unwrap_err(),
            sink.wait_idle().unwrap_err(),
        ];
        for e in errors {
            assert!(e.to_string().contains("could not be made durable"), "{e}");
        }
        assert_eq!(mem.committed(), vec![0, 1], "only what the first checkpoint covered");
        assert_eq!(mem.log().len(), logged, "the thread handled nothing after the failure");
        assert_eq!(mem.log().last(), Some(&("pre_commit", 2)));
    }

    /// Commit of checkpoint `n` runs on the thread after its pre-commit,
    /// even when called before that finished, and commits nothing written
    /// after the barrier; the next checkpoint's commit does.
    #[test]
    fn commits_follow_their_pre_commit_and_leave_later_records_alone() {
        let mem = Mem {
            pre_commit_sleep: Duration::from_millis(30),
            ..Mem::new()
        };
        let mut sink = TwoPhaseCommitSink::new(mem.clone());
        let mut h = Harness::new(0, 1);
        write(&mut sink, &mut h, 0..2);
        let first = sink.pre_commit_detached(1).unwrap();
        write(&mut sink, &mut h, 2..3);
        // Called while the thread is still in the pre-commit (the runtime
        // would wait for the job; the order must not depend on it).
        sink.commit(1).unwrap();
        write(&mut sink, &mut h, 3..4);
        sink.wait_idle().unwrap();
        assert_eq!(mem.committed(), vec![0, 1]);
        first.wait().unwrap();
        let _ = sink.pre_commit(2).unwrap();
        assert_eq!(mem.committed(), vec![0, 1], "pre-committed, not committed");
        assert_eq!(sink.pending_checkpoints(), vec![2]);
        sink.commit(2).unwrap();
        sink.wait_idle().unwrap();
        assert_eq!(mem.committed(), vec![0, 1, 2, 3]);
        assert!(sink.pending_checkpoints().is_empty());
        let pre1 = mem.position("pre_commit", 1);
        let commit1 = mem.position("commit", 1);
        let write2 = mem.position("write", 2);
        let pre2 = mem.position("pre_commit", 2);
        let commit2 = mem.position("commit", 2);
        assert!(pre1 < commit1, "{:?}", mem.log());
        assert!(
            commit1 < write2,
            "the records after the barrier were handed over after the commit"
        );
        assert!(write2 < pre2 && pre2 < commit2, "{:?}", mem.log());
    }

    /// With a slow target, a sink driven like the runtime (records only
    /// while `ready`) stops taking records at the bound: staged and in
    /// flight never exceed it by more than one batch, and nothing is lost.
    #[test]
    fn a_slow_target_backpressures_and_loses_nothing() {
        let mem = Mem {
            write_sleep: Duration::from_millis(2),
            ..Mem::new()
        };
        let mut sink = TwoPhaseCommitSink::new(mem.clone());
        let mut h = Harness::new(0, 1);
        let (total, batch) = (120_000u64, 1_000u64);
        let (mut next, mut not_ready, mut most) = (0u64, 0u64, 0usize);
        while next < total {
            if !h.ready_sink(&mut sink).unwrap() {
                not_ready += 1;
                std::thread::sleep(Duration::from_micros(200));
                continue;
            }
            let hi = (next + batch).min(total);
            write(&mut sink, &mut h, next..hi);
            next = hi;
            most = most.max(sink.buffered_records());
            assert!(
                sink.buffered_records() <= DEFAULT_MAX_BUFFERED_RECORDS + batch as usize,
                "{} records buffered",
                sink.buffered_records()
            );
        }
        assert!(not_ready > 0, "the sink never backpressured");
        assert!(
            most >= DEFAULT_MAX_BUFFERED_RECORDS,
            "the bound was never reached: {most}"
        );
        let _ = sink.pre_commit(1).unwrap();
        sink.commit(1).unwrap();
        h.finish_sink(&mut sink).unwrap();
        assert_eq!(sink.buffered_records(), 0);
        assert_eq!(mem.committed(), (0..total).collect::<Vec<_>>());
        let writes = mem.log().iter().filter(|e| e.0 == "write").count() as u64;
        assert!(
            writes <= total / BATCH_RECORDS as u64 + 1,
            "{writes} writes: records are handed over in batches"
        );
    }
}
