//! Where a WAL sink's committed epochs go: the [`EpochTarget`] contract,
//! and [`FileTarget`], one file per epoch in a folder.
//!
//! The write-ahead log makes an epoch's records durable at its barrier;
//! what differs between targets is only how a completed checkpoint's
//! epochs are published and how the target remembers what it published.
//! The log, its threads, backpressure and restore are the same for every
//! target (see [`super`]), so a new target (a Kafka topic, a database)
//! only writes this trait.
//!
//! The contract, for the committer thread that drives a target:
//!
//! 1. [`EpochTarget::open`] once, before anything else: the target makes
//!    what it needs, removes this sink subtask's leftovers of a commit cut
//!    short, and says what it records as committed (`None`: nothing yet).
//! 2. Per commit: for each epoch in order, [`EpochTarget::begin`], then
//!    [`EpochTarget::write`] with the epoch's record payloads (whole
//!    records, as the sink's `encode` wrote them, concatenated; a call
//!    never splits a record), then [`EpochTarget::end`]; then
//!    [`EpochTarget::publish`], which makes those epochs visible and
//!    records the commit, in that order or atomically. The record is
//!    durable when `publish` returns, unless the target has
//!    [`EpochTarget::LAZY_RECORD`]: then it is durable once
//!    [`EpochTarget::sync_record`] returned. Only once the record of a
//!    commit is durable may the log before the commit's position be
//!    deleted.
//!
//!    A target with [`EpochTarget::STAGES`] may also get begin, write and
//!    end for an epoch *before* its checkpoint completes (staging, so that
//!    the commit only publishes): then its `publish` must make visible
//!    only the epochs up to the `committed` epoch it is given, and keep
//!    the later staged ones for a later publish. Staged output that is
//!    never published (the job failed first) must stay invisible and be
//!    removed by the next `open`.
//! 3. Publishing an epoch again (a restore re-commits everything after the
//!    recorded commit) must leave the output as if it was published once:
//!    the file target rewrites the same file under the same name; a
//!    transactional target publishes the epochs and its record of the
//!    commit in one transaction, so a commit is either whole or absent.
//! 4. A restore from checkpoint `n` refuses a target that shows output of
//!    an epoch after `n` ([`crate::Error::TargetAhead`]): output the
//!    restored job would produce again, differently cut into epochs. The
//!    target's record says so, and a target whose record may lag its
//!    output ([`EpochTarget::LAZY_RECORD`]) also says, from `open`, the
//!    newest epoch its output shows ([`EpochTarget::newest_output`]).
//!
//! An error fails the sink; the job restarts from its last checkpoint and
//! the restore publishes again what was not recorded.

use std::io::Write;
use std::path::PathBuf;
use weir_core::vfs::{File, OpenOptions};

use weir_core::clock;

use super::marker::{Committed, Marker};
use super::{FAULT_COMMIT_DIRSYNC, FAULT_COMMIT_FSYNC, FAULT_COMMIT_RENAME, FAULT_COMMIT_WRITE};
use crate::error::IoContext;
use crate::fsutil::{self, create_dir_durable, fault, sync_dir};
use crate::Result;

