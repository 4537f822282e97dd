//! The keyed process operator with timers; its builder and user
//! documentation are in `crate::api::process`.

use crate::checkpoint::snapshot::TaskSnapshot;
use crate::data::Data;
use crate::error::BoxError;
use crate::operators::stores::{restore_options, Snapshottable, StoreLifecycle};
use crate::operators::timers::{processing_time_ms, TimeDomain, TimerService};
use crate::runtime::collector::{Collector, Notice, RestoreCtx};
use crate::runtime::context::TaskContext;
use crate::runtime::message::Barrier;
use crate::state::{MapStore, SerdeCodec, StateKey, StoreOptions};
use crate::watermark::IDLE;

/// A timer change requested by user code, applied after the call.
#[derive(Debug, Clone, Copy)]
pub(crate) enum TimerOp {
    Register(TimeDomain, i64),
    Delete(TimeDomain, i64),
}

/// The per-key buffers of a [`KeyedProcessFunction`]: any number of
/// values per key, each its own entry of a [`MapStore`] under a sequence
/// number (arrival order), so that a key's small state stays small.
pub(crate) struct Buffers<K, B> {
    store: MapStore<K, u64, B, SerdeCodec>,
    seq: u64,
    scratch: Vec<u64>,
    /// A failed append, reported after the user call.
    error: Option<String>,
}

impl<K: StateKey, B: Data> Buffers<K, B> {
    pub(crate) fn new(store: MapStore<K, u64, B, SerdeCodec>) -> Self {
        let mut seq = 0;
        store.for_each(|_, &s, _| seq = seq.max(s));
        Buffers {
            store,
            seq,
            scratch: Vec::new(),
            error: None,
        }
    }

    /// The sequence numbers of `key`'s values, in arrival order.
    fn sorted(&mut self, key: &K) {
        self.scratch.clear();
        let scratch = &mut self.scratch;
        self.store.user_keys_in(key, |&s| scratch.push(s));
        self.scratch.sort_unstable();
    }

    /// Calls `f` with every value of `key`, in arrival order.
    fn for_each(&mut self, key: &K, mut f: impl FnMut(B)) {
        self.sorted(key);
        for s in &self.scratch {
            if let Some(v) = self.store.get(key, s) {
                f(v);
            }
        }
    }
}

/// What a [`KeyedProcessFunction`] can do while it handles one record or
/// one timer of `key`.
pub struct TimerContext<'a, K, O, B = ()> {
    key: &'a K,
    watermark: i64,
    out: &'a mut Vec<O>,
    ops: &'a mut Vec<TimerOp>,
    buffers: &'a mut Buffers<K, B>,
    clear: bool,
}

impl<K: StateKey, O, B: Data> TimerContext<'_, K, O, B> {
    /// Appends `value` to this key's buffer (see
    /// [`KeyedProcessFunction::Buffered`]).
    pub fn buffer_push(&mut self, value: &B) {
        self.buffers.seq += 1;
        if let Err(e) = self.buffers.store.put(self.key, &self.buffers.seq, value) {
            self.buffers.error.get_or_insert_with(|| e.to_string());
        }
    }

    /// Calls `f` with every value of this key's buffer, in arrival order.
    pub fn buffer_for_each(&mut self, f: impl FnMut(B)) {
        self.buffers.for_each(self.key, f);
    }

    /// Emits `f(value)` for every value of this key's buffer, in arrival
    /// order (what [`TimerContext::buffer_for_each`] cannot do, `ctx` being
    /// borrowed while it runs).
    pub fn emit_buffered(&mut self, mut f: impl FnMut(B) -> O) {
        let out = &mut *self.out;
        self.buffers.for_each(self.key, |v| out.push(f(v)));
    }

    /// Keeps the values of this key's buffer for which `f` is true.
    pub fn buffer_retain(&mut self, mut f: impl FnMut(&B) -> bool) {
        self.buffers.sorted(self.key);
        for s in &self.buffers.scratch {
            if let Some(v) = self.buffers.store.get(self.key, s) {
                if !f(&v) {
                    self.buffers.store.remove(self.key, s);
                }
            }
        }
    }

    /// Empties this key's buffer.
    pub fn buffer_clear(&mut self) {
        self.buffers.store.clear(self.key);
    }

    /// Whether this key's buffer is empty.
    pub fn buffer_is_empty(&mut self) -> bool {
        let mut empty = true;
        self.buffers.store.user_keys_in(self.key, |_| empty = false);
        empty
    }
}

