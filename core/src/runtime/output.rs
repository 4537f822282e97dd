//! The end of a chain that feeds rings: hash-partitioned (`key_by`) or
//! round-robin (`rebalance`) exchange to the next operator's subtasks.
//!
//! Records are first staged per target ring, then moved into each ring
//! with one chunked write (`write_chunk_uninit`), so a handoff costs a
//! memcpy and two atomic index updates per chunk, not per record. A hash
//! exchange hands a target on its own worker that target's records as one
//! batch, by reference, while the channel's pool has a box; with one target
//! and no box it writes the records straight into the ring, one copy fewer
//! than staging. When a
//! ring is full, what did not fit stays staged; the task reports pending
//! output and reads no new input until it is flushed (backpressure). The
//! staging buffers are bounded by one input batch times the chain's fan-out.

use std::hash::Hash;

use std::sync::Arc;

use rtrb::Producer;

use crate::checkpoint::channel::{decode_channel, ChannelRecorder, Replayed};
use crate::checkpoint::snapshot::TaskSnapshot;
use crate::data::Data;
use crate::error::BoxError;
use crate::runtime::collector::{Collector, Notice, RestoreCtx};
use crate::runtime::context::TaskContext;
use crate::runtime::message::{Barrier, BatchPool, Message};
use crate::runtime::output_ledger::Ledger;
pub(crate) use crate::runtime::output_ledger::OutputKeep;
use crate::state::key_groups::{key_group, stable_hash, subtask_for_key_group};
use crate::threads::idle::Parker;

/// Ring slots that records never use: a control message (a barrier that
/// must overtake a backpressured channel) always finds room. Eight covers
/// the most concurrent checkpoints plus end-of-stream in practice; control
/// beyond that waits like data.
pub(crate) const RESERVED_SLOTS: usize = 8;

/// One outgoing ring and the records staged for it.
///
/// Invariant: `staged[..head]` were moved into the ring (logically
/// uninitialised: never read, never dropped), `staged[head..]` are the
/// pending messages; `head == 0` whenever nothing is pending. A partial
/// flush advances `head` instead of moving the rest to the front, and the
/// rest is compacted only once the moved prefix is at least as long, so a
/// burst of output far larger than the ring (a window firing) drains in
/// linear time.
pub(crate) struct Outbox<T> {
    staged: Vec<Message<T>>,
    head: usize,
    /// Control messages among the pending ones: zero on the fast path.
    controls: usize,
    ring: Producer<Message<T>>,
    /// The consumer's worker, woken after each transfer if it sleeps.
    wake: Option<Arc<Parker>>,
    /// A same-worker channel's empty boxes, for batches handed over by
    /// reference (`None` across workers: [`Self::same_worker`]).
    pool: Option<BatchPool<T>>,
    /// Records this outbox took since it was made (staged, written straight
    /// in or handed over): counted per batch, never per record on the fast
    /// paths. A dedup recovery of the producer alone suppresses what its
    /// predecessor emitted ([`Ledger`]).
    emitted: u64,
    /// The largest watermark staged (not [`crate::watermark::IDLE`]): a
    /// recovered producer, replaying, never sends an older one again.
    wm_sent: i64,
}

impl<T> Outbox<T> {
    #[cfg(test)]
    pub(crate) fn new(ring: Producer<Message<T>>, batch_size: usize) -> Self {
        Self::with_wake(ring, batch_size, None, None)
    }

    /// An outbox on `ring` whose consumer's worker is `wake`; with the
    /// channel's `pool` when that is the producer's worker too.
    pub(crate) fn with_wake(
        ring: Producer<Message<T>>,
        batch_size: usize,
        wake: Option<Arc<Parker>>,
        pool: Option<BatchPool<T>>,
    ) -> Self {
        assert!(
            ring.buffer().capacity() > RESERVED_SLOTS,
            "ring capacity must exceed the reserved slots"
        );
        Outbox {
            staged: Vec::with_capacity(batch_size),
            head: 0,
            controls: 0,
            ring,
            wake,
            pool,
            emitted: 0,
            wm_sent: crate::watermark::MIN_WATERMARK,
        }
    }

    /// Records this outbox took since it was made.
    #[inline]
    pub(crate) fn emitted(&self) -> u64 {
        self.emitted
    }

    /// The largest watermark staged on this outbox.
    #[inline]
    pub(crate) fn wm_sent(&self) -> i64 {
        self.wm_sent
    }

    /// The consumer runs on the producer's worker (only such channels
    /// have a pool), so the ring's lines were last touched by this core.
    #[inline]
    pub(crate) fn same_worker(&self) -> bool {
        self.pool.is_some()
    }

    /// When the consumer runs on this worker and nothing is staged (so
    /// nothing is overtaken): hands the whole batch over by reference if
    /// the channel's pool has a box and the ring a data slot (one message;
    /// `batch` gets the box's empty vector), and otherwise moves records
    /// from its front straight into the ring, as many as fit (never into
    /// the reserved slots). What is left stays in `batch`, to be staged
    /// behind them.
    ///
    /// Handing over copies nothing: the consumer's chain works on the
    /// producer's vector, which makes the one-worker keyed job markedly
    /// faster (docs/notebook/benchmarks-2026-12.md, "Batches handed over by
    /// reference on one worker"). The records path copies once instead of
    /// twice (into the staging vector, then in bulk into the ring), which
    /// measured faster too (docs/notebook/benchmarks-2026-12.md, "One
    /// worker's exchange writes straight into its ring"). Only for one
    /// target: in a routing loop over two, stores into a ring interleave
    /// with stores into a staging vector, and staging with the bulk copy is
    /// faster (the same section). Only for the same worker: across cores
    /// the ring's lines were last read by the other core, and there the
    /// bulk copy is the cheap way to write (docs/notebook/benchmarks-2026-12.md,
    /// "The lead: batches handed over by reference").
    #[inline]
    pub(crate) fn write_straight_in(&mut self, batch: &mut Vec<T>) {
        if !self.same_worker() || batch.is_empty() {
            return;
        }
        if self.can_hand_over() {
            self.hand_over(batch);
            debug_assert!(batch.is_empty(), "boxes come back empty");
            return;
        }
        if !self.pending().is_empty() {
            return;
        }
        let n = self.ring.slots().saturating_sub(RESERVED_SLOTS).min(batch.len());
        if n == 0 {
            return;
        }
        let chunk = self
            .ring
            .write_chunk_uninit(n)
            .expect("slots() promised n free slots and only this producer writes");
        let moved = chunk.fill_from_iter(batch.drain(..n).map(Message::Data));
        debug_assert_eq!(moved, n, "the drain yields exactly n records");
        self.emitted += n as u64;
        if let Some(w) = &self.wake {
            w.wake();
        }
    }

    /// True when a batch can go over by reference now: nothing staged, a
    /// box in the pool, a data slot in the ring.
    #[inline]
    fn can_hand_over(&self) -> bool {
        self.pending().is_empty()
            && self.pool.as_ref().is_some_and(|p| !p.is_empty())
            && self.ring.slots() > RESERVED_SLOTS
    }

