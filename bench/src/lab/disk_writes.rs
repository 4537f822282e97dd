//! What a run wrote, per record, from the kernel's per-process I/O
//! counters (`/proc/self/io`), read before and after the run.
//!
//! Issue 48 asks what each way to exactly-once costs in bytes written per
//! record: the WAL, the output files, checkpoint files, the dedup state.
//! The kernel counts two things for the whole process, which a benchmark
//! run has to itself:
//!
//! - `wchar`: bytes handed to `write`-family calls, whatever their fate
//!   (the WAL's appends, output files, checkpoint and manifest files; not
//!   the mapped state's pages, which are written by storing into them);
//! - `write_bytes` minus `cancelled_write_bytes`: bytes of file pages the
//!   process made dirty and did not truncate away before they reached
//!   storage, the mapped state's pages included, counted when a page turns
//!   dirty (one 4 KiB page for many small writes into it).
//!
//! Neither splits by purpose; the checkpoint summary gives the state's own
//! bytes per checkpoint and the dedup figures the dedup state's size (its
//! upstream backup is kept in memory, never written). Linux only;
//! elsewhere, or without `/proc`, the figures are absent.

use serde::Serialize;

/// The process's cumulative I/O counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoCounters {
    /// Bytes passed to write calls (`wchar`).
    pub written: u64,
    /// Bytes of pages made dirty for storage, net of those truncated away
    /// (`write_bytes - cancelled_write_bytes`).
    pub to_storage: u64,
}

impl IoCounters {
    /// The counters now; `None` where `/proc/self/io` cannot be read.
    pub fn now() -> Option<IoCounters> {
        std::fs::read_to_string("/proc/self/io")
            .ok()
            .and_then(|t| Self::parse(&t))
    }

    /// Parses `/proc/<pid>/io`'s `name: value` lines; `None` if a needed
    /// one is missing.
    fn parse(text: &str) -> Option<IoCounters> {
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse::<u64>().ok())
        };
        Some(IoCounters {
            written: field("wchar")?,
            to_storage: field("write_bytes")?.saturating_sub(field("cancelled_write_bytes").unwrap_or(0)),
        })
    }
}

/// What one run wrote, per record it made.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DiskWrites {
    /// Bytes passed to write calls per record (`wchar`).
    pub written_per_record: f64,
    /// Bytes of pages made dirty for storage per record (`write_bytes`
    /// net of truncation): what the disk receives, mapped state included.
    pub to_storage_per_record: f64,
}

impl DiskWrites {
    /// Between `before` and `after`, for a run of `records`; `None`
    /// without both readings or records.
    pub fn between(before: Option<IoCounters>, after: Option<IoCounters>, records: u64) -> Option<DiskWrites> {
        let (b, a) = (before?, after?);
        (records > 0).then(|| DiskWrites {
            written_per_record: a.written.saturating_sub(b.written) as f64 / records as f64,
            to_storage_per_record: a.to_storage.saturating_sub(b.to_storage) as f64 / records as f64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_kernel_s_format_and_divides_per_record() {
        let text = "rchar: 10\nwchar: 5000\nsyscr: 1\nsyscw: 2\nread_bytes: 0\nwrite_bytes: 12288\n\
                    cancelled_write_bytes: 4096\n";
        let before = IoCounters::parse(text).unwrap();
        assert_eq!(
            before,
            IoCounters {
                written: 5000,
                to_storage: 8192
            }
        );
        let after = IoCounters {
            written: 5000 + 3200,
            to_storage: 8192 + 4096,
        };
        let d = DiskWrites::between(Some(before), Some(after), 100).unwrap();
        assert_eq!((d.written_per_record, d.to_storage_per_record), (32.0, 40.96));
        assert_eq!(DiskWrites::between(Some(before), None, 100), None);
        assert_eq!(DiskWrites::between(Some(before), Some(after), 0), None);
        assert_eq!(IoCounters::parse("rchar: 1\n"), None, "no wchar");
    }

    /// This process's own counters grow by what it writes.
    #[test]
    fn a_write_shows_in_this_process_s_counters() {
        let Some(before) = IoCounters::now() else {
            return; // Not Linux: nothing to read.
        };
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), vec![7u8; 64 * 1024]).unwrap();
        let after = IoCounters::now().unwrap();
        assert!(after.written - before.written >= 64 * 1024, "{before:?} {after:?}");
    }
}
