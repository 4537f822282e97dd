//! The keyed job's ceiling from its parts, measured in the same run as the
//! job: what a ring and a map update allow on this machine at that moment,
//! so that the job's throughput is read as a share of it, free of the
//! machine's drift from one run to the next.
//!
//! Three figures, each the best of ten 30 ms windows (twenty for the ring,
//! which needs both cores at once; a window in which a thread waited for a
//! core says nothing about the part):
//! - `ring`: 32-byte records through an `rtrb` ring between two threads
//!   pinned to cores 0 and 1, written and read in chunks of the job's batch
//!   size, with the job's ring capacity; the reader copies each record out
//!   and writes a word back into its slot, as the job's input task does
//!   (`read_events`). For a one-worker job, whose rings never leave its
//!   core, one thread on core 0 writes each chunk and reads it back;
//! - `map`: the keyed job's update (a running sum per key) on a
//!   `FxHashMap` (the heap state backend's map) of the job's number of
//!   keys, one thread, records in batches, keys spread as the generator
//!   spreads them;
//! - `mapped`: the same update through weir's memory-mapped value store
//!   (`ValueStore::update_records`, what the keyed operator calls), one
//!   thread, in the default state folder: the state's own cost apart from
//!   the rest of the job.
//!
//! The ceiling counts what every event must do and nothing else: one ring
//! crossing (a write on one core and a read on another, each taking
//! `1/ring` of a core, since the two sides ran in parallel at that rate)
//! and one map update. On `threads` cores:
//! `threads / (2 / ring + 1 / map)` events/s; on one, where the ring
//! figure already counts both sides, `1 / (1 / ring + 1 / map)`. Generating, partitioning,
//! scheduling and the sink are left out, so weir cannot reach it; a third
//! of it is what the keyed job aims at.

use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use serde::Serialize;
use weir_core::state::{StoreOptions, ValueStore};

use crate::lab::copy_probe::pin_to_core;
use crate::lab::event::Event;

/// The parts' rates and the ceiling they give.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Parts {
    /// Cores the ceiling is for (the job's workers).
    pub threads: usize,
    /// Distinct keys in the map figures.
    pub keys: u64,
    /// Records per second through one ring: two threads on two cores, or
    /// one thread writing and reading for a one-worker job.
    pub ring_items_per_sec: f64,
    /// Running-sum updates per second on a `FxHashMap`, one thread.
    pub map_updates_per_sec: f64,
    /// The same updates through weir's mapped value store, one thread.
    pub mapped_updates_per_sec: f64,
    /// `threads / (2 / ring + 1 / map)` (one thread: `1 / (1 / ring + 1 /
    /// map)`; without the ring on the job's path, `threads * map`):
    /// events/s.
    pub limit_events_per_sec: f64,
    /// The job's records go through rings: false for a keyed job of
    /// parallelism 1, whose one keyed subtask runs on its source's worker
    /// and takes each batch by reference (the ring figure is still
    /// measured: the scaling model charges it to more workers).
    pub ring_on_path: bool,
    /// One-way handoff between cores 0 and 1 at this moment, ns
    /// (`handoff_probe`), for a job on more than one core: this guest's
    /// path between its cores runs at 34-39 ns or at 150-190 ns, and a
    /// two-worker job's events/s follow it. `None` for one core.
    pub handoff_ns: Option<f64>,
}

/// Windows per figure, and the time of all of them.
const WINDOWS: u32 = 10;
const TIME: Duration = Duration::from_millis(300);

/// Keys for the map figures: a fixed pseudo-random sequence in `0..keys`,
/// spread as the generator spreads them (multiply-shift of a random word).
fn key_sequence(keys: u64, n: usize) -> Vec<Event> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..n as u64)
        .map(|seq| {
            // xorshift64*
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            let random = x.wrapping_mul(0x2545_f491_4f6c_dd1d);
            Event {
                key: ((u128::from(random) * u128::from(keys)) >> 64) as u64,
                value: seq & 0xff,
                emitted_ns: 0,
                seq,
            }
        })
        .collect()
}