    /// Hands `part`'s records over as one batch, the vector itself
    /// (`part` gets the box's empty one); [`Self::can_hand_over`] must have
    /// said yes. Nothing when `part` is empty.
    #[inline]
    fn hand_over(&mut self, part: &mut Vec<T>) {
        if part.is_empty() {
            return;
        }
        self.emitted += part.len() as u64;
        let mut boxed = self
            .pool
            .as_mut()
            .and_then(|p| p.pop().ok())
            .expect("can_hand_over saw a box and only this producer takes them");
        std::mem::swap(&mut *boxed, part);
        if self.ring.push(Message::batch(boxed)).is_err() {
            unreachable!("can_hand_over saw a free slot and only this producer writes");
        }
        if let Some(w) = &self.wake {
            w.wake();
        }
    }

    /// Stages every record of `records`, in order, leaving it empty.
    #[inline]
    fn stage_records(&mut self, records: &mut Vec<T>) {
        self.emitted += records.len() as u64;
        self.staged.reserve(records.len());
        self.staged.extend(records.drain(..).map(Message::Data));
    }

    #[inline]
    pub(crate) fn stage(&mut self, m: Message<T>) {
        if !is_data_like(&m) {
            self.controls += 1;
        }
        if matches!(m, Message::Data(_)) {
            self.emitted += 1;
        }
        self.staged.push(m);
    }

    /// Stages a record: [`Self::stage`] without the control check.
    #[inline(always)]
    pub(crate) fn stage_data(&mut self, record: T) {
        self.emitted += 1;
        self.staged.push(Message::Data(record));
    }

    /// Stages a watermark; one right behind another replaces it, so
    /// watermarks never pile up behind a backpressured ring.
    pub(crate) fn stage_watermark(&mut self, wm: i64) {
        if wm != crate::watermark::IDLE {
            self.wm_sent = self.wm_sent.max(wm);
        }
        match self.staged.last_mut() {
            Some(Message::Watermark(last)) => *last = wm,
            _ => self.staged.push(Message::Watermark(wm)),
        }
    }

    /// Puts a control message ahead of everything staged (an unaligned
    /// barrier overtaking backpressured output).
    pub(crate) fn stage_front(&mut self, m: Message<T>) {
        debug_assert!(!matches!(m, Message::Data(_)));
        self.controls += 1;
        self.compact();
        self.staged.insert(0, m);
    }

    /// The messages not yet moved into the ring.
    #[inline]
    fn pending(&self) -> &[Message<T>] {
        &self.staged[self.head..]
    }

    /// Moves the pending messages to the front of the vector.
    fn compact(&mut self) {
        if self.head == 0 {
            return;
        }
        let rest = self.staged.len() - self.head;
        // SAFETY: `staged[head..]` are `rest` initialised messages, moved
        // bitwise to `staged[..rest]` (`copy` allows the overlap); the
        // length then covers exactly them, and the moved-out prefix is
        // overwritten or beyond the length, so each message is owned once.
        unsafe {
            let base = self.staged.as_mut_ptr();
            std::ptr::copy(base.add(self.head), base, rest);
            self.staged.set_len(rest);
        }
        self.head = 0;
    }

    /// Records the staged records and the watermarks between them (not
    /// barriers or end-of-stream) as channel state.
    pub(crate) fn record_staged(&self, out: &mut ChannelRecorder) -> Result<(), postcard::Error>
    where
        T: Data,
    {
        for m in self.pending() {
            match m {
                Message::Data(r) => out.record(r)?,
                Message::Watermark(wm) => out.watermark(*wm),
                // Never staged (handed over only when nothing is), but
                // recorded as its records if it were.
                Message::Batch(records) => records.iter().try_for_each(|r| out.record(r))?,
                Message::Barrier(_) | Message::End => {}
            }
        }
        Ok(())
    }

    /// How many staged messages fit in `free` ring slots, given that
    /// records may not use the reserved ones.
    #[inline]
    fn fitting(&self, free: usize) -> usize {
        let data_room = free.saturating_sub(RESERVED_SLOTS);
        if self.controls == 0 {
            return self.pending().len().min(data_room);
        }
        let mut n = 0;
        let mut data = 0;
        for m in self.pending() {
            if n == free {
                break;
            }
            if is_data_like(m) {
                if data == data_room {
                    break;
                }
                data += 1;
            }
            n += 1;
        }
        n
    }

    /// Moves as much staged output as fits into the ring; true if all did.
    #[inline]
    pub(crate) fn flush(&mut self) -> bool {
        if self.pending().is_empty() {
            return true;
        }
        let n = self.fitting(self.ring.slots());
        if n == 0 {
            return false;
        }
        if self.controls > 0 {
            self.controls -= self.pending()[..n].iter().filter(|m| !is_data_like(m)).count();
        }
        let mut chunk = self
            .ring
            .write_chunk_uninit(n)
            .expect("slots() promised n free slots and only this producer writes");
        let (first, second) = chunk.as_mut_slices();
        debug_assert_eq!(first.len() + second.len(), n);
        let rest = self.staged.len() - self.head - n;
        // SAFETY: `staged[head..head + n]` holds n initialised messages
        // (the invariant of the type); they are moved bitwise into the
        // chunk's n uninitialised slots (first, then second part, which do
        // not overlap the vector) and `head` moves past them, so every
        // message is owned exactly once: by the ring (after `commit_all`)
        // or by `staged[head..]`. When nothing is left the length drops to
        // 0 without dropping anything (all were moved). Nothing between the
        // copies can panic. A bulk copy, because a per-item iterator here
        // costs a large share of the keyed benchmark's cycles.
        unsafe {
            let src = self.staged.as_mut_ptr().add(self.head);
            std::ptr::copy_nonoverlapping(src, first.as_mut_ptr().cast::<Message<T>>(), first.len());
            std::ptr::copy_nonoverlapping(
                src.add(first.len()),
                second.as_mut_ptr().cast::<Message<T>>(),
                second.len(),
            );
            self.head += n;
            if rest == 0 {
                self.staged.set_len(0);
                self.head = 0;
            }
            chunk.commit_all();
        }
        if rest > 0 && self.head >= rest {
            // The moved prefix is at least as long as what is left:
            // compacting now costs at most what was flushed (amortised O(1)).
            self.compact();
        }
        if let Some(w) = &self.wake {
            w.wake();
        }
        rest == 0
    }
}

impl<T> Drop for Outbox<T> {
    fn drop(&mut self) {
        let pending = self.staged.len() - self.head;
        // SAFETY: only `staged[head..]` are owned (the type's invariant):
        // the length is cleared first so the vector drops nothing, then the
        // pending messages are dropped in place exactly once.
        unsafe {
            let p = self.staged.as_mut_ptr().add(self.head);
            self.staged.set_len(0);
            std::ptr::drop_in_place(std::ptr::slice_from_raw_parts_mut(p, pending));
        }
    }
}

/// Records and watermarks: they flow with the data and never take the
/// ring slots reserved for barriers and end-of-stream.
#[inline]
fn is_data_like<T>(m: &Message<T>) -> bool {
    matches!(m, Message::Data(_) | Message::Watermark(_) | Message::Batch(_))
}

/// Flushes every outbox; true if nothing remains staged.
fn flush_all<T>(outboxes: &mut [Outbox<T>]) -> bool {
    let mut all = true;
    for o in outboxes {
        all &= o.flush();
    }
    all
}

