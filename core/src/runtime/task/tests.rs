//! Barrier handling of an input task, driven by hand on one thread: the
//! test writes messages into the task's input rings, polls the task until
//! it stalls, and checks what it forwarded (its output ring) and what it
//! told the coordinator (its events). Nothing here depends on timing.

use std::sync::mpsc;
use std::sync::Arc;

use rtrb::RingBuffer;

use crate::checkpoint::signals::{Event, Signals, TaskCheckpointing};
use crate::checkpoint::snapshot::AckedState;
use crate::checkpoint::snapshot::TaskState;
use crate::checkpoint::{CheckpointMode, DEFAULT_INLINE_STATE_MAX};
use crate::clock;
use crate::runtime::context::TaskContext;
use crate::runtime::message::{Barrier, Message};
use crate::runtime::output::{Outbox, RebalanceOutput};
use crate::runtime::task::{Inbox, InputTask, Task, TaskPoll};

/// Polls a stalled task this many times before calling it stalled.
const IDLE_POLLS: usize = 4;

/// An input task over `n` rings of `u64` records whose chain is an
/// exchange with one output ring.
struct Harness {
    task: InputTask<u64>,
    inputs: Vec<rtrb::Producer<Message<u64>>>,
    output: rtrb::Consumer<Message<u64>>,
    ctx: TaskContext,
    events: mpsc::Receiver<Event>,
    signals: Arc<Signals>,
    /// Everything the task forwarded so far, in order.
    forwarded: Vec<Message<u64>>,
    _dir: tempfile::TempDir,
}

impl Harness {
    fn new(mode: CheckpointMode, n: usize, alignment_timeout_ns: u64) -> Self {
        let mut inputs = Vec::new();
        let mut inboxes = Vec::new();
        for _ in 0..n {
            let (p, c) = RingBuffer::new(64);
            inputs.push(p);
            inboxes.push(Inbox::new(c, None, None));
        }
        let (p, output) = RingBuffer::new(256);
        let chain = RebalanceOutput::new(vec![Outbox::new(p, 64)], 0);
        let task = InputTask::new(inboxes, Box::new(chain), 64);
        let (mut ctx, _) = TaskContext::for_test("test", n, 64);
        let signals = Arc::new(Signals::new(mode, alignment_timeout_ns, 0, 1));
        let (tx, events) = mpsc::channel();
        let dir = tempfile::tempdir().unwrap();
        ctx.ckpt = Some(TaskCheckpointing {
            signals: signals.clone(),
            events: tx,
            task: 0,
            group: 0,
            root: Arc::from(dir.path()),
            inline_max: DEFAULT_INLINE_STATE_MAX,
            generation: 0,
            backup_limit: crate::checkpoint::DEFAULT_DEDUP_BACKUP_LIMIT,
            align_inputs: false,
            pool: Arc::new(
                crate::checkpoint::spawner::SnapshotPool::new(
                    Arc::new(rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap()),
                    None,
                    None,
                )
                .unwrap(),
            ),
        });
        Harness {
            task,
            inputs,
            output,
            ctx,
            events,
            signals,
            forwarded: Vec::new(),
            _dir: dir,
        }
    }

    fn trigger(&self, id: u64, is_final: bool) {
        self.signals.trigger(id, clock::now_ns(), is_final);
    }

    fn push(&mut self, input: usize, messages: Vec<Message<u64>>) {
        for m in messages {
            self.inputs[input].push(m).expect("test rings are large enough");
        }
    }

    /// Polls until the task makes no progress for a few polls in a row
    /// (or is done), collecting what it forwarded.
    fn run(&mut self) -> TaskPoll {
        let mut idle = 0;
        for _ in 0..10_000 {
            let poll = self.task.poll(&mut self.ctx).expect("the task does not fail");
            self.ctx.end_turn();
            while let Ok(m) = self.output.pop() {
                self.forwarded.push(m);
            }
            match poll {
                TaskPoll::Done => return poll,
                TaskPoll::Idle => {
                    idle += 1;
                    if idle == IDLE_POLLS {
                        return poll;
                    }
                }
                TaskPoll::Progress => idle = 0,
            }
        }
        panic!("the task never stalled");
    }

    fn events(&mut self) -> Vec<Event> {
        self.events.try_iter().collect()
    }

