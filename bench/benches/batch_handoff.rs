//! How records should pass between the tasks of a keyed job: through rings
//! of messages, as weir's exchange does today, or as whole batches handed
//! over by reference. Measured outside the engine, to know what a change
//! of the exchange could gain before making it (the engine now hands
//! batches over by reference where an exchange has one target on its own
//! worker: docs/notebook/benchmarks-2026-12.md, "The lead: batches handed
//! over by reference").
//!
//! Each of P threads (pinned to cores 0..P) runs the keyed job's shape:
//! generate a batch of 1,024 32-byte events over 10,000 keys, route each by
//! its stable hash's top bit (`weir_core::keyed::stable_hash`, as the
//! exchange does), keep a running sum per key in a hash map, and count what
//! comes out. Three shapes of the channel between the routing and the state:
//!
//! - **rings**, weir's shape: the batch is staged per target, copied in bulk
//!   into a ring of 2,048 40-byte messages (`write_chunk_uninit`), and the
//!   reader copies each record out and leaves an empty message behind;
//! - **batches**: each record is stored by the routing loop straight into a
//!   batch of its target, taken from a pool, and the full batch is handed
//!   over by reference (a ring of batches, and a ring back for the empties);
//! - **hybrid**: records are staged per target as in `rings`; the batch for
//!   the same thread is handed over by reference, the one for the other
//!   thread is first copied in bulk into a batch from the pool. With one
//!   thread the generator's batch itself is handed over.
//!
//! Two more shapes take the channel away, to show what the host gives two
//! threads and what the routing costs before anything crosses cores:
//!
//! - **alone**: each thread processes its own events itself, no routing
//!   and no channel: at P=2, two independent halves of the job;
//! - **routed**: as `alone`, but each batch is first split by the same
//!   route into two staged parts, both then processed by the thread itself:
//!   the routing's cost without the crossing.
//!
//! Their digests are those of P separate maps, one per thread.
//!
//! The state is an `FxHashMap`, not weir's mapped store, and there are no
//! barriers: this measures the channel, not the engine. Every run checks a
//! digest of the final per-key sums against one computed on one thread, so
//! every record reached its key once.
//!
//! `cargo bench -p weir-bench --bench batch_handoff`

use std::time::Instant;

use rustc_hash::FxHashMap;
use weir_core::keyed::stable_hash;

const KEYS: u64 = 10_000;
const BATCH: usize = 1024;
const RING: usize = 2048;
/// Batches in flight per pair of threads, in either direction.
const POOL: usize = 8;
const EVENTS: u64 = 100_000_000;
const ROUNDS: usize = 5;

#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
struct Event {
    key: u64,
    value: u64,
    emitted_ns: u64,
    seq: u64,
}

/// A ring message as weir's: a record or end-of-stream (40 bytes).
enum Message {
    Data(Event),
    End,
}

/// A ring entry of the batch shapes.
enum Handoff {
    Batch(Vec<Event>),
    End,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Shape {
    Rings,
    Batches,
    Hybrid,
    Alone,
    Routed,
}

fn pin(core: usize) {
    core_affinity::set_for_current(core_affinity::CoreId { id: core });
}

/// Thread `w` of `p`'s events: seq `w, w + p, ...`, keys from a xorshift.
struct Generator {
    x: u64,
    seq: u64,
    step: u64,
    left: u64,
}

impl Generator {
    fn new(w: usize, p: usize, events: u64) -> Self {
        Generator {
            x: 0x9E37_79B9_7F4A_7C15 ^ (w as u64 + 1),
            seq: w as u64,
            step: p as u64,
            left: events / p as u64,
        }
    }

    /// Appends up to a batch of events; false once all were made.
    #[inline]
    fn fill(&mut self, out: &mut Vec<Event>) -> bool {
        let n = self.left.min(BATCH as u64);
        for _ in 0..n {
            self.x ^= self.x << 13;
            self.x ^= self.x >> 7;
            self.x ^= self.x << 17;
            let key = ((u128::from(self.x) * u128::from(KEYS)) >> 64) as u64;
            out.push(Event {
                key,
                value: self.seq,
                emitted_ns: 1,
                seq: self.seq,
            });
            self.seq += self.step;
        }
        self.left -= n;
        n > 0
    }
}

/// The target of a record among `p` (1 or 2).
#[inline]
fn route(e: &Event, p: usize) -> usize {
    if p == 1 {
        0
    } else {
        (stable_hash(&e.key) >> 63) as usize
    }
}

/// The keyed operator and its sink: a running sum per key, each output
/// counted.
#[derive(Default)]
struct Keyed {
    sums: FxHashMap<u64, u64>,
    out: Vec<Event>,
    count: u64,
}

impl Keyed {
    #[inline]
    fn process(&mut self, batch: &mut Vec<Event>) {
        for e in batch.drain(..) {
            let sum = self.sums.entry(e.key).or_insert(0);
            *sum = sum.wrapping_add(e.value);
            self.out.push(Event { value: *sum, ..e });
        }
        self.count += self.out.len() as u64;
        self.out.clear();
    }