/// Where a WAL sink subtask's committed epochs go; see the module docs
/// for the order of calls. Runs on the sink's committer thread (and on
/// the thread that restores the sink), never on a worker: it may block.
pub trait EpochTarget: Send + 'static {
    /// Commit requests in flight on the committer thread at once (default
    /// [`super::QUEUED_COMMITS`]). Checkpoints that complete while this
    /// many are in flight are held back and merged into the next request,
    /// which the target publishes with one [`EpochTarget::publish`] per
    /// chunk ([`EpochTarget::MAX_EPOCHS_PER_COMMIT`],
    /// [`EpochTarget::MAX_BYTES_PER_COMMIT`]). A target whose publish has
    /// a high fixed cost (a Kafka transaction) sets 1, so that every
    /// checkpoint completed during a publish goes into the next one.
    const COMMITS_IN_FLIGHT: usize = super::QUEUED_COMMITS;

    /// Epochs published together at most (default
    /// [`super::MAX_EPOCHS_PER_COMMIT`]). A commit of more epochs is
    /// published in several chunks, each recording the last epoch it
    /// holds; the sink also stops taking input once this many completed
    /// epochs are held back behind [`EpochTarget::COMMITS_IN_FLIGHT`].
    const MAX_EPOCHS_PER_COMMIT: usize = super::MAX_EPOCHS_PER_COMMIT;

    /// Output bytes published together at most, checked after each epoch
    /// (default unbounded: a file per epoch costs the same however they
    /// are grouped). An epoch is never split, so a chunk holds at least
    /// one epoch whatever its size.
    const MAX_BYTES_PER_COMMIT: u64 = u64::MAX;

    /// Whether an epoch may be written ahead of its commit (default no):
    /// the sink hands each epoch kept in memory to the committer thread at
    /// its barrier, the target writes it then (for files: written and
    /// fsynced under a hidden name), and the commit only publishes it
    /// (renames), so the checkpoint's completion is followed by the
    /// publish alone. See the module docs for what `publish` must then do.
    /// A transactional target, whose output becomes part of a transaction
    /// at `begin`, leaves it off.
    const STAGES: bool = false;

    /// Whether [`EpochTarget::publish`] may leave its record of the commit
    /// not yet durable (default no), for [`EpochTarget::sync_record`] to
    /// make durable later: the committer then syncs the record when a log
    /// segment could be deleted, at least every [`super::RECORD_INTERVAL_MS`],
    /// at the end of a restore and at the end of the input, instead of at
    /// every commit. A publish must still make its output visible in full,
    /// and the target must say the newest epoch its output shows
    /// ([`EpochTarget::newest_output`]), since its record may lag it.
    ///
    /// Sound only where publishing an epoch again is harmless (the
    /// contract's point 3): a crash before the record is durable leaves
    /// an older record, and the restore publishes the later epochs again.
    const LAZY_RECORD: bool = false;

    /// The kind of sink, for errors (`"wal"` for files).
    fn kind(&self) -> &'static str;

    /// Where the output goes, for errors (a folder, a topic).
    fn describe(&self) -> String;

    /// Prepares the target and reads what it records as committed for
    /// this subtask. Called once, first.
    fn open(&mut self) -> Result<Option<Committed>>;

    /// [`EpochTarget::open`] for a restore that continues a failed
    /// instance of this process (see [`weir_core::carry`]), which opened
    /// this target before and made every record it wrote durable: what
    /// `open` creates or syncs is durable already. Only if what the
    /// instance left agrees with the record read here does the restore go
    /// on with this target; otherwise it opens a new one with `open`. The
    /// default opens it as `open` does.
    fn open_again(&mut self) -> Result<Option<Committed>> {
        self.open()
    }

    /// Starts the output of epoch `epoch`.
    fn begin(&mut self, epoch: u64) -> Result<()>;

    /// Record payloads of the current epoch: whole records, concatenated.
    fn write(&mut self, payloads: &[u8]) -> Result<()>;

    /// Ends the current epoch's output.
    fn end(&mut self) -> Result<()>;

    /// Makes the epochs ended since the last publish visible and records
    /// `committed`, durably unless the target has
    /// [`EpochTarget::LAZY_RECORD`]; returns the epochs that got output.
    fn publish(&mut self, committed: Committed) -> Result<Vec<u64>>;

    /// When the last publish made its output visible to readers
    /// ([`weir_core::clock`] nanoseconds).
    fn visible_ns(&self) -> u64;

    /// Makes the record of the last publish durable, and the output it
    /// published with it (for a target with [`EpochTarget::LAZY_RECORD`];
    /// the default does nothing).
    fn sync_record(&mut self) -> Result<()> {
        Ok(())
    }

    /// For a restore: whether the target shows epoch `epoch`'s output in
    /// full already (`bytes` of record payloads), published by an earlier
    /// attempt whose record of the commit never became durable (default:
    /// no). If so, the restore publishes the epoch without writing it
    /// again: the next [`EpochTarget::publish`] through `epoch` returns it
    /// among its epochs, and the next [`EpochTarget::sync_record`] makes
    /// it durable with the record. Only for a target with
    /// [`EpochTarget::LAZY_RECORD`], whose visible output may be ahead of
    /// its record.
    fn adopt(&mut self, _epoch: u64, _bytes: u64) -> Result<bool> {
        Ok(false)
    }

    /// For a restore that continues a failed instance of this process
    /// (see [`weir_core::carry`]): that instance published every epoch
    /// through `committed`, and its record of them is not durable; the
    /// next [`EpochTarget::sync_record`] must make it so (for files: the
    /// folder fsync for their renames, and the marker). Only for a target
    /// with [`EpochTarget::LAZY_RECORD`]; the default does nothing.
    fn resume_unrecorded(&mut self, _committed: Committed) {}

    /// The newest epoch of this subtask whose output the target showed
    /// when it was opened, whatever its record says (`None`: none, or the
    /// record alone says; the default). Required of a target with
    /// [`EpochTarget::LAZY_RECORD`].
    fn newest_output(&self) -> Option<u64> {
        None
    }
}

