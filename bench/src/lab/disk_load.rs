//! A co-runner that keeps the disk busy: `weir compare --scenario
//! disk-busy` runs it beside every open-loop run, to show what another
//! program's writes and syncs on the same filesystem do to exactly-once
//! visibility (each checkpoint waits for its own `fsync`s, which now queue
//! behind the co-runner's).
//!
//! One thread writes [`CHUNK`] pieces at the rate asked, cycling through a
//! file of [`REGION`] bytes (so the disk never fills), and `fdatasync`s it
//! after every [`SYNC_EVERY`] bytes, as a database or a log shipper on the
//! same machine would. It is not pinned: another program runs where the
//! system puts it. What it achieved (MB/s, its syncs' p50 and p99) is
//! reported, since a disk slower than the rate asked caps it.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

/// Bytes per write: 256 KiB.
pub const CHUNK: usize = 256 << 10;

/// The file's size, cycled through: 256 MiB.
pub const REGION: u64 = 256 << 20;

/// Bytes written between two `fdatasync`s: 4 MiB.
pub const SYNC_EVERY: u64 = 4 << 20;

/// What the co-runner did during one run.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct DiskLoadStats {
    /// The rate asked, MB/s.
    pub target_mb_s: f64,
    /// The rate achieved, MB/s.
    pub achieved_mb_s: f64,
    /// Its `fdatasync`s, and their p50 and p99 in ms.
    pub syncs: u64,
    /// Median sync, ms.
    pub sync_p50_ms: f64,
    /// 99th percentile sync, ms.
    pub sync_p99_ms: f64,
}

/// A running co-runner; [`DiskLoad::stop`] ends it and removes its file.
pub struct DiskLoad {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<std::io::Result<DiskLoadStats>>>,
    path: PathBuf,
}

impl DiskLoad {
    /// Starts writing `mb_s` MB/s (10^6 bytes) into a file in `dir`.
    pub fn start(dir: &Path, mb_s: f64) -> std::io::Result<DiskLoad> {
        let path = dir.join(format!(
            "weir-disk-load-{}-{}",
            std::process::id(),
            weir_core::clock::now_ns()
        ));
        let file = OpenOptions::new().create_new(true).read(true).write(true).open(&path)?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("weir-disk-load".into())
            .spawn(move || write_loop(&file, mb_s, &s))?;
        Ok(DiskLoad {
            stop,
            thread: Some(thread),
            path,
        })
    }

    /// Stops the writer (within one write and sync) and returns what it
    /// did; its file is removed as `self` drops.
    pub fn stop(mut self) -> std::io::Result<DiskLoadStats> {
        self.stop.store(true, Ordering::Release);
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(r)) => r,
            _ => Err(std::io::Error::other("the disk load thread panicked")),
        }
    }
}

impl Drop for DiskLoad {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn write_loop(file: &File, mb_s: f64, stop: &AtomicBool) -> std::io::Result<DiskLoadStats> {
    // Random-looking bytes: a compressing or deduplicating layer below
    // must not make the writes free.
    let mut chunk = vec![0u8; CHUNK];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for b in chunk.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let bytes_per_s = mb_s * 1e6;
    let mut syncs = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds");
    let start = Instant::now();
    let (mut written, mut unsynced, mut at) = (0u64, 0u64, 0u64);
    while !stop.load(Ordering::Acquire) {
        // Paced: ahead of the schedule, wait (in short steps, to stop soon).
        let due = start + Duration::from_secs_f64(written as f64 / bytes_per_s);
        let now = Instant::now();
        if due > now {
            std::thread::sleep((due - now).min(Duration::from_millis(5)));
            continue;
        }
        file.write_all_at(&chunk, at)?;
        written += CHUNK as u64;
        unsynced += CHUNK as u64;
        at = (at + CHUNK as u64) % REGION;
        if unsynced >= SYNC_EVERY {
            let t = Instant::now();
            file.sync_data()?;
            syncs.saturating_record(t.elapsed().as_nanos().max(1) as u64);
            unsynced = 0;
        }
    }
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    let ms = |q: f64| syncs.value_at_quantile(q) as f64 / 1e6;
    Ok(DiskLoadStats {
        target_mb_s: mb_s,
        achieved_mb_s: written as f64 / secs / 1e6,
        syncs: syncs.len(),
        sync_p50_ms: ms(0.5),
        sync_p99_ms: ms(0.99),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_writes_at_about_the_rate_asked_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let load = DiskLoad::start(dir.path(), 40.0).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let s = load.stop().unwrap();
        assert_eq!(s.target_mb_s, 40.0);
        // Paced: never ahead of the rate by more than a chunk.
        assert!(s.achieved_mb_s <= 40.0 * 1.1 + 1.0, "{s:?}");
        assert!(s.achieved_mb_s > 0.0 && s.syncs >= 1, "{s:?}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "its file is removed");
    }
}
