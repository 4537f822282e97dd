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
//!   under checkpoint `n`; the next transaction is begun. The checkpoint
//!   records the handles ([`TwoPhaseCommit::Txn`]) of every pending
//!   transaction and of the open one. The target's disk waits (its
//!   [`TwoPhaseCommit::pre_commit_detached`] and
//!   [`TwoPhaseCommit::sync_commits_detached`] jobs) run off the worker
//!   thread, before the checkpoint is acknowledged: each pending
//!   transaction remembers whether its sync ran, and a checkpoint's job
//!   first finishes the syncs of every transaction it records (those of an
//!   aborted checkpoint included), then every commit sync not known done
//!   (a job the runtime dropped unrun leaves its syncs to the next one).
//!   A failed sync poisons the sink: the
//!   checkpoint is declined and the sink's next call fails the task, whose
//!   restart restores the last completed checkpoint.
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
//! Implementations here: [`FileTransactions`] (a temporary file renamed
//! into the target folder) and [`SqliteTransactions`] (a staging table
//! moved into the target table in one database transaction with a
//! committed-epoch fence).

pub mod file;
pub mod sqlite;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use weir_core::{clock, BoxError, PreCommit, Sink, SinkContext, SyncJob};

use crate::latency::{StampRuns, Visible};
use crate::Error;

pub use file::{FileTransactions, FileTxn, FILE_FAULT_POINTS};
pub use sqlite::{SqliteTransactions, SqliteTxn, SQLITE_FAULT_POINTS};

/// A transactional target, driven by [`TwoPhaseCommitSink`]; one instance
/// per sink subtask.
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
    fn write(&mut self, txn: &mut Self::Txn, batch: &mut Vec<T>) -> Result<(), BoxError>;

    /// Makes `txn` durable, but not yet visible: after this returns, a crash
    /// must not lose it and [`TwoPhaseCommit::commit`] must be able to
    /// finish it from the handle alone.
    fn pre_commit(&mut self, txn: &mut Self::Txn) -> Result<(), BoxError>;

    /// [`TwoPhaseCommit::pre_commit`] with its disk waits left to the
    /// returned job, which [`TwoPhaseCommitSink`] runs off the worker
    /// thread before the checkpoint is acknowledged (and before `txn` is
    /// ever committed). The target may go on writing other transactions
    /// meanwhile. The default pre-commits here and leaves nothing.
    fn pre_commit_detached(&mut self, txn: &mut Self::Txn) -> Result<Option<SyncJob>, BoxError> {
        self.pre_commit(txn)?;
        Ok(None)
    }

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
    /// file sink's folder fsyncs land here, after the pre-commit's file
    /// sync, where the file system usually has nothing left to write.
    fn sync_commits(&mut self) -> Result<(), BoxError> {
        Ok(())
    }

    /// [`TwoPhaseCommit::sync_commits`] with its disk waits left to the
    /// returned job, run like [`TwoPhaseCommit::pre_commit_detached`]'s,
    /// after the jobs of the transactions the checkpoint records. The
    /// job must cover every change made before this call. The default
    /// syncs here and leaves nothing.
    fn sync_commits_detached(&mut self) -> Result<Option<SyncJob>, BoxError> {
        self.sync_commits()?;
        Ok(None)
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
    /// visibility latency; 0 (the default) means unknown.
    fn emitted_ns(&self, _record: &T) -> u64 {
        0
    }
}

/// What a checkpoint records, as written.
#[derive(Serialize)]
struct RecordedRef<'a, X> {
    pending: Vec<(u64, &'a X)>,
    open: Option<&'a X>,
}

/// What a checkpoint records, as read back.
#[derive(Deserialize)]
struct Recorded<X> {
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
    /// Its pre-commit's detached sync.
    sync: Arc<OnceSync>,
}