    /// Position in the forwarded stream of barrier `id`; fails if it was
    /// forwarded more than once.
    fn barrier_at(&self, id: u64) -> Option<(usize, Barrier)> {
        let found: Vec<(usize, Barrier)> = self
            .forwarded
            .iter()
            .enumerate()
            .filter_map(|(k, m)| match m {
                Message::Barrier(b) if b.id == id => Some((k, *b)),
                _ => None,
            })
            .collect();
        assert!(found.len() <= 1, "barrier {id} forwarded {} times", found.len());
        found.first().copied()
    }

    fn records(&self) -> Vec<u64> {
        self.forwarded
            .iter()
            .filter_map(|m| match m {
                Message::Data(r) => Some(*r),
                _ => None,
            })
            .collect()
    }
}

fn barrier(id: u64, unaligned: bool, is_final: bool) -> Message<u64> {
    Message::Barrier(Barrier {
        id,
        trigger_ns: clock::now_ns(),
        unaligned,
        is_final,
    })
}

fn data(xs: &[u64]) -> Vec<Message<u64>> {
    xs.iter().map(|&x| Message::Data(x)).collect()
}

/// The acknowledged state of checkpoint `id`, if the task acknowledged it.
fn acked(events: &[Event], id: u64) -> Option<TaskState> {
    events.iter().find_map(|e| match e {
        Event::Ack(a) if a.id == id => match &a.state {
            AckedState::Inline(frame) => Some(TaskState::decode(frame, "ack").unwrap()),
            AckedState::File(f) => panic!("small test states go inline, got {f:?}"),
        },
        _ => None,
    })
}

fn declined(events: &[Event], id: u64) -> bool {
    events
        .iter()
        .any(|e| matches!(e, Event::Decline { id: d, .. } if *d == id))
}

/// Checks the final barrier `id` went out aligned: once, not flagged
/// unaligned, behind every record in `records` (none overtaken), its
/// snapshot without channel state.
fn assert_final_aligned(h: &Harness, events: &[Event], id: u64, records: &[u64]) {
    let (at, b) = h.barrier_at(id).expect("the final barrier was forwarded");
    assert!(b.is_final);
    assert!(!b.unaligned, "the final barrier was forwarded unaligned");
    let mut got = h.records();
    got.sort_unstable();
    let mut want = records.to_vec();
    want.sort_unstable();
    assert_eq!(got, want, "every record was forwarded");
    let last_record = h.forwarded.iter().rposition(|m| matches!(m, Message::Data(_)));
    assert!(
        last_record.is_none_or(|r| r < at),
        "a record followed the final barrier (it overtook it): {:?}",
        h.forwarded
    );
    let state = acked(events, id).expect("the final checkpoint was acknowledged");
    assert!(
        state.input_channels.is_empty() && state.output_channels.is_empty() && state.channel_records == 0,
        "the final snapshot holds channel state: {state:?}"
    );
}

/// A task recording checkpoint 1's channel state (unaligned) reads the
/// final barrier 2 on the input that already delivered 1. It must not
/// subsume 1 by taking the final checkpoint unaligned: the final barrier
/// goes out only once it arrived on every input, behind every record, and
/// checkpoint 1 still completes (docs/design/checkpoints.md#barrier-flow).
#[test]
fn final_barrier_behind_an_unaligned_one_is_forwarded_aligned() {
    let mut h = Harness::new(CheckpointMode::Unaligned, 2, 0);
    h.trigger(1, false);
    h.push(0, data(&[1]));
    h.push(0, vec![barrier(1, true, false)]);
    h.push(0, data(&[2]));
    h.push(1, data(&[10, 11]));
    h.trigger(2, true);
    h.push(0, vec![barrier(2, false, true)]);
    h.run();
    assert!(
        h.barrier_at(1).is_some_and(|(_, b)| b.unaligned),
        "1 went out unaligned"
    );
    assert!(
        h.barrier_at(2).is_none(),
        "the final barrier was forwarded before it arrived on input 1: {:?}",
        h.forwarded
    );
    let events = h.events();
    assert!(acked(&events, 2).is_none(), "final checkpoint taken before alignment");

    h.push(1, vec![barrier(1, true, false)]);
    h.push(1, data(&[12]));
    h.push(1, vec![barrier(2, false, true)]);
    h.run();
    let mut events2 = h.events();
    let mut all = events;
    all.append(&mut events2);
    assert_final_aligned(&h, &all, 2, &[1, 2, 10, 11, 12]);
    let one = acked(&all, 1).expect("checkpoint 1 completes at this task");
    assert!(one.channel_records > 0, "1 stored the overtaken records");
    assert!(!declined(&all, 1) && !declined(&all, 2), "{all:?}");
}