/// Forwards a barrier on every outbox. Aligned: behind the staged records.
/// Unaligned: ahead of them, and the overtaken records, with the
/// watermarks between them, go into the snapshot as output channel state
/// (re-sent first on recovery).
fn forward_barrier<T: Data>(
    outboxes: &mut [Outbox<T>],
    barrier: Barrier,
    snap: &mut TaskSnapshot,
) -> Result<(), BoxError> {
    for (k, o) in outboxes.iter_mut().enumerate() {
        if barrier.unaligned {
            let mut channel = ChannelRecorder::default();
            o.record_staged(&mut channel)?;
            snap.state.channel_records += channel.records;
            let state = &mut snap.state;
            channel.store_into(
                k as u32,
                &mut state.output_channels,
                &mut state.output_channel_watermarks,
            );
            o.stage_front(Message::Barrier(barrier));
        } else {
            o.stage(Message::Barrier(barrier));
        }
    }
    flush_all(outboxes);
    Ok(())
}

/// Re-stages the output channel state of a restored task, records and
/// the watermarks between them, ahead of anything new.
fn restore_outboxes<T: Data>(outboxes: &mut [Outbox<T>], r: &RestoreCtx<'_>) -> Result<(), BoxError> {
    let Some(own) = r.own else {
        // At another parallelism: in-flight records cannot be placed, and
        // event time starts again from the beginning (watermarks alone are
        // dropped).
        if r.all.iter().any(|s| !s.output_channels.is_empty()) {
            return Err(format!(
                "checkpoint {} holds in-flight records of an unaligned checkpoint; restore it at the same parallelism",
                r.checkpoint
            )
            .into());
        }
        return Ok(());
    };
    let mut channels: Vec<u32> = own
        .output_channels
        .iter()
        .map(|(k, _)| *k)
        .chain(own.output_channel_watermarks.iter().map(|(k, _)| *k))
        .collect();
    channels.sort_unstable();
    channels.dedup();
    for k in channels {
        let outbox = outboxes.get_mut(k as usize).ok_or_else(|| {
            format!(
                "checkpoint {}: output channel {k} does not exist in this job",
                r.checkpoint
            )
        })?;
        let bytes = own
            .output_channels
            .iter()
            .find(|(c, _)| *c == k)
            .map_or(&[][..], |(_, b)| b);
        let marks = own
            .output_channel_watermarks
            .iter()
            .find(|(c, _)| *c == k)
            .map_or(&[][..], |(_, w)| w);
        let entries = decode_channel::<T>(bytes, marks)
            .map_err(|e| format!("checkpoint {}: output channel {k}: {e}", r.checkpoint))?;
        for e in entries {
            match e {
                Replayed::Record(record) => outbox.stage(Message::Data(record)),
                Replayed::Watermark(wm) => outbox.stage_watermark(wm),
            }
        }
    }
    Ok(())
}

/// The control methods shared by the exchanges (types with `outboxes` and
/// `ledger` fields and a `cursor()` method): flush every outbox,
/// end-of-stream and barriers on every outbox, nothing to commit, output
/// channel state to restore; in dedup mode the ledger marks each snapshot
/// and checks a replacement's replay ([`Ledger`]).
macro_rules! exchange_control {
    () => {
        fn flush(&mut self, _ctx: &mut TaskContext) -> Result<bool, BoxError> {
            Ok(flush_all(&mut self.outboxes))
        }
        fn finish(&mut self, ctx: &mut TaskContext) -> Result<(), BoxError> {
            self.ledger.on_finish(ctx)?;
            self.outboxes.iter_mut().for_each(|o| o.stage(Message::End));
            flush_all(&mut self.outboxes);
            Ok(())
        }
        fn barrier(
            &mut self,
            barrier: Barrier,
            snap: &mut TaskSnapshot,
            ctx: &mut TaskContext,
        ) -> Result<(), BoxError> {
            let cursor = self.cursor();
            self.ledger.on_barrier(barrier.id, &self.outboxes, cursor, ctx)?;
            forward_barrier(&mut self.outboxes, barrier, snap)
        }
        fn notify(&mut self, notice: Notice, _ctx: &mut TaskContext) -> Result<(), BoxError> {
            self.ledger.on_notice(notice);
            Ok(())
        }
        fn restore(&mut self, r: &RestoreCtx<'_>, _ctx: &mut TaskContext) -> Result<(), BoxError> {
            if self.ledger.is_replacement() {
                return Ok(());
            }
            restore_outboxes(&mut self.outboxes, r)?;
            let cursor = self.cursor();
            self.ledger.on_restore(r.checkpoint, &self.outboxes, cursor);
            Ok(())
        }
        fn watermark(&mut self, wm: i64, _ctx: &mut TaskContext) -> Result<(), BoxError> {
            for o in &mut self.outboxes {
                if self.ledger.sends_watermark(wm, o) {
                    o.stage_watermark(wm);
                }
            }
            flush_all(&mut self.outboxes);
            Ok(())
        }
        fn tick(&mut self, _ctx: &mut TaskContext) -> Result<(), BoxError> {
            Ok(())
        }
    };
}

/// Hash-partitioned exchange (`key_by`). In dedup mode its [`Ledger`] lets
/// a producer that reads rings recover alone: the suppressing path, record
/// by record, runs only while a replacement replays; the fast paths pay one
/// branch per batch.
pub(crate) struct HashOutput<T, K, KF> {
    outboxes: Vec<Outbox<T>>,
    key_fn: KF,
    max_parallelism: usize,
    /// Target subtask of every key group: a lookup instead of a division.
    routes: Vec<u32>,
    /// Index of the `key_by` operator in the chain (names key function panics).
    op: usize,
    /// Powers of two of targets and key groups: the target is the hash's
    /// top bits, `64 - log2(targets)` down (no group, no lookup).
    route_shift: Option<u32>,
    /// A batch split over two targets, for a target on this worker to take
    /// its part by reference (empty between batches).
    split: [Vec<T>; 2],
    /// Dedup mode: what lets the task recover alone.
    ledger: Ledger<T>,
    _k: std::marker::PhantomData<fn() -> K>,
}

impl<T, K, KF> Drop for HashOutput<T, K, KF> {
    fn drop(&mut self) {
        self.ledger.leave(&mut self.outboxes);
    }
}

impl<T, K, KF> HashOutput<T, K, KF> {
    pub(crate) fn new(outboxes: Vec<Outbox<T>>, key_fn: KF, max_parallelism: usize, op: usize) -> Self {
        let q = outboxes.len();
        assert!(
            q >= 1 && q <= max_parallelism,
            "{q} targets for {max_parallelism} key groups"
        );
        let routes: Vec<u32> = (0..max_parallelism)
            .map(|kg| subtask_for_key_group(kg, max_parallelism, q) as u32)
            .collect();
        assert!(routes.iter().all(|&t| (t as usize) < q), "a route past the last target");
        HashOutput {
            outboxes,
            key_fn,
            max_parallelism,
            routes,
            op,
            route_shift: (q >= 2 && q.is_power_of_two() && max_parallelism.is_power_of_two())
                .then(|| 64 - q.trailing_zeros()),
            split: [Vec::new(), Vec::new()],
            ledger: Ledger::default(),
            _k: std::marker::PhantomData,
        }
    }

