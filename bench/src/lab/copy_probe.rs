//! Memory copy bandwidth, measured in the same run as a stateless job, so
//! that weir's bytes per second can be read as a fraction of what this
//! machine can copy at that moment: a stateless job moves bytes, and no
//! engine moves them faster than the machine copies them.
//!
//! Two figures, each with one thread per worker copying at the same time:
//! - `batch`: a buffer the size of one generator batch (`batch_size`
//!   records of 32 bytes) copied into another, again and again: the same
//!   working set as the chained job, which never leaves the caches;
//! - `dram`: 64 MiB buffers, touched before timing: main memory.
//!
//! Each figure is the best of ten 30 ms windows: on a shared machine a
//! window in which the thread waited for a core says nothing about memory.

use std::time::{Duration, Instant};

use serde::Serialize;

/// Bytes per benchmark record.
pub const RECORD_BYTES: usize = std::mem::size_of::<crate::lab::event::Event>();

/// Copy bandwidth in bytes per second, summed over the threads.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct CopyBandwidth {
    /// Threads copying at once (one per worker).
    pub threads: usize,
    /// Bytes copied per `memcpy` in the batch-sized figure.
    pub batch_bytes: usize,
    /// Batch-sized buffers (cache-resident), bytes/s.
    pub batch_bytes_per_sec: f64,
    /// 64 MiB buffers (main memory), bytes/s.
    pub dram_bytes_per_sec: f64,
}

/// Copies `src` into `dst` for about `time`; bytes copied per second.
fn copy_rate(src: &[u8], dst: &mut [u8], time: Duration) -> f64 {
    let start = Instant::now();
    let mut copied = 0u64;
    // About 1 MiB between clock readings: the clock costs nothing beside
    // the copies, and a window ends on time even for large buffers.
    let reps = ((1 << 20) / src.len().max(1)).max(1);
    loop {
        for _ in 0..reps {
            dst.copy_from_slice(std::hint::black_box(src));
            std::hint::black_box(&mut *dst);
            copied += src.len() as u64;
        }
        let t = start.elapsed();
        if t >= time {
            return copied as f64 / t.as_secs_f64();
        }
    }
}

/// The best of `windows` windows of `time / windows` each: a window in
/// which the thread was descheduled (other processes on a shared machine)
/// does not count, as the machine's copy bandwidth is what is asked.
fn best_copy_rate(src: &[u8], dst: &mut [u8], time: Duration, windows: u32) -> f64 {
    (0..windows)
        .map(|_| copy_rate(src, dst, time / windows))
        .fold(0.0, f64::max)
}

/// A page, for [`dst_offset`].
const PAGE: usize = 4096;

/// Where in a buffer at address `room` (at least `PAGE` bytes longer than
/// the copy) the destination starts, so that it sits half a page from the
/// source at `src` modulo a page. A destination at the same offset in its
/// page as the source makes this CPU's `rep movsb` treat every store as a
/// possible alias of the loads ahead of it (4 KiB aliasing): measured here,
/// 0.3 GB/s for 32 KiB buffers against 5-15 GB/s half a page apart. The
/// generator's buffers are not placed that way, so neither are the probe's.
fn dst_offset(src: usize, room: usize) -> usize {
    let apart = room.wrapping_sub(src) % PAGE;
    (PAGE / 2 + PAGE - apart) % PAGE
}

/// Pins the calling thread to core `i` (in `core_affinity`'s order), best
/// effort as the workers' pinning: an unpinned probe measures less, not
/// wrongly. For the probes that run threads on the workers' cores.
pub(crate) fn pin_to_core(i: usize) {
    if let Some(core) = core_affinity::get_core_ids().and_then(|c| c.get(i).copied()) {
        let _ = core_affinity::set_for_current(core);
    }
}

/// Runs `threads` copiers of `bytes`-sized buffers at once; their summed rate.
fn parallel_rate(threads: usize, bytes: usize, time: Duration) -> f64 {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    pin_to_core(t);
                    // Touched before timing: fresh pages cost a fault each.
                    let src = vec![1u8; bytes];
                    let mut room = vec![0u8; bytes + PAGE];
                    let at = dst_offset(src.as_ptr() as usize, room.as_ptr() as usize);
                    let dst = &mut room[at..at + bytes];
                    copy_rate(&src, dst, time / 10);
                    best_copy_rate(&src, dst, time, 10)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(0.0)).sum()
    })
}

/// Measures both figures with `threads` threads for a batch of
/// `batch_size` records.
pub fn measure(threads: usize, batch_size: usize) -> CopyBandwidth {
    let threads = threads.max(1);
    let batch_bytes = batch_size.max(1) * RECORD_BYTES;
    let time = Duration::from_millis(300);
    CopyBandwidth {
        threads,
        batch_bytes,
        batch_bytes_per_sec: parallel_rate(threads, batch_bytes, time),
        dram_bytes_per_sec: parallel_rate(threads, 64 << 20, time),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_destination_sits_half_a_page_from_the_source() {
        for src in [0usize, 16, 4096, 12345, 1 << 40] {
            for room in [0usize, 8, 2048, 4095, 99999, (1 << 41) + 3] {
                let at = dst_offset(src, room);
                assert!(at < PAGE);
                assert_eq!((room + at).wrapping_sub(src) % PAGE, PAGE / 2, "{src} {room}");
            }
        }
    }

    #[test]
    fn copy_rate_counts_the_bytes_copied() {
        let src = vec![7u8; 4096];
        let mut dst = vec![0u8; 4096];
        let r = copy_rate(&src, &mut dst, Duration::from_millis(5));
        assert_eq!(dst, src);
        // At least one round of 256 copies (1 MiB) in at most a second.
        assert!(r > 256.0 * 4096.0, "{r}");
    }
}
