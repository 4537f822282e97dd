//! What a ring slot's size costs a record that crosses cores: records/s and
//! bytes/s through an `rtrb` ring between threads pinned to cores 0 and 1,
//! with 40-byte slots (a `Message<Event>` of weir's rings: the 32-byte
//! event and its tag) against 32-byte slots (the event alone), in
//! alternating runs, each round beside the one-way handoff between the
//! cores measured just before it.
//!
//! Both runs move records as weir's rings do: the producer copies chunks of
//! up to 1,024 records from a staging buffer into the free slots, the
//! consumer copies each record out and writes one word back into its slot
//! (an input task leaves an empty message behind), in a ring of 2,048
//! slots. If the crossing costs per byte, the 32-byte slots carry about 5/4
//! of the records; if it costs per record or per chunk, about as many.
//!
//! `cargo bench -p weir-bench --bench ring_slots`

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crossbeam_utils::CachePadded;

const CAPACITY: usize = 2048;
const CHUNK: usize = 1024;
const RECORDS: u64 = 50_000_000;
const ROUNDS: usize = 6;

/// A record with a word to write back, in `WORDS` 8-byte words.
#[derive(Clone, Copy)]
#[repr(C)]
struct Slot<const WORDS: usize>([u64; WORDS]);

fn pin(core: usize) {
    core_affinity::set_for_current(core_affinity::CoreId { id: core });
}

/// Records per second through the ring, `RECORDS` of them.
fn rate<const WORDS: usize>() -> f64 {
    let (mut tx, mut rx) = rtrb::RingBuffer::<Slot<WORDS>>::new(CAPACITY);
    let start = Instant::now();
    std::thread::scope(|s| {
        s.spawn(move || {
            pin(0);
            let staged = vec![Slot::<WORDS>([7; WORDS]); CHUNK];
            let mut sent = 0u64;
            while sent < RECORDS {
                let n = tx.slots().min(CHUNK).min((RECORDS - sent) as usize);
                if n == 0 {
                    std::hint::spin_loop();
                    continue;
                }
                let mut chunk = tx.write_chunk_uninit(n).expect("n slots are free");
                let (first, second) = chunk.as_mut_slices();
                for (dst, src) in first.iter_mut().chain(second.iter_mut()).zip(&staged) {
                    dst.write(*src);
                }
                // SAFETY: every one of the chunk's n slots was written above
                // (`staged` holds CHUNK >= n records).
                unsafe { chunk.commit_all() };
                sent += n as u64;
            }
        });
        s.spawn(move || {
            pin(1);
            let mut out = vec![Slot::<WORDS>([0; WORDS]); CHUNK];
            let (mut got, mut sum) = (0u64, 0u64);
            while got < RECORDS {
                let n = rx.slots().min(CHUNK);
                if n == 0 {
                    std::hint::spin_loop();
                    continue;
                }
                let mut chunk = rx.read_chunk(n).expect("n slots are full");
                let (first, second) = chunk.as_mut_slices();
                for (slot, o) in first.iter_mut().chain(second.iter_mut()).zip(out.iter_mut()) {
                    *o = *slot;
                    slot.0[0] = 0;
                    sum = sum.wrapping_add(o.0[WORDS - 1]);
                }
                chunk.commit_all();
                std::hint::black_box(&out);
                got += n as u64;
            }
            std::hint::black_box(sum);
        });
    });
    RECORDS as f64 / start.elapsed().as_secs_f64()
}

/// One-way handoff between cores 0 and 1, ns: a counter bounced 20,000 times.
fn handoff_ns() -> f64 {
    const TRIPS: u64 = 20_000;
    let line = CachePadded::new(AtomicU64::new(0));
    let start = Instant::now();
    std::thread::scope(|s| {
        for (core, parity) in [(0usize, 0u64), (1, 1)] {
            let line = &line;
            s.spawn(move || {
                pin(core);
                for i in 0..TRIPS {
                    while line.load(Ordering::Acquire) != 2 * i + parity {
                        std::hint::spin_loop();
                    }
                    line.store(2 * i + parity + 1, Ordering::Release);
                }
            });
        }
    });
    start.elapsed().as_nanos() as f64 / (2 * TRIPS) as f64
}

fn main() {
    if core_affinity::get_core_ids().unwrap_or_default().len() < 2 {
        println!("ring_slots needs two cores");
        return;
    }
    println!("records through a ring from core 0 to core 1, {RECORDS} per run: 40-byte slots against 32-byte ones");
    println!("round  handoff   40 B: M rec/s  GB/s   32 B: M rec/s  GB/s   32 B / 40 B records");
    for round in 0..ROUNDS {
        let h = handoff_ns();
        // Alternating order within the round: 40, 32, 32, 40.
        let (a, b, c, d) = (rate::<5>(), rate::<4>(), rate::<4>(), rate::<5>());
        let (r40, r32) = ((a + d) / 2.0, (b + c) / 2.0);
        println!(
            "{round:>5}  {h:>5.0} ns   {:>12.0}  {:>4.1}   {:>12.0}  {:>4.1}   {:>6.2}",
            r40 / 1e6,
            r40 * 40.0 / 1e9,
            r32 / 1e6,
            r32 * 32.0 / 1e9,
            r32 / r40
        );
    }
}