/// The same after an aligned checkpoint's alignment timeout: it went on
/// unaligned, and the final barrier that follows it on the same input is
/// still handled aligned.
#[test]
fn final_barrier_after_an_alignment_timeout_is_forwarded_aligned() {
    // A timeout of 1 ns, counted from a trigger at time 0: long past.
    let mut h = Harness::new(CheckpointMode::Aligned, 2, 1);
    h.trigger(1, false);
    let b1 = Message::Barrier(Barrier {
        id: 1,
        trigger_ns: 0,
        unaligned: false,
        is_final: false,
    });
    h.push(0, data(&[1]));
    h.push(0, vec![b1.clone()]);
    h.push(0, data(&[2]));
    h.push(1, data(&[10]));
    h.trigger(2, true);
    h.push(0, vec![barrier(2, false, true)]);
    h.run();
    assert!(
        h.barrier_at(1).is_some_and(|(_, b)| b.unaligned),
        "1 went on unaligned after its timeout"
    );
    assert!(h.barrier_at(2).is_none(), "final forwarded early: {:?}", h.forwarded);
    let mut all = h.events();
    h.push(1, vec![b1]);
    h.push(1, data(&[11]));
    h.push(1, vec![barrier(2, false, true)]);
    h.run();
    all.extend(h.events());
    assert_final_aligned(&h, &all, 2, &[1, 2, 10, 11]);
    assert!(acked(&all, 1).is_some(), "{all:?}");
}

/// Checkpoint 1 never reaches input 1 (its upstream gave it up): look-ahead
/// finds the final barrier there first. Checkpoint 1 cannot complete at
/// this task and is declined; the final one is still taken aligned.
#[test]
fn final_barrier_found_by_look_ahead_is_not_taken_unaligned() {
    let mut h = Harness::new(CheckpointMode::Unaligned, 2, 0);
    h.trigger(1, false);
    h.push(0, vec![barrier(1, true, false)]);
    h.push(0, data(&[1]));
    h.push(1, data(&[10, 11]));
    h.trigger(2, true);
    h.push(1, vec![barrier(2, false, true)]);
    h.push(1, data(&[]));
    h.run();
    assert!(h.barrier_at(2).is_none(), "final forwarded early: {:?}", h.forwarded);
    let mut all = h.events();
    h.push(0, data(&[2]));
    h.push(0, vec![barrier(2, false, true)]);
    h.run();
    all.extend(h.events());
    assert_final_aligned(&h, &all, 2, &[1, 2, 10, 11]);
    assert!(declined(&all, 1), "checkpoint 1 cannot complete here: {all:?}");
}

/// After the final checkpoint completes, end-of-stream follows the final
/// barrier and the task finishes.
#[test]
fn task_finishes_after_the_final_checkpoint() {
    let mut h = Harness::new(CheckpointMode::Unaligned, 2, 0);
    h.trigger(1, true);
    h.push(0, data(&[1]));
    h.push(0, vec![barrier(1, false, true)]);
    h.push(1, vec![barrier(1, false, true)]);
    h.run();
    let events = h.events();
    assert_final_aligned(&h, &events, 1, &[1]);
    h.push(0, vec![Message::End]);
    h.push(1, vec![Message::End]);
    h.signals.complete(1);
    assert_eq!(h.run(), TaskPoll::Done);
    assert_eq!(h.forwarded.last(), Some(&Message::End));
}

/// What a chain end saw, in order.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Record(u64),
    Watermark(i64),
    /// `restore` with this watermark (`RestoreCtx::watermark`).
    Restored(i64),
}

/// A chain end that logs what it is handed.
struct Log(Arc<std::sync::Mutex<Vec<Seen>>>);