/// A detached sync that runs once, whichever checkpoint's job gets to it
/// first; a later job waits for a running one and sees its outcome. A
/// failure stays a failure: a sync is never retried (after a failed fsync
/// the kernel may have dropped the data and a second fsync can succeed).
struct OnceSync(Mutex<SyncState>);

enum SyncState {
    Todo(SyncJob),
    Done,
    Failed(String),
}

impl OnceSync {
    fn new(job: Option<SyncJob>) -> Arc<Self> {
        Arc::new(OnceSync(Mutex::new(job.map_or(SyncState::Done, SyncState::Todo))))
    }

    /// Whether the sync ran and succeeded. Never waits: a sync in flight
    /// (its lock held by a job) counts as not done, so the worker asking
    /// at a barrier does not wait for the disk; the new job will.
    fn is_done(&self) -> bool {
        match self.0.try_lock() {
            Ok(state) => matches!(*state, SyncState::Done),
            Err(std::sync::TryLockError::WouldBlock) => false,
            Err(std::sync::TryLockError::Poisoned(p)) => matches!(*p.into_inner(), SyncState::Done),
        }
    }

    /// Runs the sync unless it ran; its outcome.
    fn run(&self) -> Result<(), String> {
        let mut state = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match std::mem::replace(&mut *state, SyncState::Done) {
            SyncState::Todo(job) => job().map_err(|e| {
                let msg = e.to_string();
                *state = SyncState::Failed(msg.clone());
                msg
            }),
            SyncState::Done => Ok(()),
            SyncState::Failed(msg) => {
                *state = SyncState::Failed(msg.clone());
                Err(msg)
            }
        }
    }
}

/// Set by a failed detached sync; every later call of the sink fails.
#[derive(Default)]
struct Poison(Mutex<Option<String>>);

impl Poison {
    fn set(&self, msg: &str) {
        let mut p = self.0.lock().unwrap_or_else(|p| p.into_inner());
        p.get_or_insert_with(|| msg.to_string());
    }

    fn check(&self) -> Result<(), BoxError> {
        match &*self.0.lock().unwrap_or_else(|p| p.into_inner()) {
            None => Ok(()),
            Some(msg) => Err(format!(
                "two-phase commit sink: an earlier pre-commit could not be made durable ({msg}); \
                 the job restarts from its last completed checkpoint"
            )
            .into()),
        }
    }
}

/// The open transaction.
struct Open<X> {
    txn: X,
    records: u64,
    stamps: StampRuns,
}

/// A [`Sink`] over any [`TwoPhaseCommit`] target; see the module docs.
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
/// sink.commit(1).unwrap(); // renamed into the target folder
/// let out = std::fs::read_to_string(dir.path().join("part-000-000000001.csv")).unwrap();
/// assert_eq!(out, "1\n2\n");
/// ```
pub struct TwoPhaseCommitSink<T, P: TwoPhaseCommit<T>> {
    inner: P,
    /// `recover` was called.
    started: bool,
    last_barrier: u64,
    open: Option<Open<P::Txn>>,
    pending: VecDeque<Pending<P::Txn>>,
    spare_stamps: Vec<StampRuns>,
    visible: Visible,
    /// A detached sync failed: see the module docs.
    poison: Arc<Poison>,
    /// Detached syncs of commits (`sync_commits_detached`) not known done:
    /// a job dropped unrun leaves its sync to the next checkpoint's job.
    commit_syncs: Vec<Arc<OnceSync>>,
    _records: std::marker::PhantomData<fn(T)>,
}

impl<T, P: TwoPhaseCommit<T>> TwoPhaseCommitSink<T, P> {
    /// A sink committing through `inner`.
    pub fn new(inner: P) -> Self {
        TwoPhaseCommitSink {
            inner,
            started: false,
            last_barrier: 0,
            open: None,
            pending: VecDeque::new(),
            spare_stamps: Vec::new(),
            visible: Visible::default(),
            poison: Arc::default(),
            commit_syncs: Vec::new(),
            _records: std::marker::PhantomData,
        }
    }