    /// The round-robin cursor the ledger marks: none here.
    fn cursor(&self) -> usize {
        0
    }

    /// Dedup mode: leaves the outboxes in `keep` when dropped, and marks
    /// the records taken at each snapshot.
    pub(crate) fn keeping(mut self, keep: OutputKeep<T>) -> Self {
        self.ledger = Ledger::keeping(keep, self.outboxes.len(), 0);
        self
    }

    /// The exchange of a replacement for a failed producer, restored from
    /// `checkpoint`, on its predecessor's outboxes ([`Ledger::resume`]).
    pub(crate) fn resumed(
        keep: OutputKeep<T>,
        checkpoint: u64,
        key_fn: KF,
        max_parallelism: usize,
        op: usize,
    ) -> Result<Self, String> {
        let (outboxes, _, ledger) = Ledger::resume(keep, checkpoint)?;
        let mut out = Self::new(outboxes, key_fn, max_parallelism, op);
        out.ledger = ledger;
        Ok(out)
    }

    /// Routes `batch` record by record, dropping what the ledger says the
    /// predecessor emitted.
    #[cold]
    fn collect_suppressed(&mut self, batch: &mut Vec<T>, ctx: &mut TaskContext) -> Result<(), BoxError>
    where
        K: Hash,
        KF: Fn(&T) -> K,
    {
        self.ledger.check_replaying(ctx)?;
        let maxp = self.max_parallelism;
        for record in batch.drain(..) {
            let k = self.routes[key_group(stable_hash(&(self.key_fn)(&record)), maxp)] as usize;
            if !self.ledger.drops(k) {
                self.outboxes[k].stage_data(record);
            }
        }
        self.ledger.settle();
        flush_all(&mut self.outboxes);
        Ok(())
    }
}

impl<T: Data, K: Hash, KF: Fn(&T) -> K + Send> Collector<T> for HashOutput<T, K, KF> {
    #[inline]
    fn collect(&mut self, batch: &mut Vec<T>, ctx: &mut TaskContext) -> Result<(), BoxError> {
        ctx.count_out::<T>(batch.len());
        ctx.current_op = self.op;
        if self.ledger.suppressing {
            return self.collect_suppressed(batch, ctx);
        }
        let maxp = self.max_parallelism;
        let (routes, outboxes) = (&self.routes[..], &mut self.outboxes[..]);
        debug_assert_eq!(routes.len(), maxp);
        let key_fn = &self.key_fn;
        let route = |r: &T| {
            // SAFETY: `key_group` is below `maxp`, the length of `routes`
            // (made in `new`; `keyed::tests::key_group_in_range`), and every
            // route is a subtask below the number of outboxes (`new`
            // asserts `subtask_for_key_group` keeps below it;
            // `routes_stay_in_range` below).
            unsafe { *routes.get_unchecked(key_group(stable_hash(&key_fn(r)), maxp)) as usize }
        };
        // With powers of two of targets and key groups, the same target as
        // `route` without the key group's multiply and the table
        // (`the_route_shift_is_the_key_group_s_route`), a few percent faster
        // at p=2 (docs/notebook/benchmarks-2026-12.md, "One worker's
        // exchange computes no key, a cheaper route"). A shift by
        // 64 - log2(q) leaves log2(q) bits: below q, as the staging loops
        // require.
        let shifted = self
            .route_shift
            .map(|shift| move |r: &T| (stable_hash(&key_fn(r)) >> shift) as usize);
        match (outboxes.len(), shifted) {
            (1, _) => {
                // One target takes every record: no key to hash. (The keyed
                // operator behind it computes each key with the same
                // function, so a key function that panics still fails the
                // job.)
                let only = &mut outboxes[0];
                only.write_straight_in(batch);
                only.stage_records(batch);
            }
            // With two targets `shift` is 63: the route is the hash's top
            // bit. A target on this worker takes its part by reference; a
            // part for another worker is staged and copied in bulk as before.
            (2, Some(shifted))
                if outboxes.iter().any(Outbox::same_worker)
                    && outboxes.iter().all(|o| !o.same_worker() || o.can_hand_over()) =>
            {
                let [s0, s1] = &mut self.split;
                split_two(s0, s1, batch, shifted, |r| r);
                for (o, part) in outboxes.iter_mut().zip(self.split.iter_mut()) {
                    if o.same_worker() {
                        o.hand_over(part);
                    } else {
                        o.stage_records(part);
                    }
                }
            }
            (2, Some(shifted)) => stage_routed_two(outboxes, batch, shifted),
            (q, Some(shifted)) if q <= STAGE_TARGETS => stage_routed(outboxes, batch, shifted),
            (q, None) if q <= STAGE_TARGETS => stage_routed(outboxes, batch, route),
            _ => {
                for record in batch.drain(..) {
                    // SAFETY: `route` is below the number of outboxes (above).
                    unsafe { outboxes.get_unchecked_mut(route(&record)) }.stage_data(record);
                }
            }
        }
        flush_all(&mut self.outboxes);
        Ok(())
    }
    exchange_control!();
}

/// The most targets [`stage_routed`] stages for at once (arrays on the
/// stack); an exchange to more stages record by record.
const STAGE_TARGETS: usize = 8;

/// Stages every record of `batch` on outbox `route(record)` (below
/// `outboxes.len()`, at most [`STAGE_TARGETS`]): each outbox's vector is
/// reserved once for the whole batch, so the loop per record is a write
/// and a count, without a capacity check per push.
#[inline(always)]
fn stage_routed<T>(outboxes: &mut [Outbox<T>], batch: &mut Vec<T>, route: impl Fn(&T) -> usize) {
    let q = outboxes.len();
    assert!(q <= STAGE_TARGETS, "{q} targets");
    let n = batch.len();
    let mut ends = [std::ptr::null_mut::<Message<T>>(); STAGE_TARGETS];
    let mut added = [0usize; STAGE_TARGETS];
    for (k, o) in outboxes.iter_mut().enumerate() {
        o.staged.reserve(n);
        // SAFETY: `len` is within the allocation (one past the end at most).
        ends[k] = unsafe { o.staged.as_mut_ptr().add(o.staged.len()) };
    }
    for record in batch.drain(..) {
        let k = route(&record);
        debug_assert!(k < q, "a route past the outboxes");
        // SAFETY: `k < q` (the caller's contract), so `ends[k]` is the end
        // of outbox `k`'s initialised messages, which has room for `n`
        // more (the reserve above); `added[k] < n` since each of the `n`
        // records is written once. The slot is uninitialised, so writing
        // drops nothing, and the length below covers exactly the written
        // slots. Should `route` panic (a user's key function), the records
        // written so far are leaked, never dropped twice.
        unsafe {
            let a = added.get_unchecked_mut(k);
            ends.get_unchecked(k).add(*a).write(Message::Data(record));
            *a += 1;
        }
    }
    for (k, o) in outboxes.iter_mut().enumerate() {
        // SAFETY: the `added[k]` slots past the old length were written
        // above, in order.
        unsafe { o.staged.set_len(o.staged.len() + added[k]) };
        o.emitted += added[k] as u64;
    }
}