impl crate::runtime::collector::Collector<u64> for Log {
    fn collect(&mut self, batch: &mut Vec<u64>, _ctx: &mut TaskContext) -> Result<(), crate::error::BoxError> {
        self.0.lock().unwrap().extend(batch.drain(..).map(Seen::Record));
        Ok(())
    }
    fn flush(&mut self, _ctx: &mut TaskContext) -> Result<bool, crate::error::BoxError> {
        Ok(true)
    }
    fn finish(&mut self, _ctx: &mut TaskContext) -> Result<(), crate::error::BoxError> {
        Ok(())
    }
    fn barrier(
        &mut self,
        _barrier: Barrier,
        _snap: &mut crate::checkpoint::snapshot::TaskSnapshot,
        _ctx: &mut TaskContext,
    ) -> Result<(), crate::error::BoxError> {
        Ok(())
    }
    fn notify(
        &mut self,
        _notice: crate::runtime::collector::Notice,
        _ctx: &mut TaskContext,
    ) -> Result<(), crate::error::BoxError> {
        Ok(())
    }
    fn restore(
        &mut self,
        r: &crate::runtime::collector::RestoreCtx<'_>,
        _ctx: &mut TaskContext,
    ) -> Result<(), crate::error::BoxError> {
        self.0.lock().unwrap().push(Seen::Restored(r.watermark));
        Ok(())
    }
    fn watermark(&mut self, wm: i64, _ctx: &mut TaskContext) -> Result<(), crate::error::BoxError> {
        self.0.lock().unwrap().push(Seen::Watermark(wm));
        Ok(())
    }
    fn tick(&mut self, _ctx: &mut TaskContext) -> Result<(), crate::error::BoxError> {
        Ok(())
    }
}

/// A new two-input task whose chain logs what it sees, restored from
/// checkpoint 1's `state` and polled until it has replayed it; with the
/// producers of its inputs, for live input after that.
#[allow(clippy::type_complexity)]
fn restored(
    state: &TaskState,
    ctx: &mut TaskContext,
) -> (
    InputTask<u64>,
    Vec<rtrb::Producer<Message<u64>>>,
    Arc<std::sync::Mutex<Vec<Seen>>>,
) {
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut inboxes = Vec::new();
    let mut producers = Vec::new();
    for _ in 0..2 {
        let (p, c) = RingBuffer::new(64);
        producers.push(p);
        inboxes.push(Inbox::new(c, None, None));
    }
    let mut task = InputTask::new(inboxes, Box::new(Log(log.clone())), 64);
    let rc = crate::runtime::collector::RestoreCtx {
        own: Some(state),
        all: std::slice::from_ref(state),
        checkpoint: 1,
        key_groups: 0..1,
        watermark: crate::watermark::MIN_WATERMARK,
    };
    task.restore(&rc, ctx).unwrap();
    for _ in 0..8 {
        task.poll(ctx).unwrap();
    }
    (task, producers, log)
}

/// An unaligned snapshot keeps the watermarks between the records it
/// overtook, and the event time of every input at the snapshot; a restore
/// hands the chain the event time it had (without firing) and replays the
/// records with the watermarks in place, so what the chain sees after the
/// restore is what it would have seen.
#[test]
fn unaligned_channel_state_replays_watermarks_in_place() {
    let mut h = Harness::new(CheckpointMode::Unaligned, 2, 0);
    h.push(0, vec![Message::Watermark(5)]);
    h.push(1, vec![Message::Watermark(7)]);
    h.run();
    assert_eq!(h.forwarded, vec![Message::Watermark(5)]);
    h.trigger(1, false);
    h.push(0, data(&[1]));
    h.push(0, vec![Message::Watermark(20)]);
    h.push(0, data(&[2]));
    h.push(0, vec![barrier(1, true, false)]);
    h.push(0, data(&[3]));
    h.push(1, data(&[10]));
    h.push(1, vec![Message::Watermark(30), barrier(1, true, false)]);
    h.run();
    let events = h.events();
    let state = acked(&events, 1).expect("checkpoint 1 acknowledged");
    assert_eq!(
        state.input_channel_watermarks,
        vec![(0, vec![(1, 20)]), (1, vec![(1, 30)])]
    );
    assert_eq!(state.channel_records, 3);
    let time = state.input_event_time.clone().expect("event time at the snapshot");
    assert_eq!(time.channels, vec![(5, false), (7, false)]);
    assert_eq!(time.emitted, 5);

    // A new task restored from that state.
    let (mut task, mut producers, log) = restored(&state, &mut h.ctx);
    // Channel 0's records and watermark, then channel 1's: the combined
    // watermark is the minimum over both inputs, as it was.
    assert_eq!(
        *log.lock().unwrap(),
        vec![
            Seen::Restored(5),
            Seen::Record(1),
            Seen::Watermark(7),
            Seen::Record(2),
            Seen::Record(10),
            Seen::Watermark(20),
        ]
    );
    // Live input goes on from there: input 0 at 20, input 1 at 30.
    producers[0].push(Message::Watermark(25)).unwrap();
    for _ in 0..4 {
        task.poll(&mut h.ctx).unwrap();
    }
    assert_eq!(log.lock().unwrap().last(), Some(&Seen::Watermark(25)));
    drop(producers);
}

