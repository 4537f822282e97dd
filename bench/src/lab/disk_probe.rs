//! The disk probe of `weir compare`: how long this disk takes to make a
//! small append durable, measured in the run beside the exactly-once
//! figures it bounds.
//!
//! An exactly-once checkpoint waits for several syncs (the manifest's, the
//! sinks' pre-commits and commits), so its duration and the visibility
//! latency of committed output are multiples of this disk's sync latency.
//! The probe appends 4 KiB and calls `fdatasync`, 200 times, in a
//! temporary file in the folder the sinks write to, and reports the
//! percentiles of each append-and-sync.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

/// Appends per probe.
pub const WRITES: usize = 200;
/// Bytes per append: one page.
pub const BYTES: usize = 4096;

/// What the disk probe measured.
#[derive(Debug, Clone, Serialize)]
pub struct DiskProbe {
    /// The folder the probe's file was in.
    pub dir: PathBuf,
    /// Appends made, each followed by `fdatasync`.
    pub writes: usize,
    /// Bytes per append.
    pub bytes: usize,
    /// Median of append + `fdatasync`, microseconds.
    pub p50_us: f64,
    /// 99th percentile (nearest rank), microseconds.
    pub p99_us: f64,
    /// Slowest, microseconds.
    pub max_us: f64,
}

impl DiskProbe {
    /// Runs the probe in `dir` (a temporary file, removed afterwards).
    pub fn run(dir: &Path) -> std::io::Result<DiskProbe> {
        let path = dir.join(format!(
            "weir-disk-probe-{}-{}",
            std::process::id(),
            weir_core::clock::now_ns()
        ));
        let result = Self::measure(&path);
        let _ = std::fs::remove_file(&path);
        let mut us = result?;
        us.sort_unstable_by(f64::total_cmp);
        let rank = |q: f64| us[(((q * us.len() as f64).ceil() as usize).max(1) - 1).min(us.len() - 1)];
        Ok(DiskProbe {
            dir: dir.to_path_buf(),
            writes: WRITES,
            bytes: BYTES,
            p50_us: rank(0.50),
            p99_us: rank(0.99),
            max_us: us[us.len() - 1],
        })
    }

    /// Durations of each append and sync, microseconds.
    fn measure(path: &Path) -> std::io::Result<Vec<f64>> {
        let mut f = std::fs::OpenOptions::new().create_new(true).append(true).open(path)?;
        let page = vec![0x5au8; BYTES];
        let mut us = Vec::with_capacity(WRITES);
        for _ in 0..WRITES {
            let start = Instant::now();
            f.write_all(&page)?;
            // Not weir_core::disk::sync_data: these syncs are not weir's.
            f.sync_data()?;
            us.push(start.elapsed().as_secs_f64() * 1e6);
        }
        Ok(us)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_measures_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let p = DiskProbe::run(dir.path()).unwrap();
        assert_eq!(p.writes, WRITES);
        assert!(p.p50_us > 0.0 && p.p50_us <= p.p99_us && p.p99_us <= p.max_us, "{p:?}");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "probe file left behind"
        );
        assert!(DiskProbe::run(&dir.path().join("missing")).is_err());
    }
}