/// Bytes of committed output written to a file at once: 1 MiB.
const OUT_CHUNK: usize = 1 << 20;

/// The file target: each epoch's output becomes one file
/// `part-<subtask>-<epoch><suffix>` in a folder, and a commit marker in
/// the subtask's log folder records the last commit.
///
/// Each epoch is written to a hidden temporary file in the target folder
/// (`wal.commit.write`) and fsynced (`wal.commit.fsync`), ahead of its
/// commit when it was kept in memory ([`EpochTarget::STAGES`]); a commit
/// renames its epochs' files into place (`wal.commit.rename`: readers see
/// them from here). Its record is lazy ([`EpochTarget::LAZY_RECORD`]):
/// [`EpochTarget::sync_record`] fsyncs the folder once for the renames
/// since the last (`wal.commit.dirsync`) and then writes the marker
/// (`wal.commit.marker`). A file published again after a crash is the
/// same epoch's same bytes under the same name, and `open` reads the
/// newest epoch among the visible files' names, for the restore's check.
#[derive(Debug)]
pub struct FileTarget {
    target: PathBuf,
    subtask: usize,
    suffix: String,
    marker_path: PathBuf,
    marker: Option<Marker>,
    out: Vec<u8>,
    /// The epoch being written: its file and temporary path.
    current: Option<(u64, File, PathBuf)>,
    /// Epochs written and fsynced, waiting to be renamed: (epoch, temp).
    written: Vec<(u64, PathBuf)>,
    /// When the last `publish` renamed its files into place.
    published_ns: u64,
    /// The record of the last publish, not yet written to the marker.
    unrecorded: Option<Committed>,
    /// Files were renamed into the folder since its last fsync.
    renamed: bool,
    /// The newest epoch among the visible files when opened.
    newest_output: Option<u64>,
    /// Epochs a restore found published already ([`EpochTarget::adopt`]),
    /// for the next publish to report.
    adopted: Vec<u64>,
}

impl FileTarget {
    /// Output of `subtask` in `target` with names ending in `suffix`; the
    /// marker is the file `committed` in `log_dir`.
    pub fn new(target: PathBuf, subtask: usize, suffix: String, log_dir: PathBuf) -> Self {
        FileTarget {
            target,
            subtask,
            suffix,
            marker_path: log_dir.join("committed"),
            marker: None,
            out: Vec::new(),
            current: None,
            written: Vec::new(),
            published_ns: 0,
            unrecorded: None,
            renamed: false,
            newest_output: None,
            adopted: Vec::new(),
        }
    }

    /// Removes its temporaries, finds its newest visible epoch, reads the
    /// marker (made durable first with `sync`).
    fn open_files(&mut self, sync: bool) -> Result<Option<Committed>> {
        super::commit::remove_temporaries(&self.target, &self.suffix, self.subtask)?;
        self.newest_output = fsutil::newest_visible_part(&self.target, &self.suffix, self.subtask)?;
        let (marker, committed) = Marker::read(self.marker_path.clone(), sync)?;
        self.marker = Some(marker);
        Ok(committed)
    }

    fn write_out(&mut self) -> Result<()> {
        let (_, file, temp) = self.current.as_mut().expect("writing inside an epoch");
        file.write_all(&self.out).ctx("write", temp)?;
        self.out.clear();
        Ok(())
    }
}

impl EpochTarget for FileTarget {
    const STAGES: bool = true;
    const LAZY_RECORD: bool = true;