impl<K, O, B> TimerContext<'_, K, O, B> {
    /// The key of the record or timer being handled.
    pub fn key(&self) -> &K {
        self.key
    }

    /// The operator's current watermark ([`crate::watermark::MIN_WATERMARK`]
    /// before the first one). A record with a timestamp at or below it is
    /// late.
    pub fn watermark(&self) -> i64 {
        self.watermark
    }

    /// The wall clock in epoch milliseconds, the processing-time domain.
    pub fn processing_time(&self) -> i64 {
        processing_time_ms()
    }

    /// Sends one result downstream.
    #[inline]
    pub fn emit(&mut self, record: O) {
        self.out.push(record);
    }

    /// Calls [`KeyedProcessFunction::on_timer`] for this key once the
    /// watermark reaches `time` (at once, at the next watermark, if it
    /// already has). Registering the same time twice gives one timer.
    pub fn register_event_timer(&mut self, time: i64) {
        self.ops.push(TimerOp::Register(TimeDomain::EventTime, time));
    }

    /// Calls [`KeyedProcessFunction::on_timer`] for this key once the wall
    /// clock reaches `time` (epoch milliseconds).
    pub fn register_processing_timer(&mut self, time: i64) {
        self.ops.push(TimerOp::Register(TimeDomain::ProcessingTime, time));
    }

    /// Removes this key's event-time timer at `time`, if any.
    pub fn delete_event_timer(&mut self, time: i64) {
        self.ops.push(TimerOp::Delete(TimeDomain::EventTime, time));
    }

    /// Removes this key's processing-time timer at `time`, if any.
    pub fn delete_processing_timer(&mut self, time: i64) {
        self.ops.push(TimerOp::Delete(TimeDomain::ProcessingTime, time));
    }

    /// Drops this key's state and buffer after the call (instead of
    /// storing the state).
    pub fn clear_state(&mut self) {
        self.clear = true;
    }
}

/// A keyed function with per-key state and timers.
///
/// ```
/// use weir_core::process::{KeyedProcessFunction, TimerContext};
/// use weir_core::timers::TimeDomain;
///
/// /// Per key, the sum of the values of each 10 s of event time, emitted
/// /// when the watermark passes the end of the 10 s.
/// #[derive(Clone)]
/// struct TenSecondSums;
///
/// impl KeyedProcessFunction<u64, (u64, i64, i64), (u64, i64, i64)> for TenSecondSums {
///     type State = Vec<(i64, i64)>; // (bucket end, sum)
///     type Buffered = ();
///     fn process(&mut self, (_, ts, v): (u64, i64, i64), st: &mut Self::State,
///                ctx: &mut TimerContext<'_, u64, (u64, i64, i64)>) {
///         let end = ts - ts.rem_euclid(10_000) + 10_000;
///         match st.iter_mut().find(|(e, _)| *e == end) {
///             Some((_, sum)) => *sum += v,
///             None => st.push((end, v)),
///         }
///         ctx.register_event_timer(end - 1);
///     }
///     fn on_timer(&mut self, time: i64, _: TimeDomain, st: &mut Self::State,
///                 ctx: &mut TimerContext<'_, u64, (u64, i64, i64)>) {
///         let key = *ctx.key();
///         st.retain(|&(end, sum)| {
///             if end - 1 == time { ctx.emit((key, end, sum)); false } else { true }
///         });
///     }
/// }
/// ```
pub trait KeyedProcessFunction<K, T, O>: Clone + Send + 'static {
    /// The state of one key: created by `Default` on first use, decoded
    /// for every call and encoded with serde into the memory-mapped backend
    /// after every call that changed it (compared with `PartialEq`). A
    /// state with heap parts (`Vec`, `String`) therefore allocates per
    /// record; plain fields do not. Keep it
    /// small (a slot holds [`Self::MAX_STATE_BYTES`]); put collections that
    /// grow in the buffer.
    type State: Data + Default + Clone + PartialEq;

    /// The values of the per-key buffer (`()` if unused): an append-only
    /// list per key in the memory-mapped backend, each value its own entry
    /// ([`TimerContext::buffer_push`] and friends).
    type Buffered: Data;

    /// Most bytes one key's encoded state may take (a slot of the backend
    /// holds that much); a larger state fails the job with a clear error.
    const MAX_STATE_BYTES: usize = 256;

    /// Most bytes one encoded buffered value may take.
    const MAX_BUFFERED_BYTES: usize = 256;

    /// Handles one record of key `ctx.key()`.
    fn process(&mut self, record: T, state: &mut Self::State, ctx: &mut TimerContext<'_, K, O, Self::Buffered>);

    /// A timer of `ctx.key()` registered for `time` fired.
    fn on_timer(
        &mut self,
        _time: i64,
        _domain: TimeDomain,
        _state: &mut Self::State,
        _ctx: &mut TimerContext<'_, K, O, Self::Buffered>,
    ) {
    }
}

