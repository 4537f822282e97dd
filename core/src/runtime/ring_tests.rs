//! Cross-thread tests of the ring handoff (Outbox -> Inbox).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rtrb::RingBuffer;

use crate::error::BoxError;
use crate::runtime::collector::Collector;
use crate::runtime::context::TaskContext;
use crate::runtime::message::Message;
use crate::runtime::metrics::TaskCounters;
use crate::runtime::output::{HashOutput, Outbox, RebalanceOutput};
use crate::runtime::task::{Inbox, InputTask, Task, TaskPoll};

/// A test must never spin forever: every wait loop gives up after this.
const DEADLINE: Duration = Duration::from_secs(20);

/// The i-th record of a stream: a bijective scramble of `i`, so that a
/// record out of place (or duplicated, or lost) changes the checksum and
/// fails the per-position comparison.
fn value(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Order-insensitive digest of a multiset of values, plus a count.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Checksum {
    count: u64,
    sum: u64,
    xor: u64,
}

impl Checksum {
    fn add(&mut self, x: u64) {
        self.count += 1;
        self.sum = self.sum.wrapping_add(x.wrapping_mul(0x100_0000_01b3));
        self.xor ^= x;
    }
}

/// A small deterministic generator of chunk sizes.
struct Lcg(u64);

impl Lcg {
    fn next_in(&mut self, lo: usize, hi: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        lo + ((self.0 >> 33) as usize) % (hi - lo + 1)
    }
}

/// Backs off while a ring is full or empty, and fails instead of hanging.
fn wait(start: Instant, what: &str) {
    assert!(start.elapsed() < DEADLINE, "stuck waiting: {what}");
    thread::yield_now();
}

fn test_ctx(input_capacity: u64) -> (TaskContext, Arc<TaskCounters>) {
    TaskContext::for_test("test", 1, input_capacity)
}

/// Number of records per stream: large enough for millions of wrap-arounds
/// of a 64-slot ring, small enough to stay fast in debug builds.
const N: u64 = if cfg!(debug_assertions) { 2_000_000 } else { 8_000_000 };

#[test]
fn outbox_to_read_chunk_keeps_count_order_and_checksum() {
    let (producer, mut consumer) = RingBuffer::<Message<u64>>::new(64);

    let sender = thread::spawn(move || {
        let start = Instant::now();
        let mut outbox = Outbox::new(producer, 256);
        let mut sizes = Lcg(7);
        let mut sent = Checksum::default();
        let mut i = 0;
        while i < N {
            // Chunks from 1 record to several times the ring's capacity, so
            // that flushes are partial as often as they are complete.
            let chunk = (sizes.next_in(1, 300) as u64).min(N - i);
            for k in i..i + chunk {
                let x = value(k);
                sent.add(x);
                outbox.stage(Message::Data(x));
            }
            i += chunk;
            while !outbox.flush() {
                wait(start, "producer: ring full");
            }
        }
        outbox.stage(Message::End);
        while !outbox.flush() {
            wait(start, "producer: ring full at end");
        }
        sent
    });

    let receiver = thread::spawn(move || {
        let start = Instant::now();
        let mut sizes = Lcg(11);
        let mut got = Checksum::default();
        let mut ended = false;
        while !ended {
            let available = consumer.slots();
            if available == 0 {
                wait(start, "consumer: ring empty");
                continue;
            }
            let n = available.min(sizes.next_in(1, 80));
            let chunk = consumer.read_chunk(n).expect("slots() said so");
            assert_eq!(chunk.len(), n);
            for m in chunk {
                assert!(!ended, "a message after End");
                match m {
                    Message::Data(x) => {
                        assert_eq!(x, value(got.count), "record {} out of order", got.count);
                        got.add(x);
                    }
                    Message::End => ended = true,
                    other => panic!("unexpected message {other:?}"),
                }
            }
        }
        // End is the last message ever written: the ring stays empty once
        // the producer is gone.
        let abandoned = Instant::now();
        while !consumer.is_abandoned() {
            wait(abandoned, "producer never dropped its end");
        }
        assert_eq!(consumer.slots(), 0, "messages after End");
        got
    });

    let sent = sender.join().expect("producer thread");
    let got = receiver.join().expect("consumer thread");
    let mut expected = Checksum::default();
    (0..N).for_each(|i| expected.add(value(i)));
    assert_eq!(sent, expected);
    assert_eq!(got, expected);
    assert_eq!(got.count, N);
}

/// Records whose drops are counted: the handoff must neither leak nor drop
/// twice, also when a ring is dropped with records still in it.
#[derive(Debug)]
struct Tracked {
    seq: u64,
    payload: Box<u64>,
    drops: Arc<AtomicUsize>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn heap_records_are_moved_exactly_once_even_when_rings_are_dropped_full() {
    const M: u64 = 50_000;
    let drops = Arc::new(AtomicUsize::new(0));
    let (producer, mut consumer) = RingBuffer::<Message<Tracked>>::new(29);
    let stop_at = M / 2;
    let consumer_gone = Arc::new(AtomicBool::new(false));
    let gone = consumer_gone.clone();
    let d = drops.clone();
    let sender = thread::spawn(move || {
        let start = Instant::now();
        let mut outbox = Outbox::new(producer, 64);
        let mut sizes = Lcg(3);
        let mut seq = 0;
        while seq < M {
            for _ in 0..sizes.next_in(1, 40) {
                outbox.stage(Message::Data(Tracked {
                    seq,
                    payload: Box::new(seq * 3),
                    drops: d.clone(),
                }));
                seq += 1;
            }
            // Stop flushing once the consumer has gone: what is staged and
            // what sits in the ring must then be dropped by the drops below.
            while !outbox.flush() {
                if gone.load(Ordering::Acquire) {
                    return seq;
                }
                wait(start, "tracked producer");
            }
        }
        seq
    });
    let start = Instant::now();
    let mut received = 0u64;
    let mut sizes = Lcg(9);
    // Read in chunks so that the producer finds free space in runs and its
    // chunked writes wrap around the end of the ring.
    while received < stop_at {
        let n = consumer.slots().min(sizes.next_in(1, 13));
        if n == 0 {
            wait(start, "tracked consumer");
            continue;
        }
        for m in consumer.read_chunk(n).unwrap() {
            match m {
                Message::Data(t) => {
                    assert_eq!(t.seq, received);
                    assert_eq!(*t.payload, received * 3);
                    received += 1;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        // Now and then pause with the ring partly drained, so that the
        // producer writes into free space that straddles the ring's end
        // (without this the two threads can fall into a full/empty lockstep
        // in which every write starts at slot 0).
        if sizes.next_in(0, 7) == 0 {
            thread::sleep(Duration::from_micros(20));
        }
    }
    consumer_gone.store(true, Ordering::Release);
    drop(consumer);
    let created = sender.join().expect("producer thread");
    assert!(created >= stop_at);
    assert_eq!(
        drops.load(Ordering::Relaxed) as u64,
        created,
        "every record created is dropped exactly once"
    );
}

#[test]
fn scripted_wraparound_keeps_order_and_ownership() {
    // Single-threaded and deterministic: chunked writes and reads of every
    // size at every ring position, so that writes split at the ring's end.
    let drops = Arc::new(AtomicUsize::new(0));
    // Records may use all slots but the reserved ones.
    const CAP: usize = crate::runtime::output::RESERVED_SLOTS + 7;
    const DATA_ROOM: usize = CAP - crate::runtime::output::RESERVED_SLOTS;
    let (producer, mut consumer) = RingBuffer::<Message<Tracked>>::new(CAP);
    let mut outbox = Outbox::new(producer, 4);
    let mut sizes = Lcg(5);
    let (mut created, mut received) = (0u64, 0u64);
    for _ in 0..5_000 {
        for _ in 0..sizes.next_in(0, 12) {
            outbox.stage(Message::Data(Tracked {
                seq: created,
                payload: Box::new(created * 3),
                drops: drops.clone(),
            }));
            created += 1;
        }
        let all_flushed = outbox.flush();
        let queued = consumer.slots();
        assert!(queued <= DATA_ROOM, "records never use the reserved slots");
        assert!(
            all_flushed || queued == DATA_ROOM,
            "a partial flush fills the ring up to the reserved slots"
        );
        let n = queued.min(sizes.next_in(0, DATA_ROOM));
        for m in consumer.read_chunk(n).unwrap() {
            match m {
                Message::Data(t) => {
                    assert_eq!((t.seq, *t.payload), (received, received * 3));
                    received += 1;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(
            drops.load(Ordering::Relaxed) as u64,
            received,
            "only consumed records are dropped"
        );
    }
    assert!(
        received > 10_000 && created - received > 7,
        "the script keeps a backlog"
    );
    drop(consumer);
    drop(outbox);
    assert_eq!(
        drops.load(Ordering::Relaxed) as u64,
        created,
        "every record dropped exactly once"
    );
}

/// What [`Checker`] saw: the digest and, per producer, the next expected sequence number.
type CheckerResult = (Checksum, Vec<u64>);

/// A chain end that checks what an input task hands it: per producer the
/// records arrive in order, and `finish` comes once, after everything.
///
/// It also pretends, now and then, that its output hit a full ring. The
/// task must then stop feeding it: `InputTask` checks pending output only
/// at the start of a turn (it may still hand on the rest of the current
/// turn's budget, one `collect` per input ring), so what arrives while
/// output is pending must stay within one turn's budget.
struct Checker {
    next_seq: Vec<u64>,
    got: Checksum,
    pending_flushes: u32,
    collects: u64,
    /// Records handed on since output became pending.
    while_pending: usize,
    budget: usize,
    finished: Arc<AtomicBool>,
    result: Arc<Mutex<Option<CheckerResult>>>,
}

impl Collector<(usize, u64)> for Checker {
    fn barrier(
        &mut self,
        _barrier: crate::runtime::message::Barrier,
        _snap: &mut crate::checkpoint::snapshot::TaskSnapshot,
        _ctx: &mut TaskContext,
    ) -> Result<(), BoxError> {
        Ok(())
    }

    fn notify(&mut self, _notice: crate::runtime::collector::Notice, _ctx: &mut TaskContext) -> Result<(), BoxError> {
        Ok(())
    }

    fn restore(
        &mut self,
        _r: &crate::runtime::collector::RestoreCtx<'_>,
        _ctx: &mut TaskContext,
    ) -> Result<(), BoxError> {
        Ok(())
    }

    fn watermark(&mut self, _wm: i64, _ctx: &mut TaskContext) -> Result<(), BoxError> {
        Ok(())
    }

    fn tick(&mut self, _ctx: &mut TaskContext) -> Result<(), BoxError> {
        Ok(())
    }

    fn collect(&mut self, batch: &mut Vec<(usize, u64)>, _ctx: &mut TaskContext) -> Result<(), BoxError> {
        if self.pending_flushes > 0 {
            self.while_pending += batch.len();
            assert!(
                self.while_pending <= self.budget,
                "{} records handed on while output was pending (turn budget {})",
                self.while_pending,
                self.budget
            );
        }
        assert!(!self.finished.load(Ordering::Relaxed), "collect after finish");
        assert!(!batch.is_empty(), "an input task hands on no empty batch");
        for (source, seq) in batch.drain(..) {
            assert_eq!(seq, self.next_seq[source], "source {source} out of order");
            self.next_seq[source] += 1;
            self.got.add(value(seq) ^ source as u64);
        }
        self.collects += 1;
        // Every third batch pretends its output hit a full ring for two flushes.
        if self.collects == 3 && self.pending_flushes == 0 {
            self.collects = 0;
            self.pending_flushes = 2;
            self.while_pending = 0;
        }
        Ok(())
    }

    fn flush(&mut self, _ctx: &mut TaskContext) -> Result<bool, BoxError> {
        if self.pending_flushes > 0 {
            self.pending_flushes -= 1;
        }
        Ok(self.pending_flushes == 0)
    }

    fn finish(&mut self, _ctx: &mut TaskContext) -> Result<(), BoxError> {
        assert!(!self.finished.swap(true, Ordering::Relaxed), "finish called twice");
        *self.result.lock().unwrap() = Some((self.got, self.next_seq.clone()));
        Ok(())
    }
}

#[test]
fn input_task_merges_producers_in_order_and_respects_pending_output() {
    const PRODUCERS: usize = 3;
    const PER: u64 = 100_000;
    const CAP: usize = 32;
    let mut inboxes = Vec::new();
    let mut senders = Vec::new();
    for source in 0..PRODUCERS {
        let (p, c) = RingBuffer::<Message<(usize, u64)>>::new(CAP);
        inboxes.push(Inbox::new(c, None, None));
        senders.push(thread::spawn(move || {
            let start = Instant::now();
            let mut outbox = Outbox::new(p, 128);
            let mut sizes = Lcg(source as u64 + 100);
            let mut seq = 0;
            while seq < PER {
                let n = (sizes.next_in(1, 100) as u64).min(PER - seq);
                (seq..seq + n).for_each(|s| outbox.stage(Message::Data((source, s))));
                seq += n;
                while !outbox.flush() {
                    wait(start, "input-task producer");
                }
            }
            outbox.stage(Message::End);
            while !outbox.flush() {
                wait(start, "input-task producer end");
            }
        }));
    }
    let batch = 50;
    let finished = Arc::new(AtomicBool::new(false));
    let result = Arc::new(Mutex::new(None));
    let checker = Checker {
        next_seq: vec![0; PRODUCERS],
        got: Checksum::default(),
        pending_flushes: 0,
        collects: 0,
        while_pending: 0,
        budget: batch,
        finished: finished.clone(),
        result: result.clone(),
    };
    let mut task = InputTask::new(inboxes, Box::new(checker), batch);
    let capacity = (PRODUCERS * CAP) as u64;
    let (mut ctx, counters) = test_ctx(capacity);
    let start = Instant::now();
    let mut max_turn = 0;
    loop {
        let before = ctx.records_in;
        let poll = task.poll(&mut ctx).expect("checker never fails");
        ctx.end_turn();
        max_turn = max_turn.max(ctx.records_in - before);
        assert!(counters.input_queued.load(Ordering::Relaxed) <= capacity);
        match poll {
            TaskPoll::Done => break,
            TaskPoll::Idle => wait(start, "input task"),
            TaskPoll::Progress => {}
        }
    }
    assert_eq!(task.poll(&mut ctx).unwrap(), TaskPoll::Done, "done stays done");
    for s in senders {
        s.join().expect("producer thread");
    }
    assert!(finished.load(Ordering::Relaxed));
    let (got, next_seq) = result.lock().unwrap().take().expect("finish ran");
    assert_eq!(next_seq, vec![PER; PRODUCERS]);
    let mut expected = Checksum::default();
    for source in 0..PRODUCERS {
        (0..PER).for_each(|s| expected.add(value(s) ^ source as u64));
    }
    assert_eq!(got, expected);
    assert_eq!(ctx.records_in, PRODUCERS as u64 * PER);
    assert_eq!(counters.records_in.load(Ordering::Relaxed), PRODUCERS as u64 * PER);
    assert!(
        max_turn <= batch as u64,
        "a turn read {max_turn} records, budget {batch}"
    );
}

/// Drives an exchange output the way a task does: never collect while a
/// flush is pending.
fn drive_output<T>(out: &mut dyn Collector<T>, ctx: &mut TaskContext, batch: &mut Vec<T>, start: Instant) {
    while !out.flush(ctx).unwrap() {
        wait(start, "exchange output full");
    }
    out.collect(batch, ctx).unwrap();
    assert!(batch.is_empty(), "collect takes every record");
}

fn finish_output<T>(out: &mut dyn Collector<T>, ctx: &mut TaskContext, start: Instant) {
    while !out.flush(ctx).unwrap() {
        wait(start, "exchange output full before end");
    }
    out.finish(ctx).unwrap();
    while !out.flush(ctx).unwrap() {
        wait(start, "exchange output full at end");
    }
}

/// Reads every ring of one consumer subtask until each has ended; returns
/// the (producer, key, seq) records in arrival order per ring.
fn drain_rings(mut rings: Vec<rtrb::Consumer<Message<(usize, u64, u64)>>>) -> Vec<Vec<(usize, u64, u64)>> {
    let start = Instant::now();
    let mut out: Vec<Vec<_>> = rings.iter().map(|_| Vec::new()).collect();
    let mut ended = vec![false; rings.len()];
    while ended.iter().any(|e| !e) {
        let mut progressed = false;
        for (r, ring) in rings.iter_mut().enumerate() {
            let n = ring.slots();
            if n == 0 {
                continue;
            }
            progressed = true;
            for m in ring.read_chunk(n).unwrap() {
                assert!(!ended[r], "a message after End");
                match m {
                    Message::Data(rec) => out[r].push(rec),
                    Message::End => ended[r] = true,
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
        if !progressed {
            wait(start, "exchange consumer");
        }
    }
    out
}

#[test]
fn hash_exchange_across_threads_sends_each_key_to_one_subtask_in_order() {
    const P: usize = 2; // producers
    const Q: usize = 3; // consumers
    const PER: u64 = 60_000;
    const KEYS: u64 = 97;
    let maxp = crate::state::key_groups::DEFAULT_MAX_PARALLELISM;
    // rings[from][to]
    let mut producers: Vec<Vec<_>> = (0..P).map(|_| Vec::new()).collect();
    let mut consumers: Vec<Vec<_>> = (0..Q).map(|_| Vec::new()).collect();
    for row in producers.iter_mut() {
        for col in consumers.iter_mut() {
            let (p, c) = RingBuffer::new(16);
            row.push(Outbox::new(p, 64));
            col.push(c);
        }
    }
    let senders: Vec<_> = producers
        .into_iter()
        .enumerate()
        .map(|(from, outboxes)| {
            thread::spawn(move || {
                let start = Instant::now();
                let (mut ctx, _) = test_ctx(0);
                let mut out = HashOutput::new(outboxes, |r: &(usize, u64, u64)| r.1, maxp, 0);
                let mut sizes = Lcg(from as u64 + 5);
                let mut batch = Vec::new();
                let mut seq = 0;
                while seq < PER {
                    let n = (sizes.next_in(1, 64) as u64).min(PER - seq);
                    batch.extend((seq..seq + n).map(|s| (from, value(s) % KEYS, s)));
                    seq += n;
                    drive_output(&mut out, &mut ctx, &mut batch, start);
                }
                finish_output(&mut out, &mut ctx, start);
                assert_eq!(ctx.records_out, PER);
            })
        })
        .collect();
    let receivers: Vec<_> = consumers
        .into_iter()
        .map(|rings| thread::spawn(move || drain_rings(rings)))
        .collect();
    for s in senders {
        s.join().expect("producer thread");
    }
    let received: Vec<Vec<Vec<_>>> = receivers.into_iter().map(|r| r.join().expect("consumer")).collect();

    let mut owner = vec![None; KEYS as usize];
    let mut total = 0;
    for (to, per_ring) in received.iter().enumerate() {
        for (from, records) in per_ring.iter().enumerate() {
            let mut last = None;
            for &(src, key, seq) in records {
                assert_eq!(src, from, "ring [{from}][{to}] carries only its producer's records");
                assert_eq!(key, value(seq) % KEYS);
                let expected_to = crate::state::key_groups::subtask_for_key_group(
                    crate::state::key_groups::key_group(crate::state::key_groups::stable_hash(&key), maxp),
                    maxp,
                    Q,
                );
                assert_eq!(to, expected_to, "key {key} went to the wrong subtask");
                assert_eq!(*owner[key as usize].get_or_insert(to), to, "key {key} split");
                assert!(last < Some(seq), "ring [{from}][{to}] out of order");
                last = Some(seq);
                total += 1;
            }
        }
    }
    assert_eq!(total, P as u64 * PER);
    // Every record of every producer arrived exactly once.
    for from in 0..P {
        let mut seqs: Vec<u64> = received.iter().flat_map(|r| r[from].iter().map(|t| t.2)).collect();
        seqs.sort_unstable();
        assert!(
            seqs.iter().copied().eq(0..PER),
            "producer {from} lost or duplicated records"
        );
    }
}

#[test]
fn rebalance_exchange_across_threads_round_robins_without_loss() {
    const Q: usize = 3;
    const PER: u64 = 90_000;
    let mut outboxes = Vec::new();
    let mut consumers = Vec::new();
    for _ in 0..Q {
        let (p, c) = RingBuffer::new(16);
        outboxes.push(Outbox::new(p, 64));
        consumers.push(vec![c]);
    }
    let sender = thread::spawn(move || {
        let start = Instant::now();
        let (mut ctx, _) = test_ctx(0);
        let mut out = RebalanceOutput::new(outboxes, 1);
        let mut sizes = Lcg(42);
        let mut batch = Vec::new();
        let mut seq = 0;
        while seq < PER {
            let n = (sizes.next_in(1, 100) as u64).min(PER - seq);
            batch.extend((seq..seq + n).map(|s| (0usize, 0u64, s)));
            seq += n;
            drive_output(&mut out, &mut ctx, &mut batch, start);
        }
        finish_output(&mut out, &mut ctx, start);
    });
    let receivers: Vec<_> = consumers
        .into_iter()
        .map(|rings| thread::spawn(move || drain_rings(rings)))
        .collect();
    sender.join().expect("producer thread");
    for (to, r) in receivers.into_iter().enumerate() {
        let got: Vec<u64> = r.join().expect("consumer").remove(0).into_iter().map(|t| t.2).collect();
        // Round-robin starting at target 1: record s goes to (1 + s) mod Q.
        let expected: Vec<u64> = (0..PER).filter(|s| (1 + s) % Q as u64 == to as u64).collect();
        assert_eq!(got, expected, "target {to}");
    }
}

#[test]
fn end_is_delivered_after_a_backlog_larger_than_the_ring() {
    // A producer that stages more than the ring holds and then End must
    // deliver everything, then End, through repeated partial flushes.
    let (p, mut c) = RingBuffer::<Message<u32>>::new(16);
    let mut outbox = Outbox::new(p, 8);
    (0..1000).for_each(|i| outbox.stage(Message::Data(i)));
    outbox.stage(Message::End);
    let reader = thread::spawn(move || {
        let start = Instant::now();
        let mut sizes = Lcg(1);
        let mut got = Vec::new();
        let mut ended = false;
        while !ended {
            let n = c.slots().min(sizes.next_in(1, 16));
            if n == 0 {
                wait(start, "backlog reader");
                continue;
            }
            for m in c.read_chunk(n).unwrap() {
                assert!(!ended, "a message after End");
                match m {
                    Message::Data(x) => got.push(x),
                    Message::End => ended = true,
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
        got
    });
    let start = Instant::now();
    let mut flushes = 0;
    while !outbox.flush() {
        flushes += 1;
        wait(start, "backlog writer");
    }
    let got = reader.join().unwrap();
    assert_eq!(got, (0..1000).collect::<Vec<_>>());
    // 1001 messages through 16 slots: at least 62 partial flushes before the last one.
    assert!(
        flushes >= 62,
        "a 16-slot ring cannot take 1001 messages in {} flushes",
        flushes + 1
    );
}
