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
//!    durably records the commit, in that order or atomically. Only once
//!    `publish` returned may the log before the commit's position be
//!    deleted.
//! 3. Publishing an epoch again (a restore re-commits everything after the
//!    recorded commit) must leave the output as if it was published once:
//!    the file target rewrites the same file under the same name; a
//!    transactional target publishes the epochs and its record of the
//!    commit in one transaction, so a commit is either whole or absent.
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
    /// The kind of sink, for errors (`"wal"` for files).
    fn kind(&self) -> &'static str;

    /// Where the output goes, for errors (a folder, a topic).
    fn describe(&self) -> String;

    /// Prepares the target and reads what it records as committed for
    /// this subtask. Called once, first.
    fn open(&mut self) -> Result<Option<Committed>>;

    /// Starts the output of epoch `epoch`.
    fn begin(&mut self, epoch: u64) -> Result<()>;

    /// Record payloads of the current epoch: whole records, concatenated.
    fn write(&mut self, payloads: &[u8]) -> Result<()>;

    /// Ends the current epoch's output.
    fn end(&mut self) -> Result<()>;

    /// Makes the epochs ended since the last publish visible and durably
    /// records `committed`; returns the epochs that got output.
    fn publish(&mut self, committed: Committed) -> Result<Vec<u64>>;

    /// When the last publish made its output visible to readers
    /// ([`weir_core::clock`] nanoseconds).
    fn visible_ns(&self) -> u64;
}

/// Bytes of committed output written to a file at once: 1 MiB.
const OUT_CHUNK: usize = 1 << 20;

/// The file target: each epoch's output becomes one file
/// `part-<subtask>-<epoch><suffix>` in a folder, and a commit marker in
/// the subtask's log folder records the last commit.
///
/// A commit writes each epoch to a hidden temporary file in the target
/// folder (`wal.commit.write`), fsyncs it (`wal.commit.fsync`), renames
/// it into place (`wal.commit.rename`: readers see it from here), fsyncs
/// the folder once (`wal.commit.dirsync`), and then writes the marker
/// (`wal.commit.marker`).
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
        }
    }

    fn write_out(&mut self) -> Result<()> {
        let (_, file, temp) = self.current.as_mut().expect("writing inside an epoch");
        file.write_all(&self.out).ctx("write", temp)?;
        self.out.clear();
        Ok(())
    }
}

impl EpochTarget for FileTarget {
    fn kind(&self) -> &'static str {
        "wal"
    }

    fn describe(&self) -> String {
        self.target.display().to_string()
    }

    fn open(&mut self) -> Result<Option<Committed>> {
        create_dir_durable(&self.target)?;
        super::commit::remove_temporaries(&self.target, &self.suffix, self.subtask)?;
        let (marker, committed) = Marker::open(self.marker_path.clone())?;
        self.marker = Some(marker);
        Ok(committed)
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
        for (epoch, temp) in &self.written {
            let target = self.target.join(fsutil::part_name(self.subtask, *epoch, &self.suffix));
            fault(FAULT_COMMIT_RENAME, "rename into place", temp)?;
            weir_core::vfs::rename(temp, &target).ctx(&format!("rename to {}", target.display()), temp)?;
        }
        self.published_ns = clock::now_ns();
        if !self.written.is_empty() {
            sync_dir(&self.target, FAULT_COMMIT_DIRSYNC)?;
        }
        self.marker
            .as_mut()
            .expect("the target is opened before its first commit")
            .write(committed)?;
        Ok(self.written.drain(..).map(|(e, _)| e).collect())
    }

    fn visible_ns(&self) -> u64 {
        self.published_ns
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