    /// Order-independent digest of the final sums.
    fn digest(&self) -> u64 {
        self.sums
            .iter()
            .fold(0u64, |d, (k, v)| d.wrapping_add(stable_hash(&(k, v))))
    }
}

/// The digest every shape must reach, computed on one thread.
fn expected(p: usize, events: u64) -> (u64, u64) {
    let mut k = Keyed::default();
    let mut batch = Vec::with_capacity(BATCH);
    for w in 0..p {
        let mut g = Generator::new(w, p, events);
        while g.fill(&mut batch) {
            k.process(&mut batch);
        }
    }
    (k.count, k.digest())
}

/// The digest of the `alone` and `routed` shapes: P maps, one per
/// thread, each over its own events.
fn expected_apart(p: usize, events: u64) -> (u64, u64) {
    let mut batch = Vec::with_capacity(BATCH);
    (0..p).fold((0, 0), |(count, digest), w| {
        let mut k = Keyed::default();
        let mut g = Generator::new(w, p, events);
        while g.fill(&mut batch) {
            k.process(&mut batch);
        }
        (count + k.count, digest.wrapping_add(k.digest()))
    })
}

/// Moves each record of `batch` to the end of `parts[route]`, as the
/// engine's two-target exchange does (`split_two` in `weir_core`): both
/// parts reserved once, both write positions in registers, no capacity
/// check per record. (`Vec::push` per record costs about 0.5 ns more.)
fn split(batch: &mut Vec<Event>, parts: &mut [Vec<Event>; 2]) {
    let n = batch.len();
    let [v0, v1] = parts;
    v0.reserve(n);
    v1.reserve(n);
    // SAFETY: each end starts at its vector's length, within its
    // allocation; `n` more fit in each (the reserves), and each record
    // advances one end by one, so all writes stay in reserved, unused
    // slots. `Event` is `Copy`: reading it out of `batch` and clearing
    // `batch` leaves each record owned once. The lengths set cover exactly
    // the slots written.
    unsafe {
        let (start0, start1) = (v0.as_mut_ptr().add(v0.len()), v1.as_mut_ptr().add(v1.len()));
        let (mut end0, mut end1) = (start0, start1);
        for e in batch.iter() {
            let second = route(e, 2) != 0;
            (if second { end1 } else { end0 }).write(*e);
            end0 = end0.add(usize::from(!second));
            end1 = end1.add(usize::from(second));
        }
        v0.set_len(v0.len() + end0.offset_from(start0) as usize);
        v1.set_len(v1.len() + end1.offset_from(start1) as usize);
    }
    batch.clear();
}

/// One thread of the `alone` and `routed` shapes.
fn apart_worker(w: usize, p: usize, events: u64, routed: bool) -> Keyed {
    pin(w);
    let mut g = Generator::new(w, p, events);
    let mut k = Keyed::default();
    let mut batch = Vec::with_capacity(BATCH);
    let mut staged: [Vec<Event>; 2] = [Vec::with_capacity(BATCH), Vec::with_capacity(BATCH)];
    while g.fill(&mut batch) {
        if routed {
            split(&mut batch, &mut staged);
            staged.iter_mut().for_each(|part| k.process(part));
        } else {
            k.process(&mut batch);
        }
    }
    k
}

/// One thread of the `rings` shape.
fn rings_worker(
    w: usize,
    p: usize,
    events: u64,
    mut outs: Vec<rtrb::Producer<Message>>,
    mut ins: Vec<rtrb::Consumer<Message>>,
) -> Keyed {
    pin(w);
    let mut g = Generator::new(w, p, events);
    let mut k = Keyed::default();
    let mut staged: Vec<Vec<Message>> = (0..p).map(|_| Vec::with_capacity(BATCH)).collect();
    let mut batch = Vec::with_capacity(BATCH);
    let mut input = Vec::with_capacity(BATCH);
    let (mut made_all, mut ended) = (false, 0);
    while ended < p {
        if !made_all && staged.iter().all(Vec::is_empty) {
            if g.fill(&mut batch) {
                for e in batch.drain(..) {
                    staged[route(&e, p)].push(Message::Data(e));
                }
            } else {
                made_all = true;
                staged.iter_mut().for_each(|s| s.push(Message::End));
            }
        }
        for (out, st) in outs.iter_mut().zip(staged.iter_mut()) {
            if st.is_empty() || out.slots() < st.len() {
                continue;
            }
            let mut chunk = out.write_chunk_uninit(st.len()).expect("slots() has room");
            let (a, b) = chunk.as_mut_slices();
            // SAFETY: `st` holds `a.len() + b.len()` initialised messages,
            // moved bitwise into the chunk's uninitialised slots (disjoint
            // from the vector); the vector's length is then cleared without
            // dropping them, so each message is owned once, by the ring.
            unsafe {
                std::ptr::copy_nonoverlapping(st.as_ptr(), a.as_mut_ptr().cast::<Message>(), a.len());
                std::ptr::copy_nonoverlapping(st.as_ptr().add(a.len()), b.as_mut_ptr().cast::<Message>(), b.len());
                st.set_len(0);
                chunk.commit_all();
            }
        }
        for inbox in ins.iter_mut() {
            let n = inbox.slots();
            if n == 0 {
                continue;
            }
            let mut chunk = inbox.read_chunk(n).expect("slots() has records");
            let (a, b) = chunk.as_mut_slices();
            for m in a.iter_mut().chain(b.iter_mut()) {
                match std::mem::replace(m, Message::End) {
                    Message::Data(e) => input.push(e),
                    Message::End => ended += 1,
                }
            }
            chunk.commit_all();
            k.process(&mut input);
        }
    }
    k
}

/// One thread's rings in the `batches` and `hybrid` shapes: `outs[t]`
/// hands batches to thread `t`, `ins[f]` receives thread `f`'s, `backs[f]`
/// returns thread `f`'s empties to it, `pool[t]` holds the empties for
/// target `t`.
struct Links {
    outs: Vec<rtrb::Producer<Handoff>>,
    ins: Vec<rtrb::Consumer<Handoff>>,
    backs: Vec<rtrb::Producer<Vec<Event>>>,
    pool: Vec<rtrb::Consumer<Vec<Event>>>,
}

/// One thread of the `batches` and `hybrid` shapes.
fn batches_worker(w: usize, p: usize, events: u64, hybrid: bool, links: Links) -> Keyed {
    let Links {
        mut outs,
        mut ins,
        mut backs,
        mut pool,
    } = links;
    pin(w);
    let mut g = Generator::new(w, p, events);
    let mut k = Keyed::default();
    let mut staged: Vec<Vec<Event>> = (0..p).map(|_| Vec::with_capacity(BATCH)).collect();
    let mut pending: Vec<Option<Handoff>> = (0..p).map(|_| None).collect();
    let mut batch = Vec::with_capacity(BATCH);
    let (mut made_all, mut ended) = (false, 0);
    while ended < p {
        for (out, slot) in outs.iter_mut().zip(pending.iter_mut()) {
            if let Some(h) = slot.take() {
                if let Err(rtrb::PushError::Full(h)) = out.push(h) {
                    *slot = Some(h);
                }
            }
        }
        let room = pending.iter().all(Option::is_none) && pool.iter().all(|c| c.slots() > 0);
        if !made_all && room {
            let mut empties: Vec<Vec<Event>> = Vec::new();
            if g.fill(&mut batch) {
                empties.extend(pool.iter_mut().map(|c| c.pop().expect("slots() has one")));
                if p == 1 {
                    // The generator's batch itself is handed over.
                    std::mem::swap(&mut batch, &mut empties[0]);
                } else if hybrid {
                    for e in batch.drain(..) {
                        staged[route(&e, p)].push(e);
                    }
                    for (t, (st, empty)) in staged.iter_mut().zip(empties.iter_mut()).enumerate() {
                        if t == w {
                            std::mem::swap(st, empty);
                        } else {
                            empty.extend_from_slice(st);
                            st.clear();
                        }
                    }
                } else {
                    for e in batch.drain(..) {
                        empties[route(&e, p)].push(e);
                    }
                }
                for (slot, full) in pending.iter_mut().zip(empties) {
                    *slot = Some(Handoff::Batch(full));
                }
            } else {
                made_all = true;
                pending.iter_mut().for_each(|s| *s = Some(Handoff::End));
            }
        }
        for (from, inbox) in ins.iter_mut().enumerate() {
            while let Ok(h) = inbox.pop() {
                match h {
                    Handoff::Batch(mut b) => {
                        k.process(&mut b);
                        // The ring back holds every batch of the pair: room.
                        backs[from].push(b).expect("a place for each batch");
                    }
                    Handoff::End => ended += 1,
                }
            }
        }
    }
    k
}

/// Events/s of one run, after checking its digest against `want`.
fn run(shape: Shape, p: usize, want: (u64, u64)) -> f64 {
    let start;
    let done: Vec<Keyed> = match shape {
        Shape::Rings => {
            let mut outs: Vec<Vec<_>> = (0..p).map(|_| Vec::new()).collect();
            let mut ins: Vec<Vec<_>> = (0..p).map(|_| Vec::new()).collect();
            for out in outs.iter_mut() {
                for inbox in ins.iter_mut() {
                    let (tx, rx) = rtrb::RingBuffer::new(RING);
                    out.push(tx);
                    inbox.push(rx);
                }
            }
            start = Instant::now();
            std::thread::scope(|s| {
                let hs: Vec<_> = outs
                    .into_iter()
                    .zip(ins)
                    .enumerate()
                    .map(|(w, (o, i))| s.spawn(move || rings_worker(w, p, EVENTS, o, i)))
                    .collect();
                hs.into_iter().map(|h| h.join().expect("a worker")).collect()
            })
        }
        Shape::Batches | Shape::Hybrid => {
            // [from][to]: handoffs from -> to; empties back to -> from.
            let mut outs: Vec<Vec<_>> = (0..p).map(|_| Vec::new()).collect();
            let mut ins: Vec<Vec<_>> = (0..p).map(|_| Vec::new()).collect();
            let mut backs: Vec<Vec<_>> = (0..p).map(|_| Vec::new()).collect();
            let mut pools: Vec<Vec<_>> = (0..p).map(|_| Vec::new()).collect();
            for f in 0..p {
                for t in 0..p {
                    let (tx, rx) = rtrb::RingBuffer::new(POOL + 1);
                    outs[f].push(tx);
                    ins[t].push(rx);
                    let (mut back, empties) = rtrb::RingBuffer::new(POOL + 1);
                    for _ in 0..POOL {
                        back.push(Vec::with_capacity(BATCH)).expect("room for the pool");
                    }
                    backs[t].push(back);
                    pools[f].push(empties);
                }
            }
            let hybrid = shape == Shape::Hybrid;
            start = Instant::now();
            std::thread::scope(|s| {
                let hs: Vec<_> = (outs.into_iter().zip(ins))
                    .zip(backs.into_iter().zip(pools))
                    .enumerate()
                    .map(|(w, ((outs, ins), (backs, pool)))| {
                        let links = Links { outs, ins, backs, pool };
                        s.spawn(move || batches_worker(w, p, EVENTS, hybrid, links))
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().expect("a worker")).collect()
            })
        }
        Shape::Alone | Shape::Routed => {
            let routed = shape == Shape::Routed;
            start = Instant::now();
            std::thread::scope(|s| {
                let hs: Vec<_> = (0..p)
                    .map(|w| s.spawn(move || apart_worker(w, p, EVENTS, routed)))
                    .collect();
                hs.into_iter().map(|h| h.join().expect("a worker")).collect()
            })
        }
    };
    let rate = EVENTS as f64 / start.elapsed().as_secs_f64();
    let count: u64 = done.iter().map(|k| k.count).sum();
    let digest = done.iter().fold(0u64, |d, k| d.wrapping_add(k.digest()));
    assert_eq!((count, digest), want, "{shape:?} at {p}: every record to its key once");
    rate
}

fn main() {
    let cores = core_affinity::get_core_ids().map_or(1, |c| c.len());
    let ps: Vec<usize> = [1, 2].into_iter().filter(|&p| p <= cores).collect();
    let wants: Vec<_> = ps
        .iter()
        .map(|&p| (expected(p, EVENTS), expected_apart(p, EVENTS)))
        .collect();
    let runs: Vec<(usize, Shape)> = ps
        .iter()
        .flat_map(|&p| [Shape::Rings, Shape::Batches, Shape::Hybrid, Shape::Alone, Shape::Routed].map(|s| (p, s)))
        // With one target `hybrid` is `batches`.
        .filter(|&(p, s)| !(p == 1 && s == Shape::Hybrid))
        .collect();
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); runs.len()];
    println!("M events/s, {EVENTS} events a run, keyed job's shape over {KEYS} keys; rounds alternate the shapes");
    for round in 0..ROUNDS {
        let mut line = format!("round {round}:");
        for (&(p, shape), rates) in runs.iter().zip(rates.iter_mut()) {
            let (want, want_apart) = wants[ps.iter().position(|&q| q == p).expect("a listed p")];
            let want = if matches!(shape, Shape::Alone | Shape::Routed) {
                want_apart
            } else {
                want
            };
            let rate = run(shape, p, want) / 1e6;
            rates.push(rate);
            line += &format!("  p={p} {shape:?} {rate:.1}");
        }
        println!("{line}");
    }
    let mut line = "median: ".to_string();
    for (&(p, shape), rates) in runs.iter().zip(rates.iter_mut()) {
        rates.sort_by(f64::total_cmp);
        line += &format!("  p={p} {shape:?} {:.1}", rates[rates.len() / 2]);
    }
    println!("{line}");
}