/// [`stage_routed`] for two targets, with both write positions in
/// registers: the general loop keeps its per-target counts in an array on
/// the stack, so two records in a row for one target wait on a store and a
/// reload of the count. `route(record)` must be 0 or 1. With the route
/// from the hash's top bit this is a few percent faster at p=2
/// (docs/notebook/benchmarks-2026-12.md, "One worker's exchange computes
/// no key, a cheaper route").
#[inline(always)]
fn stage_routed_two<T>(outboxes: &mut [Outbox<T>], batch: &mut Vec<T>, route: impl Fn(&T) -> usize) {
    let [o0, o1] = outboxes else {
        panic!("{} targets, not two", outboxes.len())
    };
    let before = (o0.staged.len(), o1.staged.len());
    split_two(&mut o0.staged, &mut o1.staged, batch, route, Message::Data);
    o0.emitted += (o0.staged.len() - before.0) as u64;
    o1.emitted += (o1.staged.len() - before.1) as u64;
}

/// Moves every record of `batch` to the end of `v0` or `v1` by
/// `route(record)` (0 or 1), as `wrap(record)`, in order, with both write
/// positions in registers ([`stage_routed_two`]).
///
/// Each record is read out of `batch` only once its target is known, so
/// that it goes from the batch to its slot without waiting in registers
/// through the route's hash: held across it, the record is spilled to the
/// stack and read back, a store and a load more per record, and the
/// two-worker keyed job measures faster without them. The same reading in
/// `stage_routed` (three to eight targets) measured slower, so that loop
/// keeps its `drain` (docs/notebook/benchmarks-2026-12.md, "The two-target
/// split reads each record once its route is known").
#[inline(always)]
fn split_two<T, M>(
    v0: &mut Vec<M>,
    v1: &mut Vec<M>,
    batch: &mut Vec<T>,
    route: impl Fn(&T) -> usize,
    wrap: impl Fn(T) -> M,
) {
    let n = batch.len();
    v0.reserve(n);
    v1.reserve(n);
    let records = batch.as_ptr();
    // SAFETY: the batch's records now belong to the loop below, which
    // moves each exactly once (should `route`, a user's key function,
    // panic, the records not yet moved are leaked, never dropped twice).
    // Each `len` is within its allocation (one past the end at most).
    let (start0, start1) = unsafe {
        batch.set_len(0);
        (v0.as_mut_ptr().add(v0.len()), v1.as_mut_ptr().add(v1.len()))
    };
    let (mut end0, mut end1) = (start0, start1);
    for i in 0..n {
        // SAFETY: `i < n`, the batch's length before it was cleared: an
        // initialised record its allocation still holds, read (moved)
        // once, below, after its route.
        let record = unsafe { records.add(i) };
        let k = route(unsafe { &*record });
        debug_assert!(k < 2, "a route past the two targets");
        let to_second = k != 0;
        let slot = if to_second { end1 } else { end0 };
        // SAFETY: `slot` is one past the last written slot of one of the
        // two vectors, which has room for `n` more (the reserves above); at most
        // `n` records are written in all, each once, so every write stays
        // within its reserve. The slot is uninitialised, so writing drops
        // nothing, and the lengths below cover exactly the written slots.
        // Should `route` panic, the records written so far are leaked too.
        unsafe {
            slot.write(wrap(record.read()));
            end0 = end0.add(usize::from(!to_second));
            end1 = end1.add(usize::from(to_second));
        }
    }
    // SAFETY: the slots from each start to its end were written above, in
    // order; each end lies in the same allocation as its start, at or
    // after it.
    unsafe {
        v0.set_len(v0.len() + end0.offset_from(start0) as usize);
        v1.set_len(v1.len() + end1.offset_from(start1) as usize);
    }
}

/// Round-robin exchange (`rebalance`, `union`): record `i` of this subtask
/// goes to target `(start + i) mod q`, where `start` differs per subtask so
/// that small inputs still spread. In dedup mode its [`Ledger`] marks the
/// cursor with the counts, so that a replacement, starting from the cursor
/// at the restored snapshot, routes its replay where its predecessor did.
pub(crate) struct RebalanceOutput<T> {
    outboxes: Vec<Outbox<T>>,
    next: usize,
    ledger: Ledger<T>,
}

impl<T> Drop for RebalanceOutput<T> {
    fn drop(&mut self) {
        self.ledger.leave(&mut self.outboxes);
    }
}

impl<T> RebalanceOutput<T> {
    /// Round-robin over `outboxes`, starting at `start`.
    pub(crate) fn new(outboxes: Vec<Outbox<T>>, start: usize) -> Self {
        let next = start % outboxes.len().max(1);
        RebalanceOutput {
            outboxes,
            next,
            ledger: Ledger::default(),
        }
    }

    /// Dedup mode: see [`HashOutput::keeping`].
    pub(crate) fn keeping(mut self, keep: OutputKeep<T>) -> Self {
        self.ledger = Ledger::keeping(keep, self.outboxes.len(), self.next);
        self
    }

    /// A replacement's exchange: see [`HashOutput::resumed`].
    pub(crate) fn resumed(keep: OutputKeep<T>, checkpoint: u64) -> Result<Self, String> {
        let (outboxes, next, ledger) = Ledger::resume(keep, checkpoint)?;
        Ok(RebalanceOutput { outboxes, next, ledger })
    }

    fn cursor(&self) -> usize {
        self.next
    }
}

impl<T: Data> Collector<T> for RebalanceOutput<T> {
    #[inline]
    fn collect(&mut self, batch: &mut Vec<T>, ctx: &mut TaskContext) -> Result<(), BoxError> {
        ctx.count_out::<T>(batch.len());
        let suppressing = self.ledger.suppressing;
        if suppressing {
            self.ledger.check_replaying(ctx)?;
        }
        let q = self.outboxes.len();
        for record in batch.drain(..) {
            if !(suppressing && self.ledger.drops(self.next)) {
                self.outboxes[self.next].stage(Message::Data(record));
            }
            self.next += 1;
            if self.next == q {
                self.next = 0;
            }
        }
        if suppressing {
            self.ledger.settle();
        }
        flush_all(&mut self.outboxes);
        Ok(())
    }
    exchange_control!();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key group routes to an existing target, whatever the
    /// parallelisms (the unchecked indexing of `HashOutput::collect`).
    #[test]
    fn routes_stay_in_range() {
        for maxp in [1usize, 2, 7, 128, 1000] {
            for q in 1..=maxp.min(64) {
                let outboxes = (0..q)
                    .map(|_| Outbox::new(rtrb::RingBuffer::<Message<u64>>::new(RESERVED_SLOTS + 1).0, 1))
                    .collect();
                let out = HashOutput::<u64, u64, _>::new(outboxes, |r: &u64| *r, maxp, 0);
                assert_eq!(out.routes.len(), maxp);
                assert!(out.routes.iter().all(|&t| (t as usize) < q), "maxp {maxp}, q {q}");
            }
        }
    }