/// The operator running a [`KeyedProcessFunction`].
pub(crate) struct ProcessOperator<T, K, O, KF, F: KeyedProcessFunction<K, T, O>> {
    pub(crate) key_fn: KF,
    pub(crate) f: F,
    pub(crate) state: Option<MapStore<K, u8, F::State, SerdeCodec>>,
    pub(crate) timers: Option<TimerService<K>>,
    pub(crate) buffers: Option<Buffers<K, F::Buffered>>,
    pub(crate) state_opts: StoreOptions,
    pub(crate) timer_opts: StoreOptions,
    pub(crate) buffer_opts: StoreOptions,
    pub(crate) lifecycle: StoreLifecycle,
    pub(crate) watermark: i64,
    pub(crate) out: Vec<O>,
    pub(crate) ops: Vec<TimerOp>,
    pub(crate) next: Box<dyn Collector<O>>,
    pub(crate) op: usize,
    pub(crate) _in: std::marker::PhantomData<fn(T)>,
}

impl<T, K, O, KF, F> ProcessOperator<T, K, O, KF, F>
where
    K: StateKey,
    F: KeyedProcessFunction<K, T, O>,
{
    /// Runs user code for `key` (a record or a timer), then stores the
    /// state and applies the timer changes it asked for.
    fn with_key(
        &mut self,
        key: &K,
        call: impl FnOnce(&mut F, &mut F::State, &mut TimerContext<'_, K, O, F::Buffered>),
    ) -> Result<(), BoxError> {
        let store = self.state.as_mut().expect("the store exists from construction to drop");
        let buffers = self.buffers.as_mut().expect("buffers exist from construction to drop");
        let mut st = store.get(key, &0).unwrap_or_default();
        // Kept to skip the write-back when the call changed nothing: most
        // records of many functions only read their key's state.
        let before = st.clone();
        let mut ctx = TimerContext {
            key,
            watermark: self.watermark,
            out: &mut self.out,
            ops: &mut self.ops,
            buffers,
            clear: false,
        };
        call(&mut self.f, &mut st, &mut ctx);
        let clear = ctx.clear;
        if let Some(e) = buffers.error.take() {
            return Err(format!(
                "{e} (a buffered value may take at most {} bytes: raise KeyedProcessFunction::MAX_BUFFERED_BYTES)",
                F::MAX_BUFFERED_BYTES
            )
            .into());
        }
        if clear {
            store.remove(key, &0);
            buffers.store.clear(key);
        } else if st != before {
            store.put(key, &0, &st).map_err(|e| {
                format!(
                    "{e} (a key's state may take at most {} bytes: raise KeyedProcessFunction::MAX_STATE_BYTES)",
                    F::MAX_STATE_BYTES
                )
            })?;
        }
        let timers = self.timers.as_mut().expect("timers exist from construction to drop");
        for op in self.ops.drain(..) {
            match op {
                TimerOp::Register(d, t) => timers.register(key, d, t)?,
                TimerOp::Delete(d, t) => timers.delete(key, d, t),
            }
        }
        Ok(())
    }

    /// Fires every timer of `domain` due at `now`, earliest first.
    fn fire(&mut self, domain: TimeDomain, now: i64) -> Result<(), BoxError> {
        loop {
            let timers = self.timers.as_mut().expect("timers exist");
            if timers.next_time(domain).is_none_or(|t| t > now) {
                return Ok(());
            }
            let Some((time, key)) = timers.pop_due(domain, now) else {
                return Ok(());
            };
            self.with_key(&key, |f, st, ctx| f.on_timer(time, domain, st, ctx))?;
        }
    }

    fn fire_processing(&mut self) -> Result<(), BoxError> {
        let timers = self.timers.as_ref().expect("timers exist");
        if timers.next_time(TimeDomain::ProcessingTime).is_some() {
            self.fire(TimeDomain::ProcessingTime, processing_time_ms())?;
        }
        Ok(())
    }

    /// A step of the paced state copy (`StoreLifecycle::advance`).
    #[cold]
    fn copy_step(&mut self) {
        let mut lifecycle = std::mem::take(&mut self.lifecycle);
        lifecycle.advance(&mut self.stores());
        self.lifecycle = lifecycle;
    }

    fn stores(&mut self) -> [&mut dyn Snapshottable; 3] {
        [
            self.state.as_mut().expect("state exists"),
            &mut self.timers.as_mut().expect("timers exist").store,
            &mut self.buffers.as_mut().expect("buffers exist").store,
        ]
    }
}

impl<T, K, O, KF, F> Collector<T> for ProcessOperator<T, K, O, KF, F>
where
    T: Send,
    K: StateKey,
    O: Send,
    KF: Fn(&T) -> K + Send,
    F: KeyedProcessFunction<K, T, O>,
{
    fn collect(&mut self, batch: &mut Vec<T>, ctx: &mut TaskContext) -> Result<(), BoxError> {
        ctx.current_op = self.op;
        for record in batch.drain(..) {
            let key = (self.key_fn)(&record);
            self.with_key(&key, |f, st, c| f.process(record, st, c))?;
        }
        self.fire_processing()?;
        self.next.collect(&mut self.out, ctx)
    }
    crate::operators::stores::paced_flow!();
    fn barrier(&mut self, barrier: Barrier, snap: &mut TaskSnapshot, ctx: &mut TaskContext) -> Result<(), BoxError> {
        ctx.current_op = self.op;
        let op = self.op;
        let mut lifecycle = std::mem::take(&mut self.lifecycle);
        lifecycle.barrier(&mut self.stores(), barrier.id, barrier.is_final, op, snap);
        self.lifecycle = lifecycle;
        self.next.barrier(barrier, snap, ctx)
    }
    fn notify(&mut self, notice: Notice, ctx: &mut TaskContext) -> Result<(), BoxError> {
        let mut lifecycle = std::mem::take(&mut self.lifecycle);
        lifecycle.notify(&mut self.stores(), notice);
        self.lifecycle = lifecycle;
        self.next.notify(notice, ctx)
    }
    fn restore(&mut self, r: &RestoreCtx<'_>, ctx: &mut TaskContext) -> Result<(), BoxError> {
        ctx.current_op = self.op;
        let root = crate::operators::stores::checkpoint_root(ctx, "keyed state")?;
        let handles = StoreLifecycle::handles(r, self.op, 3)?;
        drop(self.state.take());
        drop(self.timers.take());
        drop(self.buffers.take());
        self.buffers = Some(Buffers::new(MapStore::restore(
            restore_options(&self.buffer_opts, r),
            &root,
            &handles[2],
        )?));
        self.state = Some(MapStore::restore(
            restore_options(&self.state_opts, r),
            &root,
            &handles[0],
        )?);
        self.timers = Some(TimerService::restore(
            restore_options(&self.timer_opts, r),
            &root,
            &handles[1],
        )?);
        // Event time as at the checkpoint, firing nothing: a timer at or
        // before it fires at the next advance, as it would have.
        self.watermark = r.watermark;
        self.next.restore(r, ctx)
    }
    fn watermark(&mut self, wm: i64, ctx: &mut TaskContext) -> Result<(), BoxError> {
        if wm != IDLE && wm > self.watermark {
            ctx.current_op = self.op;
            self.watermark = wm;
            self.fire(TimeDomain::EventTime, wm)?;
            self.next.collect(&mut self.out, ctx)?;
        }
        self.next.watermark(wm, ctx)
    }
    fn tick(&mut self, ctx: &mut TaskContext) -> Result<(), BoxError> {
        ctx.current_op = self.op;
        if self.lifecycle.copying() {
            self.copy_step();
        }
        self.fire_processing()?;
        if !self.out.is_empty() {
            self.next.collect(&mut self.out, ctx)?;
        }
        self.next.tick(ctx)
    }
}

/// The options of one store of a keyed operator's subtask `j` of `q`.
pub(crate) fn store_options(
    ctx: &mut crate::runtime::plan::BuildCtx,
    j: usize,
    q: usize,
    max_value_len: usize,
) -> crate::error::Result<StoreOptions> {
    // Slots hold exactly the largest value: a timer's or a flag's store
    // takes a few bytes per entry, not a default-sized slot.
    let max_value_len = max_value_len.max(1);
    // Room for a few slots of the largest value and key per page.
    let page_size = ((max_value_len + 2 * crate::state::MAX_KEY_BYTES) * 4)
        .next_power_of_two()
        .clamp(crate::state::DEFAULT_PAGE_SIZE, crate::state::MAX_PAGE_SIZE);
    Ok(StoreOptions {
        max_parallelism: ctx.max_parallelism,
        key_groups: crate::state::key_groups::key_group_range(j, q, ctx.max_parallelism),
        max_value_len,
        page_size,
        ..StoreOptions::new(ctx.state_dir()?)
    })
}