    fn kind(&self) -> &'static str {
        "wal"
    }

    fn describe(&self) -> String {
        self.target.display().to_string()
    }

    fn open(&mut self) -> Result<Option<Committed>> {
        create_dir_durable(&self.target)?;
        self.open_files(true)
    }

    /// [`EpochTarget::open`] without creating the folder or syncing the
    /// marker: an earlier instance of this process did both.
    fn open_again(&mut self) -> Result<Option<Committed>> {
        self.open_files(false)
    }

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
        if self.out.capacity() == 0 {
            self.out.reserve(OUT_CHUNK + (OUT_CHUNK >> 2));
        }
        self.out.clear();
        self.current = Some((epoch, file, temp));
        Ok(())
    }

    #[inline]
    fn write(&mut self, payloads: &[u8]) -> Result<()> {
        if payloads.len() >= OUT_CHUNK {
            // A whole epoch kept in memory: written at once.
            self.write_out()?;
            let (_, file, temp) = self.current.as_mut().expect("writing inside an epoch");
            return file.write_all(payloads).ctx("write", temp);
        }
        self.out.extend_from_slice(payloads);
        if self.out.len() >= OUT_CHUNK {
            self.write_out()?;
        }
        Ok(())
    }

    fn end(&mut self) -> Result<()> {
        self.write_out()?;
        let (epoch, file, temp) = self.current.take().expect("ending an epoch");
        fault(FAULT_COMMIT_FSYNC, "fsync", &temp)?;
        file.sync_data().ctx("fsync", &temp)?;
        self.written.push((epoch, temp));
        Ok(())
    }

    fn publish(&mut self, committed: Committed) -> Result<Vec<u64>> {
        // Epochs staged for later commits stay hidden (`STAGES`).
        let mut published = Vec::new();
        for (epoch, temp) in self.written.iter().filter(|(e, _)| *e <= committed.epoch) {
            let target = self.target.join(fsutil::part_name(self.subtask, *epoch, &self.suffix));
            fault(FAULT_COMMIT_RENAME, "rename into place", temp)?;
            weir_core::vfs::rename(temp, &target).ctx(&format!("rename to {}", target.display()), temp)?;
            published.push(*epoch);
        }
        if !self.adopted.is_empty() {
            published.extend(self.adopted.iter().filter(|&&e| e <= committed.epoch));
            self.adopted.retain(|&e| e > committed.epoch);
            published.sort_unstable();
        }
        self.published_ns = clock::now_ns();
        self.renamed |= !published.is_empty();
        // The folder fsync and the marker wait for `sync_record`.
        self.unrecorded = Some(committed);
        self.written.retain(|(e, _)| *e > committed.epoch);
        Ok(published)
    }

    fn visible_ns(&self) -> u64 {
        self.published_ns
    }

    fn sync_record(&mut self) -> Result<()> {
        // The renames first: a durable marker vouches for the files.
        if self.renamed {
            sync_dir(&self.target, FAULT_COMMIT_DIRSYNC)?;
            self.renamed = false;
        }
        if let Some(committed) = self.unrecorded.take() {
            self.marker
                .as_mut()
                .expect("the target is opened before its first commit")
                .write(committed)?;
        }
        Ok(())
    }

    fn newest_output(&self) -> Option<u64> {
        self.newest_output
    }

    /// A visible `part-<subtask>-<epoch>` file of exactly `bytes` is the
    /// epoch's output in full: `end` fsynced it under its hidden name
    /// before `publish` renamed it into place, so a file under the final
    /// name never holds less (a crash before the rename leaves the hidden
    /// name, which `open` removed). Only the rename may not be durable:
    /// the folder fsync of the next `sync_record` makes it so. A file of
    /// another length is written again, as before.
    fn adopt(&mut self, epoch: u64, bytes: u64) -> Result<bool> {
        let path = self.target.join(fsutil::part_name(self.subtask, epoch, &self.suffix));
        match weir_core::vfs::metadata(&path) {
            Ok(m) if !m.is_dir() && m.len() == bytes => {
                self.adopted.push(epoch);
                self.renamed = true;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    fn resume_unrecorded(&mut self, committed: Committed) {
        self.renamed = true;
        self.unrecorded = Some(committed);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use weir_core::harness::Harness;
    use weir_core::Sink;

    use super::*;
    use crate::wal::{WalSink, WalSinkConfig};

    /// What a [`MemTarget`] published: the record, and epochs with their bytes.
    #[derive(Debug, Default)]
    struct Published {
        committed: Option<Committed>,
        epochs: Vec<(u64, Vec<u8>)>,
    }

    /// A target in memory that publishes a commit atomically, as a
    /// transactional target would: nothing of a commit shows until publish.
    struct MemTarget {
        shared: Arc<Mutex<Published>>,
        pending: Vec<(u64, Vec<u8>)>,
    }

    impl EpochTarget for MemTarget {
        fn kind(&self) -> &'static str {
            "mem"
        }
        fn describe(&self) -> String {
            "memory".into()
        }
        fn open(&mut self) -> Result<Option<Committed>> {
            Ok(self.shared.lock().unwrap().committed)
        }
        fn begin(&mut self, epoch: u64) -> Result<()> {
            self.pending.push((epoch, Vec::new()));
            Ok(())
        }
        fn write(&mut self, payloads: &[u8]) -> Result<()> {
            self.pending.last_mut().unwrap().1.extend_from_slice(payloads);
            Ok(())
        }
        fn end(&mut self) -> Result<()> {
            Ok(())
        }
        fn publish(&mut self, committed: Committed) -> Result<Vec<u64>> {
            let mut p = self.shared.lock().unwrap();
            let epochs: Vec<u64> = self.pending.iter().map(|(e, _)| *e).collect();
            for (e, bytes) in self.pending.drain(..) {
                // Publishing an epoch again replaces it: once, as the contract asks.
                p.epochs.retain(|(x, _)| *x != e);
                p.epochs.push((e, bytes));
            }
            p.committed = Some(committed);
            Ok(epochs)
        }
        fn visible_ns(&self) -> u64 {
            1
        }
    }

    /// What a [`SlowTarget`] did per publish: the record, and its epochs.
    type PublishLog = Arc<Mutex<Vec<(Committed, Vec<u64>)>>>;

    /// A [`MemTarget`] whose publish takes 30 ms, with one commit in flight
    /// and at most `EPOCHS` epochs and `BYTES` bytes per publish: a
    /// transactional target with a costly commit, as Kafka's.
    struct SlowTarget<const EPOCHS: usize, const BYTES: u64> {
        inner: MemTarget,
        log: PublishLog,
    }

    impl<const EPOCHS: usize, const BYTES: u64> EpochTarget for SlowTarget<EPOCHS, BYTES> {
        const COMMITS_IN_FLIGHT: usize = 1;
        const MAX_EPOCHS_PER_COMMIT: usize = EPOCHS;
        const MAX_BYTES_PER_COMMIT: u64 = BYTES;
        fn kind(&self) -> &'static str {
            "slow"
        }
        fn describe(&self) -> String {
            "slow memory".into()
        }
        fn open(&mut self) -> Result<Option<Committed>> {
            self.inner.open()
        }
        fn begin(&mut self, epoch: u64) -> Result<()> {
            self.inner.begin(epoch)
        }
        fn write(&mut self, payloads: &[u8]) -> Result<()> {
            self.inner.write(payloads)
        }
        fn end(&mut self) -> Result<()> {
            Ok(())
        }
        fn publish(&mut self, committed: Committed) -> Result<Vec<u64>> {
            std::thread::sleep(std::time::Duration::from_millis(30));
            let epochs = self.inner.publish(committed)?;
            self.log.lock().unwrap().push((committed, epochs.clone()));
            Ok(epochs)
        }
        fn visible_ns(&self) -> u64 {
            1
        }
    }

    type SlowSink<const EPOCHS: usize, const BYTES: u64> =
        WalSink<u8, fn(&u8, &mut Vec<u8>), fn(&u8) -> u64, SlowTarget<EPOCHS, BYTES>>;

    fn slow_sink<const EPOCHS: usize, const BYTES: u64>(
        cfg: &WalSinkConfig,
        shared: &Arc<Mutex<Published>>,
        log: &PublishLog,
    ) -> SlowSink<EPOCHS, BYTES> {
        let (shared, log) = (shared.clone(), log.clone());
        let make = move || SlowTarget {
            inner: MemTarget {
                shared: shared.clone(),
                pending: Vec::new(),
            },
            log: log.clone(),
        };
        WalSink::with_target(cfg.clone(), 0, Box::new(make), encode as fn(&u8, &mut Vec<u8>), |_| 0)
    }

    /// Checks what a slow target published: every epoch `1..=n` once with
    /// its bytes `[epoch]`, in chunks of at most `max` epochs and whose
    /// records name the chunk's last epoch (the last chunk: `n`), growing.
    fn check_published(shared: &Arc<Mutex<Published>>, log: &PublishLog, n: u64, max: usize) {
        let p = shared.lock().unwrap();
        let want: Vec<(u64, Vec<u8>)> = (1..=n).map(|e| (e, vec![e as u8])).collect();
        assert_eq!(p.epochs, want);
        assert_eq!(p.committed.unwrap().epoch, n);
        let log = log.lock().unwrap();
        let mut last = 0;
        for (i, (c, epochs)) in log.iter().enumerate() {
            assert!(!epochs.is_empty() && epochs.len() <= max, "{log:?}");
            assert!(c.epoch > last, "records grow: {log:?}");
            if i + 1 < log.len() {
                assert_eq!(c.epoch, *epochs.last().unwrap(), "{log:?}");
            }
            last = c.epoch;
        }
    }

    /// A small-segment log in `dir` keeping `memory_bytes` in memory, and
    /// an empty memory target with its publish log.
    fn slow_setup(dir: &std::path::Path, memory_bytes: usize) -> (WalSinkConfig, Arc<Mutex<Published>>, PublishLog) {
        let cfg = WalSinkConfig {
            segment_bytes: 4096,
            buffer_bytes: 64,
            memory_bytes,
            ..WalSinkConfig::new(dir.join("wal"), dir.join("unused"))
        };
        (cfg, Arc::default(), PublishLog::default())
    }

    #[test]
    fn checkpoints_completed_during_a_slow_publish_are_published_together() {
        let dir = tempfile::tempdir().unwrap();
        let (cfg, shared, log) = slow_setup(dir.path(), 64 << 20);
        let mut h = Harness::new(0, 1);
        let mut s = slow_sink::<4, { u64::MAX }>(&cfg, &shared, &log);
        // 20 checkpoints complete far faster than a publish (30 ms): the
        // first is published alone, the ones after it are held back and
        // published together, at most 4 at a time.
        let mut ready_while_publishing = 0;
        for n in 1..=20u64 {
            h.write_sink(&mut s, &mut vec![n as u8]).unwrap();
            let _ = s.pre_commit(n).unwrap();
            s.commit(n).unwrap();
            if n == 3 {
                // One commit in flight, one held back: the input goes on.
                ready_while_publishing += usize::from(h.ready_sink(&mut s).unwrap());
            }
        }
        // Far more than 4 held back behind the publish: backpressure.
        assert!(!h.ready_sink(&mut s).unwrap() || s.publishes() > 0);
        s.wait_idle().unwrap();
        assert_eq!(ready_while_publishing, 1);
        let publishes = s.publishes();
        assert_eq!(publishes, log.lock().unwrap().len() as u64);
        // Commit 1 alone (submitted at once), the 19 others in chunks of at
        // most 4: at least 6 publishes; fewer than 20 as long as any two
        // checkpoints completed within one 30 ms publish.
        assert!(
            (6..20).contains(&publishes),
            "{publishes} publishes: {:?}",
            log.lock().unwrap()
        );
        check_published(&shared, &log, 20, 4);
        assert_eq!(s.committed_epoch(), 20);
    }

    #[test]
    fn a_commit_over_the_byte_bound_is_published_in_chunks_and_restores_from_any() {
        let dir = tempfile::tempdir().unwrap();
        // Epochs read back from the log, verified, also in chunks.
        let (cfg, shared, log) = slow_setup(dir.path(), 0);
        let mut h = Harness::new(0, 1);
        // Two bytes a chunk: two epochs of one byte each.
        let mut s = slow_sink::<64, 2>(&cfg, &shared, &log);
        let mut states = Vec::new();
        for n in 1..=9u64 {
            h.write_sink(&mut s, &mut vec![n as u8]).unwrap();
            states.push(s.pre_commit(n).unwrap());
        }
        // The crash before any commit; the restore of checkpoint 9 publishes
        // its 9 epochs in chunks of 2 (the last alone), each recorded.
        drop(s);
        let mut s = slow_sink::<64, 2>(&cfg, &shared, &log);
        s.restore(9, &states[8]).unwrap();
        assert_eq!(log.lock().unwrap().len(), 5);
        check_published(&shared, &log, 9, 2);
        // A crash after the second chunk: the record says epoch 4, and a
        // restore publishes 5 to 9 once.
        {
            let mut p = shared.lock().unwrap();
            let c = log.lock().unwrap()[1].0;
            assert_eq!(c.epoch, 4);
            p.committed = Some(c);
            p.epochs.retain(|(e, _)| *e <= 4);
        }
        log.lock().unwrap().clear();
        drop(s);
        let mut s = slow_sink::<64, 2>(&cfg, &shared, &log);
        s.restore(9, &states[8]).unwrap();
        assert_eq!(s.last_recovery().unwrap().recommitted_epochs, vec![5, 6, 7, 8, 9]);
        check_published(&shared, &log, 9, 2);
        h.finish_sink(&mut s).unwrap();
    }

    fn encode(r: &u8, out: &mut Vec<u8>) {
        out.push(*r);
    }

    type MemSink = WalSink<u8, fn(&u8, &mut Vec<u8>), fn(&u8) -> u64, MemTarget>;

    fn sink(cfg: &WalSinkConfig, shared: &Arc<Mutex<Published>>) -> MemSink {
        let shared = shared.clone();
        let make = move || MemTarget {
            shared: shared.clone(),
            pending: Vec::new(),
        };
        WalSink::with_target(cfg.clone(), 0, Box::new(make), encode as fn(&u8, &mut Vec<u8>), |_| 0)
    }

    #[test]
    fn a_custom_target_gets_each_epoch_once_through_a_crash_and_a_restore() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = WalSinkConfig {
            segment_bytes: 4096,
            buffer_bytes: 64,
            ..WalSinkConfig::new(dir.path().join("wal"), dir.path().join("unused"))
        };
        let shared = Arc::new(Mutex::new(Published::default()));
        let mut h = Harness::new(0, 1);
        let mut s = sink(&cfg, &shared);
        h.write_sink(&mut s, &mut vec![1, 2, 3]).unwrap();
        let _ = s.pre_commit(1).unwrap();
        s.commit(1).unwrap();
        s.wait_idle().unwrap();
        assert_eq!(shared.lock().unwrap().epochs, vec![(1, vec![1, 2, 3])]);
        // Epoch 2 pre-committed, then the crash before its commit.
        h.write_sink(&mut s, &mut vec![4, 5]).unwrap();
        let state2 = s.pre_commit(2).unwrap();
        h.write_sink(&mut s, &mut vec![6]).unwrap();
        s.wait_idle().unwrap();
        drop(s);
        assert_eq!(shared.lock().unwrap().committed.unwrap().epoch, 1);
        let mut s = sink(&cfg, &shared);
        s.restore(2, &state2).unwrap();
        assert_eq!(s.last_recovery().unwrap().recommitted_epochs, vec![2]);
        {
            let p = shared.lock().unwrap();
            assert_eq!(p.epochs, vec![(1, vec![1, 2, 3]), (2, vec![4, 5])]);
            assert_eq!(p.committed.unwrap().epoch, 2);
        }
        // The same restore again (a second crash right after it) publishes
        // nothing twice.
        drop(s);
        let mut s = sink(&cfg, &shared);
        s.restore(2, &state2).unwrap();
        assert_eq!(shared.lock().unwrap().epochs.len(), 2);
        h.finish_sink(&mut s).unwrap();
        // A fresh start over a target that records commits is refused, naming the target.
        let mut fresh = sink(&cfg, &shared);
        let e = h
            .write_sink(&mut fresh, &mut vec![7])
            .and_then(|_| h.finish_sink(&mut fresh));
        let e = e.unwrap_err().to_string();
        assert!(e.contains("mem") && e.contains("memory"), "{e}");
    }
}