    /// The next word of a xorshift sequence: test hashes and keys.
    fn xorshift(x: &mut u64) -> u64 {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    /// With powers of two of targets and key groups, the hash's top bits
    /// name the target its key group routes to (the shortcut
    /// `HashOutput::collect` takes), and `new` takes the shortcut exactly
    /// then.
    #[test]
    fn the_route_shift_is_the_key_group_s_route() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for maxp in [2usize, 4, 8, 64, 128, 1024, 32768] {
            for q in [1usize, 2, 3, 4, 5, 8, 16].into_iter().filter(|&q| q <= maxp) {
                let outboxes = (0..q)
                    .map(|_| Outbox::new(rtrb::RingBuffer::<Message<u64>>::new(RESERVED_SLOTS + 1).0, 1))
                    .collect();
                let out = HashOutput::<u64, u64, _>::new(outboxes, |r: &u64| *r, maxp, 0);
                let Some(shift) = out.route_shift else {
                    assert!(q == 1 || !q.is_power_of_two(), "maxp {maxp}, q {q}");
                    continue;
                };
                assert!(q.is_power_of_two() && q >= 2);
                for _ in 0..2000 {
                    let x = xorshift(&mut x);
                    assert_eq!(
                        (x >> shift) as u32,
                        out.routes[key_group(x, maxp)],
                        "maxp {maxp}, q {q}, hash {x:#x}"
                    );
                }
            }
        }
    }

    /// `stage_routed` appends each record, in order, behind what an outbox
    /// already staged, owning each record once (values with drop glue).
    #[test]
    fn stage_routed_appends_in_order_behind_staged_output() {
        let mut outboxes: Vec<Outbox<String>> = (0..3)
            .map(|_| Outbox::new(rtrb::RingBuffer::new(RESERVED_SLOTS + 4).0, 2))
            .collect();
        outboxes[1].stage(Message::Data("before".to_string()));
        outboxes[1].stage_watermark(7);
        let mut batch: Vec<String> = (0..50).map(|i| i.to_string()).collect();
        stage_routed(&mut outboxes, &mut batch, |r| r.parse::<usize>().unwrap() % 3);
        assert!(batch.is_empty());
        for (k, o) in outboxes.iter().enumerate() {
            let mut want: Vec<Message<String>> = Vec::new();
            if k == 1 {
                want.push(Message::Data("before".to_string()));
                want.push(Message::Watermark(7));
            }
            want.extend((0..50).filter(|i| i % 3 == k).map(|i| Message::Data(i.to_string())));
            assert_eq!(o.pending(), &want[..], "outbox {k}");
        }
        // More than the vectors' capacity: the reserve grows them.
        let mut big: Vec<String> = (0..1000).map(|i| i.to_string()).collect();
        stage_routed(&mut outboxes, &mut big, |_| 2);
        assert_eq!(outboxes[2].pending().len(), 16 + 1000);
        assert_eq!(outboxes[2].pending().last(), Some(&Message::Data("999".to_string())));
    }

    /// A hash exchange to one target hands it every record, in order and
    /// behind what it staged before, without computing a key (the key
    /// function here panics if called).
    #[test]
    fn one_target_takes_every_record_in_order_without_a_key() {
        let (mut ctx, _) = TaskContext::for_test("x", 0, 0);
        let (p, mut c) = rtrb::RingBuffer::new(RESERVED_SLOTS + 8);
        let mut out = HashOutput::<String, u64, _>::new(
            vec![Outbox::new(p, 4)],
            |_: &String| -> u64 { panic!("one target needs no key") },
            128,
            0,
        );
        out.watermark(3, &mut ctx).unwrap();
        let mut batch: Vec<String> = (0..20).map(|i| i.to_string()).collect();
        out.collect(&mut batch, &mut ctx).unwrap();
        assert!(batch.is_empty());
        let mut got = Vec::new();
        while got.len() < 21 {
            while let Ok(m) = c.pop() {
                got.push(m);
            }
            out.flush(&mut ctx).unwrap();
        }
        let mut want = vec![Message::Watermark(3)];
        want.extend((0..20).map(|i| Message::Data(i.to_string())));
        assert_eq!(got, want);
    }

    /// A one-target exchange whose consumer runs on its worker, with every
    /// box of its pool in flight, writes what fits straight into the ring,
    /// never into the reserved slots, and stages the rest behind it; a
    /// later batch waits behind what is staged. Values with drop glue:
    /// each is moved once, in order.
    #[test]
    fn records_for_this_worker_go_straight_into_the_ring_in_order() {
        let (mut ctx, _) = TaskContext::for_test("x", 0, 0);
        let (p, mut c) = rtrb::RingBuffer::new(RESERVED_SLOTS + 4);
        let (_back, mut pool) = crate::runtime::message::batch_pool::<String>(4);
        let in_flight: Vec<_> = std::iter::from_fn(|| pool.pop().ok()).collect();
        assert_eq!(in_flight.len(), crate::runtime::message::BATCHES_IN_FLIGHT);
        let mut out = HashOutput::<String, u64, _>::new(
            vec![Outbox::with_wake(p, 4, None, Some(pool))],
            |_: &String| -> u64 { panic!("one target needs no key") },
            128,
            0,
        );
        let mut batch: Vec<String> = (0..6).map(|i| i.to_string()).collect();
        out.outboxes[0].write_straight_in(&mut batch);
        assert_eq!(batch, ["4", "5"], "four fit beside the reserved slots");
        assert_eq!(c.slots(), 4);
        assert!(out.outboxes[0].pending().is_empty(), "nothing staged on the way");
        out.collect(&mut batch, &mut ctx).unwrap();
        assert_eq!(out.outboxes[0].pending().len(), 2, "the ring is full: staged");
        // Room again, but two are staged: a new batch must queue behind them.
        assert_eq!(c.pop().unwrap(), Message::Data("0".to_string()));
        let mut later: Vec<String> = (6..9).map(|i| i.to_string()).collect();
        out.outboxes[0].write_straight_in(&mut later);
        assert_eq!(later.len(), 3, "nothing passes what is staged");
        out.collect(&mut later, &mut ctx).unwrap();
        let mut got = vec![Message::Data("0".to_string())];
        while got.len() < 9 {
            while let Ok(m) = c.pop() {
                got.push(m);
            }
            out.flush(&mut ctx).unwrap();
        }
        let want: Vec<_> = (0..9).map(|i| Message::Data(i.to_string())).collect();
        assert_eq!(got, want);
        assert!(c.pop().is_err());
    }