/// An aligned snapshot stores the inputs' event time too, and a restore
/// hands it to the chain, which then goes on from there.
#[test]
fn aligned_snapshot_restores_event_time() {
    let mut h = Harness::new(CheckpointMode::Aligned, 2, 0);
    h.trigger(1, false);
    h.push(0, vec![Message::Watermark(11), barrier(1, false, false)]);
    h.push(1, vec![Message::Watermark(9), barrier(1, false, false)]);
    h.run();
    let events = h.events();
    let state = acked(&events, 1).unwrap();
    assert_eq!(
        state.input_event_time.as_ref().map(|t| (t.channels.clone(), t.emitted)),
        Some((vec![(11, false), (9, false)], 9))
    );
    assert!(state.input_channel_watermarks.is_empty() && state.input_channels.is_empty());
}

/// At-least-once: inputs are not blocked, so watermarks from after the
/// barrier may be in the task's event time at the snapshot. It is not
/// stored: the sources replay records from before those watermarks, which
/// must not become late.
#[test]
fn at_least_once_snapshot_stores_no_event_time() {
    let mut h = Harness::new(CheckpointMode::AtLeastOnce, 2, 0);
    h.trigger(1, false);
    h.push(0, vec![barrier(1, false, false), Message::Watermark(50)]);
    h.push(1, vec![Message::Watermark(9)]);
    h.run();
    h.push(1, vec![barrier(1, false, false)]);
    h.run();
    let events = h.events();
    let state = acked(&events, 1).unwrap();
    assert_eq!(state.input_event_time, None);
}

/// A batch handed over by reference (a same-worker channel) is read in
/// order with the records around it, and an unaligned snapshot that
/// overtakes it records each of its records as channel state: restored,
/// they replay one by one, in the same order.
#[test]
fn a_batch_handed_over_is_read_in_order_and_recorded_as_channel_state() {
    let mut h = Harness::new(CheckpointMode::Unaligned, 2, 0);
    h.trigger(1, false);
    h.push(0, data(&[1]));
    h.push(0, vec![Message::batch(Box::new(vec![2, 3, 4]))]);
    h.push(0, data(&[5]));
    h.push(0, vec![barrier(1, true, false)]);
    h.push(0, vec![Message::batch(Box::new(vec![6, 7]))]);
    h.push(1, data(&[10]));
    h.push(1, vec![barrier(1, true, false)]);
    h.run();
    let events = h.events();
    let state = acked(&events, 1).expect("checkpoint 1 acknowledged");
    assert_eq!(state.channel_records, 6, "1, the batch's 2, 3, 4, then 5 and 10");
    let records = h.records();
    let input0: Vec<u64> = records.iter().copied().filter(|&r| r < 10).collect();
    assert_eq!(input0, [1, 2, 3, 4, 5, 6, 7], "input 0's records in order");
    assert!(records.contains(&10));

    let (_task, _producers, log) = restored(&state, &mut h.ctx);
    let replayed: Vec<u64> = log
        .lock()
        .unwrap()
        .iter()
        .filter_map(|s| match s {
            Seen::Record(r) => Some(*r),
            _ => None,
        })
        .collect();
    assert_eq!(replayed, [1, 2, 3, 4, 5, 10]);
}