/// Runs `round` (which handles some records and returns how many) for
/// `windows` windows of `TIME / WINDOWS`; the best window's records/s.
fn best_rate(windows: u32, mut round: impl FnMut() -> u64) -> f64 {
    let window = TIME / WINDOWS;
    let mut best = 0.0f64;
    for _ in 0..windows {
        let start = Instant::now();
        let mut n = 0u64;
        loop {
            n += round();
            let t = start.elapsed();
            if t >= window {
                best = best.max(n as f64 / t.as_secs_f64());
                break;
            }
        }
    }
    best
}

/// One batch of updates per round over the records of `events`, `batch`
/// at a time, cycling.
fn update_rate(events: &[Event], batch: usize, mut apply: impl FnMut(&mut Vec<Event>)) -> f64 {
    let mut buf = Vec::with_capacity(batch);
    let mut at = 0;
    best_rate(WINDOWS, || {
        let end = (at + batch).min(events.len());
        buf.extend_from_slice(&events[at..end]);
        apply(&mut buf);
        buf.clear();
        let n = end - at;
        at = if end == events.len() { 0 } else { end };
        n as u64
    })
}

/// Runs `f` on a thread of its own pinned to core 0 and returns what it
/// gives, or `failed` should it panic: the caller's affinity (the job's,
/// after the probe) is left alone.
fn on_core_0<R: Send>(failed: R, f: impl FnOnce() -> R + Send) -> R {
    std::thread::scope(|s| {
        s.spawn(|| {
            pin_to_core(0);
            f()
        })
        .join()
        .unwrap_or(failed)
    })
}

/// Writes `n` events (at most the free slots) numbered from `seq` on.
fn write_events(tx: &mut rtrb::Producer<Event>, n: usize, seq: &mut u64) {
    let w = tx.write_chunk_uninit(n).expect("the caller saw n free slots");
    let written = w.fill_from_iter((*seq..).map(|s| Event {
        key: s,
        value: s,
        emitted_ns: 0,
        seq: s,
    }));
    *seq += written as u64;
}

/// Reads `n` events (at most the full slots) as weir's input task does:
/// each is copied out into `out` (its batch) and a word is written back
/// into its slot (the task leaves an empty message behind). The values are
/// added to `sum`, so every copy is used.
///
/// The write-back matters on this guest: in its slow state, a reader that
/// leaves the slots clean makes the writer's next lap over them 5x slower
/// (68 against 360 M records/s), as shared lines are taken back by a
/// slower path than lines the reader holds dirty. A probe that only read
/// put the "ceiling" at 62 M ev/s while the job ran at 100-150 M.
fn read_events(rx: &mut rtrb::Consumer<Event>, n: usize, out: &mut Vec<Event>, sum: &mut u64) {
    let mut c = rx.read_chunk(n).expect("the caller saw n full slots");
    let (a, b) = c.as_mut_slices();
    out.clear();
    for slot in a.iter_mut().chain(b.iter_mut()) {
        out.push(*slot);
        slot.key = 0;
    }
    c.commit_all();
    *sum = out.iter().fold(*sum, |s, e| s.wrapping_add(e.value));
}

/// Records/s through a ring of `capacity` between two pinned threads, in
/// chunks of `chunk`.
fn ring_rate(capacity: usize, chunk: usize) -> f64 {
    let (mut tx, mut rx) = rtrb::RingBuffer::<Event>::new(capacity);
    let chunk = chunk.clamp(1, capacity);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            pin_to_core(0);
            let mut seq = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let n = tx.slots().min(chunk);
                if n == 0 {
                    std::hint::spin_loop();
                    continue;
                }
                write_events(&mut tx, n, &mut seq);
            }
        });
        // On a thread of its own: pinning the caller would pin the job
        // that runs after the probe.
        let reader = s.spawn(|| {
            pin_to_core(1);
            let (mut sum, mut out) = (0u64, Vec::with_capacity(chunk));
            // Twice the windows: both threads must run at once, and on a
            // shared machine fewer windows find both cores free.
            let r = best_rate(2 * WINDOWS, || {
                let n = rx.slots().min(chunk);
                if n == 0 {
                    std::hint::spin_loop();
                    return 0;
                }
                read_events(&mut rx, n, &mut out, &mut sum);
                n as u64
            });
            std::hint::black_box(sum);
            r
        });
        let rate = reader.join().unwrap_or(0.0);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        rate
    })
}

