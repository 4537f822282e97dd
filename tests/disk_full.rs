//! Disk full, for real: a small tmpfs mounted by the test and filled with
//! a filler file until writes fail with `ENOSPC`, then emptied.
//!
//! - Checkpoints on the full disk are declined (counted against the
//!   tolerable failures); the job goes on and checkpoints again once the
//!   filler is gone, and its output is exactly-once.
//! - A sink whose commit meets the full disk fails the job with an error
//!   naming the cause and the file; a new run on the emptied disk resumes
//!   from the last checkpoint, and the committed output of both runs is
//!   exactly-once.
//!
//! Mounting needs root (CI runs as root); where the mount is refused the
//! tests print why and return.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{assert_exactly_once, keyed_counts, parse_rows, row_line, Job, Target, TxSink, BASE};
use weir_core::{CheckpointConfig, CheckpointMode, Pipeline, RestartStrategy, RuntimeConfig};
use weir_io::{WalSink, WalSinkConfig};

/// A tmpfs of `size` mounted on a fresh folder, unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Tmpfs { dir }),
            Ok(o) => {
                eprintln!(
                    "disk_full: skipped: mounting a tmpfs was refused: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                None
            }
            Err(e) => {
                eprintln!("disk_full: skipped: cannot run mount: {e}");
                None
            }
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Fills the filesystem: writes a filler file until `ENOSPC`.
    fn fill(&self) -> PathBuf {
        let filler = self.path().join("filler");
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0xaa; 64 << 10];
        loop {
            match f.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling {}: {e}", filler.display()),
            }
        }
        // Single bytes, to the last page.
        while f.write(&[0xaa]).is_ok_and(|n| n == 1) {}
        filler
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

fn wait_for(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn checkpoints_on_a_full_disk_are_declined_and_resume_when_space_returns() {
    let Some(disk) = Tmpfs::mount("2m") else { return };
    let chk = disk.path().join("chk");
    std::fs::create_dir(&chk).unwrap();
    let job = Job {
        events: 60_000,
        rate: 60_000.0,
        failures: 0,
        sources: 1,
        ..BASE
    };
    let target = Arc::new(Mutex::new(Target::default()));
    let p = Pipeline::new("disk-full");
    let t = Arc::clone(&target);
    keyed_counts(&p, job).sink("tx", move |i| TxSink::new(i, t.clone(), true));
    let filler = disk.fill();
    let config = RuntimeConfig {
        workers: 2,
        checkpointing: Some(CheckpointConfig {
            interval: Duration::from_millis(5),
            tolerable_failures: 10_000,
            // Task states in files of their own, as large states are.
            inline_state_max: 0,
            ..CheckpointConfig::new(CheckpointMode::Aligned, &chk)
        }),
        restart: RestartStrategy::None,
        ..RuntimeConfig::default()
    };
    let handle = p.run(config).unwrap();
    wait_for("declined checkpoints", Duration::from_secs(20), || {
        handle.metrics().checkpoints.failed >= 3
    });
    let before = handle.metrics().checkpoints;
    assert_eq!(before.completed, 0, "no checkpoint completes on a full disk");
    std::fs::remove_file(&filler).unwrap();
    let result = handle.join().unwrap();
    let stats = &result.metrics.checkpoints;
    assert!(stats.failed >= 3, "{stats:?}");
    assert!(
        stats.completed >= 1,
        "checkpoints complete once there is space: {stats:?}"
    );
    let rows = std::mem::take(&mut target.lock().unwrap().rows);
    assert_exactly_once(job, &rows);
}

#[test]
fn a_sink_commit_on_a_full_disk_fails_the_job_and_a_restart_resumes_exactly_once() {
    let Some(disk) = Tmpfs::mount("4m") else { return };
    let scratch = tempfile::tempdir().unwrap();
    let out = disk.path().join("out");
    let job = Job {
        events: 40_000,
        rate: 40_000.0,
        failures: 0,
        sources: 1,
        ..BASE
    };
    let run = |fill: bool| {
        let p = Pipeline::new("disk-full-sink");
        let wal = WalSinkConfig::new(scratch.path().join("wal"), &out);
        keyed_counts(&p, job).sink("wal", move |i| WalSink::new(wal.clone(), i, row_line, |_| 0));
        let config = RuntimeConfig {
            workers: 2,
            checkpointing: Some(CheckpointConfig {
                interval: Duration::from_millis(5),
                ..CheckpointConfig::new(CheckpointMode::Aligned, scratch.path().join("chk"))
            }),
            restart: RestartStrategy::None,
            ..RuntimeConfig::default()
        };
        let handle = p.run(config).unwrap();
        if fill {
            // Some commits first, then the disk fills up.
            wait_for("committed output", Duration::from_secs(20), || {
                weir_io::committed_files(&out).is_ok_and(|f| f.len() >= 4)
            });
            let filler = disk.fill();
            let r = handle.join();
            std::fs::remove_file(filler).unwrap();
            r
        } else {
            handle.join()
        }
    };
    let err = match run(true) {
        Err(e) => e.to_string(),
        Ok(r) => panic!("the job finished on a full disk: {:?}", r.metrics.checkpoints),
    };
    assert!(err.contains("No space left on device"), "{err}");
    assert!(err.contains(&*out.to_string_lossy()), "the error names the file: {err}");
    let second = run(false).unwrap();
    assert!(second.metrics.checkpoints.restored_from.is_some());
    let mut rows = Vec::new();
    for f in weir_io::committed_files(&out).unwrap() {
        let (r, garbage) = parse_rows(&std::fs::read_to_string(&f).unwrap());
        assert_eq!(garbage, 0, "{}", f.display());
        rows.extend(r);
    }
    assert_exactly_once(job, &rows);
}