    /// A one-target exchange whose consumer runs on its worker hands each
    /// batch over whole, as one message, while its pool has a box; the
    /// caller keeps the box's empty vector. With every box in flight it
    /// writes records into the ring's slots; boxes back, it hands batches
    /// over again. Everything arrives once, in order.
    #[test]
    fn a_batch_for_this_worker_is_handed_over_whole_while_its_pool_has_a_box() {
        use crate::runtime::message::{batch_pool, BATCHES_IN_FLIGHT};
        let (mut ctx, _) = TaskContext::for_test("x", 0, 0);
        let (p, mut c) = rtrb::RingBuffer::new(RESERVED_SLOTS + 64);
        let (mut back, pool) = batch_pool::<String>(3);
        let mut out = HashOutput::<String, u64, _>::new(
            vec![Outbox::with_wake(p, 3, None, Some(pool))],
            |_: &String| -> u64 { panic!("one target needs no key") },
            128,
            0,
        );
        let mut next = 0;
        let mut send = |out: &mut HashOutput<String, u64, _>| {
            let mut batch: Vec<String> = (next..next + 3).map(|i: usize| i.to_string()).collect();
            next += 3;
            out.collect(&mut batch, &mut ctx).unwrap();
            assert!(batch.is_empty());
            batch.capacity()
        };
        for _ in 0..BATCHES_IN_FLIGHT {
            assert!(send(&mut out) >= 3, "the caller keeps a box's vector");
        }
        assert_eq!(c.slots(), BATCHES_IN_FLIGHT, "one message a batch");
        send(&mut out);
        assert_eq!(c.slots(), BATCHES_IN_FLIGHT + 3, "no box left: records in slots");
        let mut got = Vec::new();
        while let Ok(m) = c.pop() {
            match m {
                Message::Batch(b) => {
                    let mut b = std::mem::ManuallyDrop::into_inner(b);
                    got.append(&mut b);
                    back.push(b).unwrap();
                }
                Message::Data(r) => got.push(r),
                other => panic!("unexpected {other:?}"),
            }
        }
        send(&mut out);
        assert!(
            matches!(c.pop(), Ok(Message::Batch(_))),
            "boxes back: handed over again"
        );
        let want: Vec<String> = (0..(BATCHES_IN_FLIGHT + 1) * 3).map(|i| i.to_string()).collect();
        assert_eq!(got, want);
    }