/// The box of each batch handed over goes back to the producer's pool,
/// emptied and with its capacity, once the chain has the records: the
/// pool never runs dry and nothing is allocated per batch.
#[test]
fn a_batch_s_box_goes_back_to_its_pool_empty() {
    use crate::runtime::message::{batch_pool, BATCHES_IN_FLIGHT};
    let (mut ring, c) = RingBuffer::new(16);
    let (back, mut pool) = batch_pool::<u64>(8);
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut task = InputTask::new(vec![Inbox::new(c, None, Some(back))], Box::new(Log(log.clone())), 64);
    let (mut ctx, _) = TaskContext::for_test("test", 1, 64);
    let mut next = 0u64;
    for _ in 0..3 {
        // Every box out, filled, handed over, then read.
        while let Ok(mut b) = pool.pop() {
            b.extend([next, next + 1]);
            next += 2;
            ring.push(Message::batch(b)).unwrap();
        }
        for _ in 0..4 {
            task.poll(&mut ctx).unwrap();
        }
        assert_eq!(pool.slots(), BATCHES_IN_FLIGHT, "every box came back");
    }
    while let Ok(b) = pool.pop() {
        assert!(b.is_empty() && b.capacity() >= 8, "emptied, capacity kept");
    }
    let want: Vec<Seen> = (0..next).map(Seen::Record).collect();
    assert_eq!(*log.lock().unwrap(), want);
}

/// A batch still in a ring when its input is dropped (a job torn down
/// mid-flight) is freed with its records, although a batch message has no
/// drop glue of its own.
#[test]
fn a_batch_in_flight_is_freed_with_its_input() {
    use std::rc::Rc;
    let token = Rc::new(());
    let (mut ring, c) = RingBuffer::new(8);
    ring.push(Message::batch(Box::new(vec![token.clone(), token.clone()])))
        .unwrap();
    ring.push(Message::Data(token.clone())).unwrap();
    assert_eq!(Rc::strong_count(&token), 4);
    drop(Inbox::new(c, None, None));
    drop(ring);
    assert_eq!(Rc::strong_count(&token), 1, "every record freed once");
}

/// Pushes `n` records (`first..first + n`) into input `input`, polling
/// the task whenever the ring is full.
fn fill(h: &mut Harness, input: usize, first: u64, n: u64) {
    let mut pushed = 0;
    while pushed < n {
        while pushed < n && h.inputs[input].slots() > 0 {
            h.inputs[input].push(Message::Data(first + pushed)).unwrap();
            pushed += 1;
        }
        h.run();
    }
}

/// Dedup mode: the upstream backup keeps what the task took since its
/// last completed checkpoint. Past its limit it lets go of everything, the
/// task reading on (a task that stopped would leave the next barrier
/// behind its input, and no checkpoint could ever free it); from the next
/// snapshot it keeps records again. Every record is forwarded once, in
/// order, and the snapshot holds the channel positions.
#[test]
fn a_dedup_backup_past_its_limit_lets_go_and_the_task_reads_on() {
    let mut h = Harness::new(CheckpointMode::Dedup, 2, 0);
    h.ctx.ckpt.as_mut().unwrap().backup_limit = 4096;
    h.task.open(&mut h.ctx).unwrap();
    let base = 1u64 << 32; // 5 bytes each in the backup
    fill(&mut h, 0, base, 600);
    assert_eq!(h.task.backup.as_ref().unwrap().held_records(), 600, "3,000 bytes held");
    fill(&mut h, 0, base + 600, 400);
    let held = h.task.backup.as_ref().unwrap();
    assert!(held.overflowed() && held.bytes() == 0, "over 4,096 bytes: all let go");
    assert_eq!(h.records().len(), 1000, "the task read on");
    h.trigger(1, false);
    h.push(0, vec![barrier(1, false, false)]);
    h.push(1, vec![barrier(1, false, false)]);
    h.run();
    let events = h.events();
    let state = acked(&events, 1).expect("checkpoint 1 acknowledged");
    let positions = state
        .operator(super::dedup::POSITIONS_OP as usize)
        .expect("a dedup snapshot stores its channel positions");
    let positions = super::dedup::Positions::decode(positions, 2, 1).unwrap();
    assert_eq!(positions.channels, vec![(1000, 1000), (0, 0)]);
    fill(&mut h, 1, base + 1000, 10);
    let held = h.task.backup.as_ref().unwrap();
    assert!(!held.overflowed());
    assert_eq!(held.held_records(), 10, "kept again after the snapshot");
    assert_eq!(
        h.records(),
        (base..base + 1010).collect::<Vec<_>>(),
        "every record once, in order"
    );
}