/// Records/s through a ring of `capacity` on one thread pinned to core 0,
/// which writes a chunk of `chunk` and reads it back: a one-worker job's
/// rings, whose both sides run on one core.
fn one_core_ring_rate(capacity: usize, chunk: usize) -> f64 {
    let (mut tx, mut rx) = rtrb::RingBuffer::<Event>::new(capacity);
    let chunk = chunk.clamp(1, capacity);
    on_core_0(0.0, || {
        let (mut seq, mut sum, mut out) = (0u64, 0u64, Vec::with_capacity(chunk));
        let r = best_rate(WINDOWS, || {
            // The ring is empty between rounds, so a chunk fits.
            write_events(&mut tx, chunk, &mut seq);
            read_events(&mut rx, chunk, &mut out, &mut sum);
            chunk as u64
        });
        std::hint::black_box(sum);
        r
    })
}

/// The running-sum update of the keyed job, on a `FxHashMap`.
fn map_rate(events: &[Event], batch: usize) -> f64 {
    let mut map: FxHashMap<u64, u64> = FxHashMap::default();
    let r = update_rate(events, batch, |b| {
        for e in b.drain(..) {
            let s = map.entry(e.key).or_default();
            *s = s.wrapping_add(e.value);
        }
    });
    std::hint::black_box(&map);
    r
}

/// The same update through weir's mapped value store; `None` if the store
/// cannot be created in `dir`.
fn mapped_rate(events: &[Event], batch: usize, dir: &std::path::Path) -> Option<f64> {
    let mut store: ValueStore<u64, u64> = ValueStore::create(StoreOptions::new(dir)).ok()?;
    let r = update_rate(events, batch, |b| {
        store.update_records(b, |e| e.key, |_, s, e| *s = s.wrapping_add(e.value));
    });
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
    Some(r)
}

/// The hash exchange's routing alone, nanoseconds per record: each key's
/// stable hash and target, one thread pinned to core 0, over the job's key
/// spread. With two targets and a power of two of key groups (the keyed
/// job's 2 and 128), the target is the hash's top bit, as the exchange
/// computes it. What a keyed job with more than one worker pays per record
/// and a one-worker job does not (its exchange has one target and
/// computes no key): the scaling model's `h`.
pub fn route_ns(keys: u64, batch: usize) -> f64 {
    use weir_core::keyed::stable_hash;
    let events = key_sequence(keys.max(1), 1 << 16);
    let rate = on_core_0(0.0, || {
        let (mut to_second, mut at) = (0u64, 0usize);
        let batch = batch.max(1);
        // Read in place, not copied as the map figures' batches are: the
        // exchange reads its records where the generator wrote them.
        let r = best_rate(WINDOWS, || {
            let end = (at + batch).min(events.len());
            for e in &events[at..end] {
                to_second += stable_hash(&e.key) >> 63;
            }
            let n = end - at;
            at = if end == events.len() { 0 } else { end };
            n as u64
        });
        std::hint::black_box(to_second);
        r
    });
    if rate > 0.0 {
        1e9 / rate
    } else {
        0.0
    }
}