    /// The target.
    pub fn inner(&self) -> &P {
        &self.inner
    }

    /// Checkpoints whose transactions are pre-committed, waiting for commit.
    pub fn pending_checkpoints(&self) -> Vec<u64> {
        self.pending.iter().map(|p| p.checkpoint).collect()
    }

    fn start(&mut self) -> Result<(), BoxError> {
        if !self.started {
            self.inner.recover(None)?;
            self.started = true;
        }
        Ok(())
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

    /// Commits the pending transactions of checkpoints up to `n`, in order.
    fn commit_through(&mut self, n: u64) -> Result<(), BoxError> {
        self.poison.check()?;
        while self.pending.front().is_some_and(|p| p.checkpoint <= n) {
            let p = self.pending.front().expect("checked above");
            // Checkpoint `n` was acknowledged after the syncs of all it
            // records: this finds them done (and fails if one failed).
            p.sync.run()?;
            self.inner.commit(&p.txn)?;
            let mut p = self.pending.pop_front().expect("checked above");
            self.visible.add(&p.stamps, clock::now_ns());
            p.stamps.clear();
            self.spare_stamps.push(p.stamps);
        }
        Ok(())
    }

    fn encode_state(&self) -> Result<Vec<u8>, BoxError> {
        let recorded = RecordedRef {
            pending: self.pending.iter().map(|p| (p.checkpoint, &p.txn)).collect(),
            open: self.open.as_ref().map(|o| &o.txn),
        };
        let mut out = vec![STATE_VERSION];
        postcard::to_io(&recorded, &mut out)?;
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        Ok(out)
    }

    fn decode_state(checkpoint: u64, state: &[u8]) -> Result<Recorded<P::Txn>, Error> {
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
}

impl<T, P> Sink<T> for TwoPhaseCommitSink<T, P>
where
    T: Send + 'static,
    P: TwoPhaseCommit<T>,
{
    fn write(&mut self, batch: &mut Vec<T>, ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
        self.start()?;
        self.visible.flush(ctx);
        if batch.is_empty() {
            return Ok(());
        }
        self.begin()?;
        let open = self.open.as_mut().expect("begun above");
        for r in batch.iter() {
            open.stamps.push(self.inner.emitted_ns(r));
        }
        crate::latency::record_arrival(ctx, batch, |r| self.inner.emitted_ns(r));
        open.records += batch.len() as u64;
        self.inner.write(&mut open.txn, batch)?;
        batch.clear();
        Ok(())
    }

    fn finish(&mut self, ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
        self.start()?;
        if let Some(mut open) = self.open.take() {
            if open.records > 0 {
                // Without checkpointing: commit the only transaction now.
                self.inner.pre_commit(&mut open.txn)?;
                self.pending.push_back(Pending {
                    checkpoint: self.last_barrier + 1,
                    txn: open.txn,
                    stamps: open.stamps,
                    sync: OnceSync::new(None),
                });
            } else {
                self.inner.abort(&open.txn)?;
            }
        }
        self.commit_through(u64::MAX)?;
        self.inner.sync_commits()?;
        self.visible.flush(ctx);
        Ok(())
    }

    fn pre_commit(&mut self, checkpoint: u64) -> Result<Vec<u8>, BoxError> {
        self.pre_commit_detached(checkpoint)?.wait()
    }

    fn pre_commit_detached(&mut self, checkpoint: u64) -> Result<PreCommit, BoxError> {
        self.start()?;
        self.poison.check()?;
        assert!(
            checkpoint > self.last_barrier,
            "barrier {checkpoint} after barrier {}: barrier ids must increase",
            self.last_barrier
        );
        self.last_barrier = checkpoint;
        if self.open.as_ref().is_some_and(|o| o.records > 0) {
            let mut open = self.open.take().expect("checked above");
            let job = self.inner.pre_commit_detached(&mut open.txn)?;
            self.pending.push_back(Pending {
                checkpoint,
                txn: open.txn,
                stamps: open.stamps,
                sync: OnceSync::new(job),
            });
        }
        // Commits since the last barrier, which this checkpoint no longer
        // records, become durable before it is acknowledged.
        let commits = self.inner.sync_commits_detached()?;
        // Begin the next transaction now, so the checkpoint records it and
        // a restore can abort whatever it left behind.
        self.begin()?;
        let state = self.encode_state()?;
        // Every transaction this checkpoint records must be durable before
        // it is acknowledged, those of an aborted checkpoint included.
        // Then the commits' syncs, this one's and any a dropped job left.
        self.commit_syncs.retain(|s| !s.is_done());
        if let Some(commits) = commits {
            self.commit_syncs.push(OnceSync::new(Some(commits)));
        }
        let syncs: Vec<Arc<OnceSync>> = self
            .pending
            .iter()
            .map(|p| &p.sync)
            .filter(|s| !s.is_done())
            .chain(&self.commit_syncs)
            .map(Arc::clone)
            .collect();
        if syncs.is_empty() {
            return Ok(PreCommit::done(state));
        }
        let poison = Arc::clone(&self.poison);
        let job: SyncJob = Box::new(move || {
            let result = syncs.iter().try_for_each(|s| s.run());
            result.map_err(|msg| {
                poison.set(&msg);
                BoxError::from(msg)
            })
        });
        Ok(PreCommit::with_sync(state, job))
    }

    fn commit(&mut self, checkpoint: u64) -> Result<(), BoxError> {
        self.commit_through(checkpoint)
    }

    fn abort(&mut self, _checkpoint: u64) -> Result<(), BoxError> {
        // Flink semantics: keep the pre-committed transaction; the next
        // completed checkpoint commits it.
        Ok(())
    }

    fn restore(&mut self, checkpoint: u64, state: &[u8]) -> Result<(), BoxError> {
        let recorded = Self::decode_state(checkpoint, state)?;
        self.poison = Arc::default();
        self.commit_syncs.clear();
        self.open = None;
        self.pending.clear();
        self.inner.recover(Some(checkpoint))?;
        self.started = true;
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use weir_core::harness::Harness;

    /// An in-memory target whose pre-commit syncs are detached: `synced`
    /// lists the epochs whose sync ran, `fail` makes the next syncs fail,
    /// and a commit of an epoch whose sync did not run panics.
    #[derive(Clone, Default)]
    struct Mem {
        synced: Arc<Mutex<Vec<u64>>>,
        committed: Arc<Mutex<Vec<u64>>>,
        fail: Arc<AtomicBool>,
        /// Detached commit syncs that ran.
        commit_syncs: Arc<AtomicUsize>,
    }

    impl TwoPhaseCommit<u64> for Mem {
        type Txn = (u64, Vec<u64>);

        fn begin_transaction(&mut self, epoch: u64) -> Result<Self::Txn, BoxError> {
            Ok((epoch, Vec::new()))
        }
        fn write(&mut self, txn: &mut Self::Txn, batch: &mut Vec<u64>) -> Result<(), BoxError> {
            txn.1.append(batch);
            Ok(())
        }
        fn pre_commit(&mut self, txn: &mut Self::Txn) -> Result<(), BoxError> {
            match self.pre_commit_detached(txn)? {
                Some(sync) => sync(),
                None => Ok(()),
            }
        }
        fn pre_commit_detached(&mut self, txn: &mut Self::Txn) -> Result<Option<SyncJob>, BoxError> {
            let (epoch, synced, fail) = (txn.0, Arc::clone(&self.synced), Arc::clone(&self.fail));
            Ok(Some(Box::new(move || {
                if fail.load(Ordering::SeqCst) {
                    return Err("injected: the disk refused".into());
                }
                synced.lock().unwrap().push(epoch);
                Ok(())
            })))
        }
        fn commit(&mut self, txn: &Self::Txn) -> Result<(), BoxError> {
            assert!(
                self.synced.lock().unwrap().contains(&txn.0),
                "epoch {} committed before its sync ran",
                txn.0
            );
            let mut c = self.committed.lock().unwrap();
            if !c.contains(&txn.1[0]) {
                c.extend_from_slice(&txn.1);
            }
            Ok(())
        }
        fn sync_commits_detached(&mut self) -> Result<Option<SyncJob>, BoxError> {
            let n = Arc::clone(&self.commit_syncs);
            Ok(Some(Box::new(move || {
                n.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })))
        }
        fn abort(&mut self, _txn: &Self::Txn) -> Result<(), BoxError> {
            Ok(())
        }
    }

    fn write(sink: &mut TwoPhaseCommitSink<u64, Mem>, h: &mut Harness, records: &[u64]) {
        h.write_sink(sink, &mut records.to_vec()).unwrap();
    }

    /// The pre-commit leaves its sync to the job; a checkpoint given up
    /// before its job ran has its transaction synced by the next
    /// checkpoint's job, once, and committed with it.
    #[test]
    fn detached_syncs_run_once_and_an_aborted_checkpoint_s_with_the_next() {
        let mem = Mem::default();
        let mut sink = TwoPhaseCommitSink::new(mem.clone());
        let mut h = Harness::new(0, 1);
        write(&mut sink, &mut h, &[1, 2]);
        let first = sink.pre_commit_detached(1).unwrap();
        assert!(mem.synced.lock().unwrap().is_empty(), "nothing synced on the worker");
        sink.abort(1).unwrap(); // its job has not run
        write(&mut sink, &mut h, &[3]);
        let second = sink.pre_commit_detached(2).unwrap();
        assert!(second.is_detached(), "two transactions to sync");
        second.wait().unwrap();
        assert_eq!(*mem.synced.lock().unwrap(), vec![1, 2]);
        assert_eq!(
            mem.commit_syncs.load(Ordering::SeqCst),
            2,
            "the dropped job's commit sync ran too"
        );
        sink.commit(2).unwrap();
        assert_eq!(*mem.committed.lock().unwrap(), vec![1, 2, 3]);
        // The first job, late: its transaction's sync already ran.
        assert!(first.is_detached(), "one transaction to sync");
        first.wait().unwrap();
        assert_eq!(*mem.synced.lock().unwrap(), vec![1, 2]);
        assert_eq!(mem.commit_syncs.load(Ordering::SeqCst), 2, "a sync ran twice");
        // A barrier with nothing to pre-commit leaves only its commit sync.
        let third = sink.pre_commit_detached(3).unwrap();
        assert!(third.is_detached(), "the commit sync");
        third.wait().unwrap();
        assert_eq!(mem.commit_syncs.load(Ordering::SeqCst), 3);
    }

    /// A failed sync is never retried and poisons the sink: the next
    /// commit and pre-commit fail (the task fails and restarts from its
    /// last completed checkpoint), nothing it covered is committed.
    #[test]
    fn a_failed_detached_sync_poisons_the_sink() {
        let mem = Mem::default();
        let mut sink = TwoPhaseCommitSink::new(mem.clone());
        let mut h = Harness::new(0, 1);
        write(&mut sink, &mut h, &[1]);
        let pc = sink.pre_commit_detached(1).unwrap();
        mem.fail.store(true, Ordering::SeqCst);
        let err = pc.wait().unwrap_err();
        assert!(err.to_string().contains("the disk refused"), "{err}");
        mem.fail.store(false, Ordering::SeqCst);
        for e in [sink.commit(1).unwrap_err(), sink.pre_commit_detached(2).unwrap_err()] {
            assert!(e.to_string().contains("could not be made durable"), "{e}");
        }
        assert!(mem.committed.lock().unwrap().is_empty());
        assert!(mem.synced.lock().unwrap().is_empty(), "the failed sync was retried");
    }
}