    /// A key function that panics midway through a batch leaves every
    /// record owned at most once: `split_two` leaks the records it has not
    /// published (both parts' lengths are set at the end), and drops none
    /// twice.
    #[test]
    fn a_route_that_panics_midway_through_a_split_drops_no_record_twice() {
        use std::rc::Rc;
        let marker = Rc::new(());
        let mut batch: Vec<Rc<()>> = (0..10).map(|_| Rc::clone(&marker)).collect();
        let (mut v0, mut v1) = (vec![Rc::clone(&marker)], Vec::new());
        let routed = std::cell::Cell::new(0usize);
        let route = |_: &Rc<()>| {
            routed.set(routed.get() + 1);
            assert!(routed.get() < 6, "a key function that fails");
            routed.get() % 2
        };
        let split = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            split_two(&mut v0, &mut v1, &mut batch, route, |r| r)
        }));
        assert!(split.is_err());
        assert_eq!((batch.len(), v0.len(), v1.len()), (0, 1, 0), "nothing published");
        drop((batch, v0, v1));
        // `v0`'s record from before the split went with `v0`; the batch's
        // ten are leaked, none dropped.
        assert_eq!(Rc::strong_count(&marker), 11);
    }

    /// A two-target exchange hands the part of each batch for its own
    /// worker over as one message, by reference, and stages the other
    /// worker's part as records; with the pool empty it stages both parts
    /// as before. Every record arrives once, in order, on its target's ring.
    #[test]
    fn a_two_target_exchange_hands_its_own_worker_s_part_over_as_one_batch() {
        use crate::runtime::message::{batch_pool, BATCHES_IN_FLIGHT};
        let (mut ctx, _) = TaskContext::for_test("x", 0, 0);
        let (p0, mut c0) = rtrb::RingBuffer::new(RESERVED_SLOTS + 512);
        let (p1, mut c1) = rtrb::RingBuffer::new(RESERVED_SLOTS + 512);
        let (mut back, pool) = batch_pool::<u64>(64);
        let outboxes = vec![
            Outbox::with_wake(p0, 64, None, Some(pool)),
            Outbox::with_wake(p1, 64, None, None),
        ];
        let mut out = HashOutput::<u64, u64, _>::new(outboxes, |r: &u64| *r, 128, 0);
        let target = |r: u64| (stable_hash(&r) >> 63) as usize;
        let mut next = 0u64;
        for round in 0..BATCHES_IN_FLIGHT + 2 {
            let mut batch: Vec<u64> = (next..next + 50).collect();
            next += 50;
            out.collect(&mut batch, &mut ctx).unwrap();
            assert!(batch.is_empty() && out.split.iter().all(Vec::is_empty));
            if round < BATCHES_IN_FLIGHT {
                assert_eq!(c0.slots(), round + 1, "one message for this worker's part");
            }
        }
        let mut local = Vec::new();
        let (mut batches, mut records) = (0, 0);
        while let Ok(m) = c0.pop() {
            match m {
                Message::Batch(b) => {
                    let mut b = std::mem::ManuallyDrop::into_inner(b);
                    batches += 1;
                    local.append(&mut b);
                    back.push(b).unwrap();
                }
                Message::Data(r) => {
                    records += 1;
                    local.push(r);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(batches, BATCHES_IN_FLIGHT, "by reference while the pool had boxes");
        assert!(records > 0, "then staged as records");
        let mut remote = Vec::new();
        while let Ok(m) = c1.pop() {
            match m {
                Message::Data(r) => remote.push(r),
                other => panic!("the other worker's part goes as records, not {other:?}"),
            }
        }
        assert_eq!(local, (0..next).filter(|&r| target(r) == 0).collect::<Vec<_>>());
        assert_eq!(remote, (0..next).filter(|&r| target(r) == 1).collect::<Vec<_>>());
    }

    /// An outbox whose consumer runs on another worker never writes
    /// straight into the ring: the batch is left whole for staging.
    #[test]
    fn records_for_another_worker_are_staged() {
        let (p, c) = rtrb::RingBuffer::new(RESERVED_SLOTS + 4);
        let mut o = Outbox::with_wake(p, 4, None, None);
        let mut batch = vec![1u64, 2, 3];
        o.write_straight_in(&mut batch);
        assert_eq!(batch, [1, 2, 3]);
        assert_eq!(c.slots(), 0);
    }

    /// `stage_routed_two` stages what `stage_routed` stages for two
    /// targets: each record once, in order, behind what an outbox already
    /// staged (values with drop glue), past the vectors' capacity too.
    #[test]
    fn stage_routed_two_stages_as_the_general_loop() {
        let fresh = || -> Vec<Outbox<String>> {
            let mut o: Vec<Outbox<String>> = (0..2)
                .map(|_| Outbox::new(rtrb::RingBuffer::new(RESERVED_SLOTS + 4).0, 2))
                .collect();
            o[1].stage(Message::Data("before".to_string()));
            o[1].stage_watermark(7);
            o
        };
        let (mut two, mut general) = (fresh(), fresh());
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for size in [0usize, 1, 5, 50, 1000] {
            let words: Vec<u64> = (0..size).map(|_| xorshift(&mut x)).collect();
            let route = |r: &String| (r.split(':').nth(1).unwrap().parse::<u64>().unwrap() >> 63) as usize;
            let mut a: Vec<String> = words
                .iter()
                .enumerate()
                .map(|(i, w)| format!("{size}.{i}:{w}"))
                .collect();
            let mut b = a.clone();
            stage_routed_two(&mut two, &mut a, route);
            stage_routed(&mut general, &mut b, route);
            assert!(a.is_empty() && b.is_empty());
            for k in 0..2 {
                assert_eq!(two[k].pending(), general[k].pending(), "size {size}, outbox {k}");
            }
        }
        assert_eq!(
            two[1].pending()[..2],
            [Message::Data("before".to_string()), Message::Watermark(7)]
        );
        assert!(two.iter().all(|o| o.pending().len() > 400), "both targets took records");
    }

    #[test]
    fn outbox_keeps_what_does_not_fit_in_order() {
        let (p, mut c) = rtrb::RingBuffer::new(RESERVED_SLOTS + 4);
        let mut o = Outbox::new(p, 8);
        for i in 0..6 {
            o.stage(Message::Data(i));
        }
        assert!(!o.flush(), "only 4 of 6 fit: the reserved slots are not for records");
        let got: Vec<_> = (0..4).map(|_| c.pop().unwrap()).collect();
        assert_eq!(got, (0..4).map(Message::Data).collect::<Vec<_>>());
        assert!(o.flush());
        assert_eq!(c.pop().unwrap(), Message::Data(4));
        assert_eq!(c.pop().unwrap(), Message::Data(5));
        assert!(c.pop().is_err());
    }

    #[test]
    fn outbox_moves_owned_values_exactly_once_across_wraparound() {
        // Heap-owning messages: a double move would double-free, a lost one
        // would leak; both are caught (the first by the allocator, the
        // second by the count of live values).
        use std::rc::Rc;
        let token = Rc::new(());
        let (p, mut c) = rtrb::RingBuffer::new(RESERVED_SLOTS + 5);
        let mut o = Outbox::new(p, 8);
        let mut received = Vec::new();
        for round in 0..50u64 {
            for i in 0..(round % 7) {
                o.stage(Message::Data((round * 10 + i, token.clone())));
            }
            while !o.flush() {
                received.push(c.pop().unwrap());
            }
            while let Ok(m) = c.pop() {
                received.push(m);
            }
        }
        let expected: Vec<u64> = (0..50u64).flat_map(|r| (0..r % 7).map(move |i| r * 10 + i)).collect();
        let got: Vec<u64> = received
            .iter()
            .map(|m| match m {
                Message::Data((v, _)) => *v,
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(got, expected);
        assert_eq!(Rc::strong_count(&token), 1 + expected.len());
        drop(received);
        drop(o);
        assert_eq!(Rc::strong_count(&token), 1);
    }

    #[test]
    fn a_burst_far_larger_than_the_ring_drains_in_order_and_drops_once() {
        // Partial flushes advance the head; a barrier staged in front
        // compacts; dropping the outbox with messages pending (and a moved
        // prefix) drops each pending one exactly once.
        use std::rc::Rc;
        let token = Rc::new(());
        let (p, mut c) = rtrb::RingBuffer::new(RESERVED_SLOTS + 16);
        let mut o = Outbox::new(p, 8);
        for i in 0..1000u64 {
            o.stage(Message::Data((i, token.clone())));
        }
        let mut got = Vec::new();
        for _ in 0..20 {
            assert!(!o.flush());
            while let Ok(Message::Data((v, _))) = c.pop() {
                got.push(v);
            }
        }
        let b = Barrier {
            id: 1,
            trigger_ns: 0,
            unaligned: true,
            is_final: false,
        };
        o.stage_front(Message::Barrier(b));
        assert!(!o.flush());
        let mut saw_barrier = false;
        while let Ok(m) = c.pop() {
            match m {
                Message::Data((v, _)) => got.push(v),
                Message::Barrier(_) => saw_barrier = true,
                _ => unreachable!(),
            }
        }
        assert!(saw_barrier);
        assert_eq!(
            got,
            (0..got.len() as u64).collect::<Vec<_>>(),
            "in order, none lost or repeated"
        );
        let pending = 1000 - got.len();
        assert!(pending > 0);
        assert_eq!(Rc::strong_count(&token), 1 + pending);
        drop(o);
        assert_eq!(Rc::strong_count(&token), 1, "pending messages dropped once");
    }

    #[test]
    fn control_uses_reserved_slots_and_can_overtake() {
        let (p, mut c) = rtrb::RingBuffer::new(RESERVED_SLOTS + 2);
        let mut o = Outbox::new(p, 8);
        for i in 0..5 {
            o.stage(Message::Data(i));
        }
        assert!(!o.flush());
        assert_eq!(c.slots(), 2, "records stop at the reserved slots");
        let b = Barrier {
            id: 1,
            trigger_ns: 0,
            unaligned: true,
            is_final: false,
        };
        o.stage_front(Message::Barrier(b));
        assert!(!o.flush());
        let got: Vec<_> = std::iter::from_fn(|| c.pop().ok()).collect();
        assert_eq!(got, vec![Message::Data(0), Message::Data(1), Message::Barrier(b)]);
        // An aligned barrier waits behind the records.
        o.stage(Message::End);
        while !o.flush() {
            while c.pop().is_ok() {}
        }
    }

    /// An unaligned barrier overtaking staged output stores the watermarks
    /// staged between the records too, and a restore stages them again in
    /// place (docs/notebook/checkpointing-2026-12.md, "Watermarks were not
    /// part of channel state").
    #[test]
    fn output_channel_state_keeps_staged_watermarks() {
        use crate::checkpoint::snapshot::TaskSnapshot;
        let (mut ctx, _) = TaskContext::for_test("x", 0, 0);
        let (p, mut c) = rtrb::RingBuffer::new(RESERVED_SLOTS + 2);
        let mut out = RebalanceOutput::new(vec![Outbox::new(p, 8)], 0);
        out.collect(&mut vec![1u64, 2, 3, 4], &mut ctx).unwrap();
        out.watermark(10, &mut ctx).unwrap();
        out.collect(&mut vec![5], &mut ctx).unwrap();
        out.watermark(11, &mut ctx).unwrap();
        let b = Barrier {
            id: 1,
            trigger_ns: 0,
            unaligned: true,
            is_final: false,
        };
        let mut snap = TaskSnapshot::new(1, 0, 0, 1, 1 << 20);
        out.barrier(b, &mut snap, &mut ctx).unwrap();
        // 1 and 2 were in the ring; 3, 4, 10, 5, 11 were overtaken.
        assert_eq!(snap.state.channel_records, 3);
        assert_eq!(snap.state.output_channel_watermarks, vec![(0, vec![(2, 10), (3, 11)])]);
        let got: Vec<_> = std::iter::from_fn(|| c.pop().ok()).collect();
        assert_eq!(got[..3], [Message::Data(1), Message::Data(2), Message::Barrier(b)]);

        let (p, mut c) = rtrb::RingBuffer::new(64);
        let mut restored = RebalanceOutput::<u64>::new(vec![Outbox::new(p, 8)], 0);
        let rc = RestoreCtx {
            own: Some(&snap.state),
            all: std::slice::from_ref(&snap.state),
            checkpoint: 1,
            key_groups: 0..1,
            watermark: crate::watermark::MIN_WATERMARK,
        };
        restored.restore(&rc, &mut ctx).unwrap();
        assert!(restored.flush(&mut ctx).unwrap());
        let got: Vec<_> = std::iter::from_fn(|| c.pop().ok()).collect();
        assert_eq!(
            got,
            vec![
                Message::Data(3),
                Message::Data(4),
                Message::Watermark(10),
                Message::Data(5),
                Message::Watermark(11)
            ]
        );
    }
}