/// Measures the three parts for a job of `threads` workers, `keys` keys,
/// batches of `batch` records and rings of `ring_capacity`: the ring
/// first, then the two map figures on one thread pinned to core 0. Every
/// figure runs on threads of its own: the caller's affinity (the job's,
/// after the probe) is left alone. `ring_on_path`: the job's records go
/// through rings (the ceiling counts the ring only then).
pub fn measure(threads: usize, keys: u64, batch: usize, ring_capacity: usize, ring_on_path: bool) -> Parts {
    let threads = threads.max(1);
    let batch = batch.max(1);
    let ring = if threads == 1 {
        one_core_ring_rate(ring_capacity, batch)
    } else {
        ring_rate(ring_capacity, batch)
    };
    let events = key_sequence(keys.max(1), 1 << 16);
    let (map, mapped) = on_core_0((0.0, 0.0), || {
        let map = map_rate(&events, batch);
        let dir = weir_core::default_state_dir().join(format!("weir-parts-{}", std::process::id()));
        (map, mapped_rate(&events, batch, &dir).unwrap_or(0.0))
    });
    Parts {
        threads,
        keys,
        ring_items_per_sec: ring,
        map_updates_per_sec: map,
        mapped_updates_per_sec: mapped,
        limit_events_per_sec: if ring_on_path {
            limit(threads, ring, map)
        } else {
            threads as f64 * map
        },
        ring_on_path,
        handoff_ns: (threads > 1).then(crate::lab::handoff_probe::one_way_ns).flatten(),
    }
}

/// `threads / (2 / ring + 1 / map)`, or for one thread (whose ring figure
/// counts both sides) `1 / (1 / ring + 1 / map)`; 0 if a part was not
/// measured.
pub fn limit(threads: usize, ring: f64, map: f64) -> f64 {
    if ring <= 0.0 || map <= 0.0 {
        return 0.0;
    }
    if threads <= 1 {
        return 1.0 / (1.0 / ring + 1.0 / map);
    }
    threads as f64 / (2.0 / ring + 1.0 / map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_adds_the_parts_per_event_costs() {
        // 500 M/s through the ring (2 ns a side) and 250 M/s of updates
        // (4 ns): 8 ns of core time per event, 2 cores: 250 M ev/s.
        assert!((limit(2, 500e6, 250e6) - 250e6).abs() < 1.0);
        assert_eq!(limit(2, 0.0, 1.0), 0.0);
        // One core: 500 M/s through the ring, both sides counted (2 ns),
        // and 4 ns an update: 6 ns an event.
        assert!((limit(1, 500e6, 250e6) - 1e9 / 6.0).abs() < 1.0);
    }

    #[test]
    fn keys_spread_over_the_range() {
        let e = key_sequence(10, 10_000);
        let mut seen = [0u32; 10];
        for x in &e {
            seen[x.key as usize] += 1;
        }
        assert!(seen.iter().all(|&n| (800..1200).contains(&n)), "{seen:?}");
    }

    #[test]
    fn the_ring_reader_copies_every_record_out_in_order() {
        let (mut tx, mut rx) = rtrb::RingBuffer::<Event>::new(8);
        let (mut seq, mut sum, mut out) = (0u64, 0u64, Vec::new());
        // Twice round the ring, so that the second lap's chunk wraps.
        for lap in 0..3u64 {
            write_events(&mut tx, 5, &mut seq);
            read_events(&mut rx, 5, &mut out, &mut sum);
            let seqs: Vec<u64> = out.iter().map(|e| e.seq).collect();
            assert_eq!(seqs, (lap * 5..lap * 5 + 5).collect::<Vec<_>>());
        }
        assert_eq!(sum, (0..15).sum::<u64>());
        assert!(rx.is_empty());
    }

    #[test]
    fn every_part_measures_something() {
        let events = key_sequence(100, 4096);
        assert!(map_rate(&events, 256) > 0.0);
        let dir = tempfile::tempdir().unwrap();
        assert!(mapped_rate(&events, 256, &dir.path().join("s")).unwrap() > 0.0);
        assert!(ring_rate(64, 16) > 0.0);
        assert!(one_core_ring_rate(64, 16) > 0.0);
        let h = route_ns(100, 256);
        assert!(h > 0.0 && h.is_finite(), "{h}");
        assert!(
            one_core_ring_rate(16, 64) > 0.0,
            "a chunk larger than the ring is clamped"
        );
    }
}
