//! The window operator and its bodies (aggregate, list); the builder and
//! user documentation are in `crate::api::window`.

use std::collections::BTreeMap;
use std::hash::Hash;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::checkpoint::snapshot::TaskSnapshot;
use crate::data::Data;
use crate::error::BoxError;
use crate::operators::stores::{restore_options, Snapshottable, StoreLifecycle};
use crate::runtime::collector::{Collector, Notice, RestoreCtx};
use crate::runtime::context::TaskContext;
use crate::runtime::message::Barrier;
use crate::state::{MapStore, PodCodec, SerdeCodec, StateHandle, StateKey, StoreOptions};
use crate::watermark::IDLE;

/// Most windows one record may belong to (`size / slide` of a sliding
/// window): bounds the work per record.
pub const MAX_WINDOWS_PER_RECORD: i64 = 1_000;

/// A window of event time: `[start, end)` in epoch milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Window {
    /// First millisecond in the window.
    pub start: i64,
    /// First millisecond after the window.
    pub end: i64,
}

impl Window {
    /// The largest timestamp in the window: it fires when the watermark
    /// reaches this.
    pub fn max_timestamp(&self) -> i64 {
        self.end - 1
    }

    fn key(&self) -> (i64, i64) {
        (self.start, self.end)
    }

    fn from_key((start, end): (i64, i64)) -> Self {
        Window { start, end }
    }

    /// Whether the two windows overlap or touch (sessions merge then).
    fn touches(&self, other: &Window) -> bool {
        self.start <= other.end && other.start <= self.end
    }
}

/// How records are assigned to windows.
///
/// ```
/// use weir_core::window::{Window, Windows};
/// let mut w = Vec::new();
/// Windows::sliding(10_000, 2_000).assign(12_345, &mut w);
/// assert_eq!(w.len(), 5);
/// assert!(w.contains(&Window { start: 4_000, end: 14_000 }));
/// assert!(w.contains(&Window { start: 12_000, end: 22_000 }));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Windows {
    /// Consecutive windows of `size_ms`: `[k * size, (k + 1) * size)`.
    Tumbling {
        /// Window length.
        size_ms: i64,
    },
    /// Windows of `size_ms` starting every `slide_ms`.
    Sliding {
        /// Window length.
        size_ms: i64,
        /// Distance between window starts.
        slide_ms: i64,
    },
    /// Per key, records at most `gap_ms` apart share a window (sessions
    /// that touch merge).
    Session {
        /// Inactivity that closes a session.
        gap_ms: i64,
    },
}

impl Windows {
    /// Tumbling windows of `size_ms`.
    pub fn tumbling(size_ms: i64) -> Self {
        Windows::Tumbling { size_ms }
    }

    /// Sliding windows of `size_ms` every `slide_ms`.
    pub fn sliding(size_ms: i64, slide_ms: i64) -> Self {
        Windows::Sliding { size_ms, slide_ms }
    }

    /// Session windows closed by `gap_ms` of inactivity.
    pub fn session(gap_ms: i64) -> Self {
        Windows::Session { gap_ms }
    }

    pub(crate) fn validate(&self) -> Result<(), String> {
        match *self {
            Windows::Tumbling { size_ms } if size_ms <= 0 => {
                Err(format!("tumbling window size {size_ms} ms must be positive"))
            }
            Windows::Sliding { size_ms, slide_ms } if size_ms <= 0 || slide_ms <= 0 => Err(format!(
                "sliding window size {size_ms} ms and slide {slide_ms} ms must be positive"
            )),
            Windows::Sliding { size_ms, slide_ms } if (size_ms + slide_ms - 1) / slide_ms > MAX_WINDOWS_PER_RECORD => {
                Err(format!(
                    "sliding window size {size_ms} ms / slide {slide_ms} ms puts each record in more than \
                 {MAX_WINDOWS_PER_RECORD} windows: use a larger slide"
                ))
            }
            Windows::Session { gap_ms } if gap_ms <= 0 => Err(format!("session gap {gap_ms} ms must be positive")),
            _ => Ok(()),
        }
    }

    /// Appends the windows containing timestamp `ts` to `out`.
    pub fn assign(&self, ts: i64, out: &mut Vec<Window>) {
        match *self {
            Windows::Tumbling { size_ms } => {
                let start = ts - ts.rem_euclid(size_ms);
                out.push(Window {
                    start,
                    end: start.saturating_add(size_ms),
                });
            }
            Windows::Sliding { size_ms, slide_ms } => {
                let mut start = ts - ts.rem_euclid(slide_ms);
                while start > ts.saturating_sub(size_ms) {
                    out.push(Window {
                        start,
                        end: start.saturating_add(size_ms),
                    });
                    start -= slide_ms;
                }
            }
            Windows::Session { gap_ms } => out.push(Window {
                start: ts,
                end: ts.saturating_add(gap_ms),
            }),
        }
    }
}

/// What a window operator emits: results, and late records on the side.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Windowed<O, T> {
    /// A window's result.
    Result(O),
    /// A record that arrived after all its windows were complete (past the
    /// allowed lateness): the side output of late data.
    Late(T),
}

impl<O, T> Windowed<O, T> {
    /// The result, if this is one.
    pub fn result(self) -> Option<O> {
        match self {
            Windowed::Result(o) => Some(o),
            Windowed::Late(_) => None,
        }
    }

    /// The late record, if this is one.
    pub fn late(self) -> Option<T> {
        match self {
            Windowed::Late(t) => Some(t),
            Windowed::Result(_) => None,
        }
    }
}

/// An incremental aggregation: each record is folded into an accumulator
/// as it arrives, so a window's state stays one small value.
///
/// ```
/// use weir_core::window::AggregateFunction;
/// /// Count and sum of `i64` values; the result is the mean.
/// #[derive(Clone)]
/// struct Mean;
/// impl AggregateFunction<i64> for Mean {
///     type Acc = (u64, i64);
///     type Output = f64;
///     fn add(&self, acc: &mut (u64, i64), v: &i64) { acc.0 += 1; acc.1 += v; }
///     fn result(&self, acc: &(u64, i64)) -> f64 { acc.1 as f64 / acc.0 as f64 }
///     fn merge(&self, acc: &mut (u64, i64), other: (u64, i64)) { acc.0 += other.0; acc.1 += other.1; }
/// }
/// ```
pub trait AggregateFunction<T>: Clone + Send + 'static {
    /// The running state of one window; starts as `Default`.
    type Acc: Data + Default;
    /// The window's result.
    type Output;
    /// Most bytes one encoded accumulator may take.
    const MAX_ACC_BYTES: usize = 64;
    /// Folds one record into the accumulator.
    fn add(&self, acc: &mut Self::Acc, value: &T);
    /// The result of a window from its accumulator.
    fn result(&self, acc: &Self::Acc) -> Self::Output;
    /// Folds `other` into `acc` (session windows merging).
    fn merge(&self, acc: &mut Self::Acc, other: Self::Acc);
}

/// A reduce function as an aggregate: the accumulator is the reduced record.
#[derive(Clone)]
pub(crate) struct Reduce<F>(pub(crate) F);

impl<T, F> AggregateFunction<T> for Reduce<F>
where
    T: Data + Clone,
    F: Fn(&T, &T) -> T + Clone + Send + 'static,
{
    type Acc = Option<T>;
    type Output = T;
    const MAX_ACC_BYTES: usize = 1024;
    fn add(&self, acc: &mut Option<T>, value: &T) {
        *acc = Some(match acc.take() {
            Some(a) => (self.0)(&a, value),
            None => value.clone(),
        });
    }
    fn result(&self, acc: &Option<T>) -> T {
        acc.clone().expect("a window that fires holds at least one record")
    }
    fn merge(&self, acc: &mut Option<T>, other: Option<T>) {
        if let Some(o) = other {
            self.add(acc, &o);
        }
    }
}

/// The contents of windows, by (key, window): an accumulator or records.
pub(crate) trait WindowBody<K, T, O>: Send {
    fn add(&mut self, key: &K, w: Window, record: &T) -> Result<(), BoxError>;
    fn merge_into(&mut self, key: &K, from: Window, into: Window) -> Result<(), BoxError>;
    fn emit(&mut self, key: &K, w: Window, out: &mut Vec<Windowed<O, T>>);
    /// Emits window `w` made of the contents of `panes`.
    fn emit_panes(&mut self, key: &K, panes: &[Window], w: Window, out: &mut Vec<Windowed<O, T>>);
    fn clear(&mut self, key: &K, w: Window);
    fn store(&mut self) -> &mut dyn Snapshottable;
    fn restore(&mut self, opts: StoreOptions, root: &Path, handles: &[StateHandle]) -> Result<(), BoxError>;
}

pub(crate) struct AggBody<K, A: AggregateFunction<T>, R, T> {
    pub(crate) agg: A,
    pub(crate) result: R,
    pub(crate) store: MapStore<K, (i64, i64), A::Acc, SerdeCodec>,
}

impl<K, T, O, A, R> WindowBody<K, T, O> for AggBody<K, A, R, T>
where
    K: StateKey,
    T: Send,
    A: AggregateFunction<T>,
    R: FnMut(&K, Window, A::Output) -> O + Send,
{
    fn add(&mut self, key: &K, w: Window, record: &T) -> Result<(), BoxError> {
        let mut acc = self.store.get(key, &w.key()).unwrap_or_default();
        self.agg.add(&mut acc, record);
        self.store.put(key, &w.key(), &acc).map_err(|e| {
            format!(
                "{e} (an encoded window accumulator may take at most {} bytes: raise \
                 AggregateFunction::MAX_ACC_BYTES, or max_element_bytes for reduce)",
                A::MAX_ACC_BYTES
            )
        })?;
        Ok(())
    }
    fn merge_into(&mut self, key: &K, from: Window, into: Window) -> Result<(), BoxError> {
        let Some(other) = self.store.get(key, &from.key()) else {
            return Ok(());
        };
        self.store.remove(key, &from.key());
        let mut acc = self.store.get(key, &into.key()).unwrap_or_default();
        self.agg.merge(&mut acc, other);
        self.store.put(key, &into.key(), &acc)?;
        Ok(())
    }
    fn emit(&mut self, key: &K, w: Window, out: &mut Vec<Windowed<O, T>>) {
        if let Some(acc) = self.store.get(key, &w.key()) {
            out.push(Windowed::Result((self.result)(key, w, self.agg.result(&acc))));
        }
    }
    fn emit_panes(&mut self, key: &K, panes: &[Window], w: Window, out: &mut Vec<Windowed<O, T>>) {
        let mut acc: Option<A::Acc> = None;
        for p in panes {
            if let Some(a) = self.store.get(key, &p.key()) {
                match &mut acc {
                    Some(total) => self.agg.merge(total, a),
                    None => acc = Some(a),
                }
            }
        }
        if let Some(acc) = acc {
            out.push(Windowed::Result((self.result)(key, w, self.agg.result(&acc))));
        }
    }
    fn clear(&mut self, key: &K, w: Window) {
        self.store.remove(key, &w.key());
    }
    fn store(&mut self) -> &mut dyn Snapshottable {
        &mut self.store
    }
    fn restore(&mut self, opts: StoreOptions, root: &Path, handles: &[StateHandle]) -> Result<(), BoxError> {
        self.store = MapStore::restore(opts, root, handles)?;
        Ok(())
    }
}

/// Where a window's record is kept: `(start, (end, sequence number))`.
type ElementKey = (i64, (i64, u64));

/// Every record of every window, in arrival order (a sequence number).
pub(crate) struct ListBody<K, T, P, O> {
    pub(crate) f: P,
    pub(crate) store: MapStore<K, ElementKey, T, SerdeCodec>,
    pub(crate) seq: u64,
    pub(crate) scratch: Vec<(u64, ElementKey)>,
    pub(crate) records: Vec<T>,
    pub(crate) results: Vec<O>,
}

impl<K: StateKey, T: Data, P, O> ListBody<K, T, P, O> {
    fn entries_of(&mut self, key: &K, w: Window) {
        self.scratch.clear();
        let scratch = &mut self.scratch;
        self.store.user_keys_in(key, |&(s, (e, seq))| {
            if s == w.start && e == w.end {
                scratch.push((seq, (s, (e, seq))));
            }
        });
        self.scratch.sort_unstable_by_key(|&(seq, _)| seq);
    }
}

impl<K, T, O, P> WindowBody<K, T, O> for ListBody<K, T, P, O>
where
    K: StateKey,
    T: Data + Clone,
    O: Send,
    P: FnMut(&K, Window, &[T], &mut Vec<O>) + Send,
{
    fn add(&mut self, key: &K, w: Window, record: &T) -> Result<(), BoxError> {
        self.seq += 1;
        self.store
            .put(key, &(w.start, (w.end, self.seq)), record)
            .map_err(|e| format!("{e} (a window element may take at most the window's max_element_bytes: raise it)"))?;
        Ok(())
    }
    fn merge_into(&mut self, key: &K, from: Window, into: Window) -> Result<(), BoxError> {
        self.entries_of(key, from);
        for &(seq, uk) in &self.scratch {
            if let Some(v) = self.store.get(key, &uk) {
                self.store.remove(key, &uk);
                self.store.put(key, &(into.start, (into.end, seq)), &v)?;
            }
        }
        Ok(())
    }
    fn emit(&mut self, key: &K, w: Window, out: &mut Vec<Windowed<O, T>>) {
        self.emit_panes(key, &[w], w, out);
    }
    fn emit_panes(&mut self, key: &K, panes: &[Window], w: Window, out: &mut Vec<Windowed<O, T>>) {
        self.scratch.clear();
        let scratch = &mut self.scratch;
        self.store.user_keys_in(key, |&(s, (e, seq))| {
            if panes.iter().any(|p| p.start == s && p.end == e) {
                scratch.push((seq, (s, (e, seq))));
            }
        });
        self.scratch.sort_unstable_by_key(|&(seq, _)| seq);
        self.records.clear();
        for (_, uk) in &self.scratch {
            if let Some(v) = self.store.get(key, uk) {
                self.records.push(v);
            }
        }
        if self.records.is_empty() {
            return;
        }
        (self.f)(key, w, &self.records, &mut self.results);
        out.extend(self.results.drain(..).map(Windowed::Result));
        self.records.clear();
    }
    fn clear(&mut self, key: &K, w: Window) {
        self.entries_of(key, w);
        for (_, uk) in &self.scratch {
            self.store.remove(key, uk);
        }
    }
    fn store(&mut self) -> &mut dyn Snapshottable {
        &mut self.store
    }
    fn restore(&mut self, opts: StoreOptions, root: &Path, handles: &[StateHandle]) -> Result<(), BoxError> {
        self.store = MapStore::restore(opts, root, handles)?;
        let mut seq = 0;
        self.store.for_each(|_, &(_, (_, s)), _| seq = seq.max(s));
        self.seq = seq;
        Ok(())
    }
}

/// A pending firing of a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Due {
    /// The watermark reached the window's end: emit its result.
    Fire,
    /// The allowed lateness passed: drop its contents.
    Cleanup,
}

/// The window operator: assigns, accumulates, fires on watermarks.
pub(crate) struct WindowOperator<T, K, O, KF, TF, B> {
    pub(crate) key_fn: KF,
    pub(crate) ts_fn: TF,
    pub(crate) windows: Windows,
    pub(crate) lateness: i64,
    /// Per key and window: 0 before it fired, 1 after (kept for lateness).
    pub(crate) meta: MapStore<K, (i64, i64), u8, PodCodec>,
    pub(crate) meta_opts: StoreOptions,
    pub(crate) body: B,
    pub(crate) body_opts: StoreOptions,
    /// Sliding windows whose size is a multiple of the slide keep their
    /// contents in panes of one slide (`(size, slide)`): a record updates
    /// one pane instead of `size / slide` windows, and a window's result
    /// merges its panes when it fires.
    pub(crate) panes: Option<(i64, i64)>,
    /// Pane mode: per key, the end of the latest window fired, so that a
    /// restore does not fire it again while its panes are still kept.
    pub(crate) fired_until: MapStore<K, u8, i64, PodCodec>,
    pub(crate) fired_opts: StoreOptions,
    /// Pane mode: the panes of the window being fired (reused).
    pub(crate) pane_scratch: Vec<Window>,
    pub(crate) queue: BTreeMap<i64, Vec<(K, Window, Due)>>,
    pub(crate) watermark: i64,
    pub(crate) lifecycle: StoreLifecycle,
    pub(crate) out: Vec<Windowed<O, T>>,
    pub(crate) assigned: Vec<Window>,
    pub(crate) next: Box<dyn Collector<Windowed<O, T>>>,
    pub(crate) op: usize,
}

impl<T, K, O, KF, TF, B> WindowOperator<T, K, O, KF, TF, B>
where
    K: StateKey,
    B: WindowBody<K, T, O>,
{
    /// A step of the paced state copy (`StoreLifecycle::advance`).
    #[cold]
    fn copy_step(&mut self) {
        let mut stores: [&mut dyn Snapshottable; 3] = [&mut self.meta, self.body.store(), &mut self.fired_until];
        self.lifecycle.advance(&mut stores);
    }

    fn is_late(&self, w: &Window) -> bool {
        w.max_timestamp().saturating_add(self.lateness) <= self.watermark
    }

    fn schedule(&mut self, key: &K, w: Window, fired: bool) {
        if !fired {
            self.queue
                .entry(w.max_timestamp())
                .or_default()
                .push((key.clone(), w, Due::Fire));
        }
        if self.lateness > 0 {
            self.queue
                .entry(w.max_timestamp().saturating_add(self.lateness))
                .or_default()
                .push((key.clone(), w, Due::Cleanup));
        }
    }

    /// Makes sure `(key, w)` is a known window.
    fn open(&mut self, key: &K, w: Window) -> Result<(), BoxError> {
        if self.meta.get(key, &w.key()).is_none() {
            self.meta.put(key, &w.key(), &0)?;
            self.schedule(key, w, false);
        }
        Ok(())
    }

    fn fire(&mut self, key: &K, w: Window) -> Result<(), BoxError> {
        self.body.emit(key, w, &mut self.out);
        if self.lateness == 0 {
            self.body.clear(key, w);
            self.meta.remove(key, &w.key());
        } else {
            self.meta.put(key, &w.key(), &1)?;
        }
        Ok(())
    }

    /// Pane mode: schedules the first window over `pane` not fired yet (each
    /// window that fires schedules the key's next one: one pending firing
    /// per key instead of one per window and pane), and the pane's cleanup.
    fn schedule_pane(&mut self, key: &K, pane: Window, fired_until: i64) {
        let Some((size, slide)) = self.panes else { return };
        let last_end = pane.start.saturating_add(size);
        let mut end = pane.end;
        while end <= fired_until {
            end += slide;
        }
        if end <= last_end {
            self.queue_fire(key, Window { start: end - size, end });
        }
        self.queue
            .entry((last_end - 1).saturating_add(self.lateness))
            .or_default()
            .push((key.clone(), pane, Due::Cleanup));
    }

    fn queue_fire(&mut self, key: &K, w: Window) {
        self.queue
            .entry(w.max_timestamp())
            .or_default()
            .push((key.clone(), w, Due::Fire));
    }

    /// Pane mode: emits window `w` of `key` from its panes, given the end
    /// of the key's latest window fired (`until`), and returns the end of
    /// the next window after `w` that holds one of the key's panes, if
    /// any: one pass over the key's panes for both.
    fn fire_panes(&mut self, key: &K, w: Window, until: i64) -> Result<Option<i64>, BoxError> {
        let (size, slide) = self.panes.expect("pane mode");
        let mut panes = std::mem::take(&mut self.pane_scratch);
        panes.clear();
        let mut next: Option<i64> = None;
        self.meta.user_keys_in(key, |&pk| {
            let p = Window::from_key(pk);
            if p.start >= w.start && p.end <= w.end {
                panes.push(p);
            }
            let end = p.end.max(w.end + slide);
            if end <= p.start.saturating_add(size) {
                next = Some(next.map_or(end, |n| n.min(end)));
            }
        });
        self.body.emit_panes(key, &panes, w, &mut self.out);
        self.pane_scratch = panes;
        if w.end > until {
            self.fired_until.put(key, &0, &w.end)?;
        }
        Ok(next)
    }

    fn add_to_pane(&mut self, key: K, record: T, ts: i64) -> Result<(), BoxError> {
        let (size, slide) = self.panes.expect("pane mode");
        let start = ts - ts.rem_euclid(slide);
        let pane = Window {
            start,
            end: start.saturating_add(slide),
        };
        // The last window holding the record ends at `start + size`.
        let last = Window {
            start,
            end: start.saturating_add(size),
        };
        if self.is_late(&last) {
            self.out.push(Windowed::Late(record));
            return Ok(());
        }
        if self.meta.get(&key, &pane.key()).is_none() {
            self.meta.put(&key, &pane.key(), &0)?;
            let until = self.fired_until.get(&key, &0).unwrap_or(i64::MIN);
            self.schedule_pane(&key, pane, until);
        }
        self.body.add(&key, pane, &record)?;
        if self.watermark >= pane.max_timestamp() {
            // Late but within the allowed lateness: fire again every window
            // holding the record that is already complete.
            let mut until = self.fired_until.get(&key, &0).unwrap_or(i64::MIN);
            let mut end = pane.end;
            while end <= last.end && end - 1 <= self.watermark {
                if !self.is_late(&Window { start: end - size, end }) {
                    self.fire_panes(&key, Window { start: end - size, end }, until)?;
                    until = until.max(end);
                }
                end += slide;
            }
        }
        Ok(())
    }

    fn add_record(&mut self, key: K, record: T, ts: i64) -> Result<(), BoxError> {
        if self.panes.is_some() {
            return self.add_to_pane(key, record, ts);
        }
        self.assigned.clear();
        self.windows.assign(ts, &mut self.assigned);
        if let Windows::Session { .. } = self.windows {
            return self.add_to_session(key, record);
        }
        let mut any = false;
        for k in 0..self.assigned.len() {
            let w = self.assigned[k];
            if self.is_late(&w) {
                continue;
            }
            any = true;
            self.open(&key, w)?;
            self.body.add(&key, w, &record)?;
            if self.watermark >= w.max_timestamp() {
                // Late but within the allowed lateness: fire again.
                self.fire(&key, w)?;
            }
        }
        if !any {
            self.out.push(Windowed::Late(record));
        }
        Ok(())
    }

    fn add_to_session(&mut self, key: K, record: T) -> Result<(), BoxError> {
        let fresh = self.assigned[0];
        if self.is_late(&fresh) {
            self.out.push(Windowed::Late(record));
            return Ok(());
        }
        let mut merged = fresh;
        let mut old = Vec::new();
        self.meta.user_keys_in(&key, |&wk| {
            let w = Window::from_key(wk);
            if w.touches(&fresh) {
                old.push(w);
            }
        });
        for w in &old {
            merged.start = merged.start.min(w.start);
            merged.end = merged.end.max(w.end);
        }
        for w in old {
            if w != merged {
                self.body.merge_into(&key, w, merged)?;
                self.meta.remove(&key, &w.key());
            }
        }
        self.open(&key, merged)?;
        self.body.add(&key, merged, &record)?;
        if self.watermark >= merged.max_timestamp() {
            self.fire(&key, merged)?;
        }
        Ok(())
    }

    fn advance(&mut self, wm: i64) -> Result<(), BoxError> {
        self.watermark = wm;
        while let Some(entry) = self.queue.first_entry() {
            if *entry.key() > wm {
                break;
            }
            let due_now = entry.remove();
            if self.panes.is_some() {
                self.advance_panes(due_now)?;
                continue;
            }
            for (key, w, due) in due_now {
                match (due, self.meta.get(&key, &w.key())) {
                    (Due::Fire, Some(0)) => self.fire(&key, w)?,
                    (Due::Cleanup, Some(_)) => {
                        self.body.clear(&key, w);
                        self.meta.remove(&key, &w.key());
                    }
                    // Merged away, cleared, or fired already.
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// Pane mode: fires the due windows (each once, though several of its
    /// panes scheduled it), then drops the panes no window needs any more.
    fn advance_panes(&mut self, due: Vec<(K, Window, Due)>) -> Result<(), BoxError> {
        let (size, _) = self.panes.expect("pane mode");
        for (key, w, d) in &due {
            if *d != Due::Fire {
                continue;
            }
            // Firing sets the key's `fired_until` to the window's end, so
            // the same window scheduled by another pane is skipped here.
            let until = self.fired_until.get(key, &0).unwrap_or(i64::MIN);
            if w.end <= until {
                continue;
            }
            // After a window fires, the key's next window holding one of
            // its panes is scheduled: one pending firing per key.
            if let Some(end) = self.fire_panes(key, *w, until)? {
                self.queue_fire(key, Window { start: end - size, end });
            }
        }
        for (key, pane, d) in due {
            if d != Due::Cleanup || self.meta.get(&key, &pane.key()).is_none() {
                continue;
            }
            self.body.clear(&key, pane);
            self.meta.remove(&key, &pane.key());
            let mut any = false;
            self.meta.user_keys_in(&key, |_| any = true);
            if !any {
                self.fired_until.remove(&key, &0);
            }
        }
        Ok(())
    }
}

impl<T, K, O, KF, TF, B> Collector<T> for WindowOperator<T, K, O, KF, TF, B>
where
    T: Send,
    K: StateKey,
    O: Send,
    KF: Fn(&T) -> K + Send,
    TF: Fn(&T) -> i64 + Send,
    B: WindowBody<K, T, O>,
{
    fn collect(&mut self, batch: &mut Vec<T>, ctx: &mut TaskContext) -> Result<(), BoxError> {
        ctx.current_op = self.op;
        for record in batch.drain(..) {
            let key = (self.key_fn)(&record);
            let ts = (self.ts_fn)(&record);
            self.add_record(key, record, ts)?;
        }
        self.next.collect(&mut self.out, ctx)
    }
    crate::operators::stores::paced_flow!();
    fn barrier(&mut self, barrier: Barrier, snap: &mut TaskSnapshot, ctx: &mut TaskContext) -> Result<(), BoxError> {
        ctx.current_op = self.op;
        let mut stores: [&mut dyn Snapshottable; 3] = [&mut self.meta, self.body.store(), &mut self.fired_until];
        self.lifecycle
            .barrier(&mut stores, barrier.id, barrier.is_final, self.op, snap);
        self.next.barrier(barrier, snap, ctx)
    }
    fn notify(&mut self, notice: Notice, ctx: &mut TaskContext) -> Result<(), BoxError> {
        let mut stores: [&mut dyn Snapshottable; 3] = [&mut self.meta, self.body.store(), &mut self.fired_until];
        self.lifecycle.notify(&mut stores, notice);
        self.next.notify(notice, ctx)
    }
    fn restore(&mut self, r: &RestoreCtx<'_>, ctx: &mut TaskContext) -> Result<(), BoxError> {
        ctx.current_op = self.op;
        let root = crate::operators::stores::checkpoint_root(ctx, "window state")?;
        let handles = StoreLifecycle::handles(r, self.op, 3)?;
        self.meta = MapStore::restore(restore_options(&self.meta_opts, r), &root, &handles[0])?;
        self.body
            .restore(restore_options(&self.body_opts, r), &root, &handles[1])?;
        self.fired_until = MapStore::restore(restore_options(&self.fired_opts, r), &root, &handles[2])?;
        // Event time as at the checkpoint: every window it completed has
        // fired (and is marked or gone), so nothing fires here, and a record
        // that was late then is late now.
        self.watermark = r.watermark;
        self.queue.clear();
        let mut windows = Vec::new();
        self.meta
            .for_each(|k, &wk, fired| windows.push((k.clone(), Window::from_key(wk), fired)));
        for (k, w, fired) in windows {
            if self.panes.is_some() {
                let until = self.fired_until.get(&k, &0).unwrap_or(i64::MIN);
                self.schedule_pane(&k, w, until);
            } else {
                self.schedule(&k, w, fired != 0);
            }
        }
        self.next.restore(r, ctx)
    }
    fn watermark(&mut self, wm: i64, ctx: &mut TaskContext) -> Result<(), BoxError> {
        if wm != IDLE && wm > self.watermark {
            ctx.current_op = self.op;
            self.advance(wm)?;
            // Results of the windows this watermark completed go first.
            self.next.collect(&mut self.out, ctx)?;
        }
        self.next.watermark(wm, ctx)
    }
    fn tick(&mut self, ctx: &mut TaskContext) -> Result<(), BoxError> {
        if self.lifecycle.copying() {
            self.copy_step();
        }
        self.next.tick(ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assign(w: Windows, ts: i64) -> Vec<Window> {
        let mut v = Vec::new();
        w.assign(ts, &mut v);
        v.sort();
        v
    }

    #[test]
    fn windows_are_half_open_and_aligned_to_epoch_zero() {
        assert_eq!(assign(Windows::tumbling(10), 0), vec![Window { start: 0, end: 10 }]);
        assert_eq!(assign(Windows::tumbling(10), 9), vec![Window { start: 0, end: 10 }]);
        assert_eq!(assign(Windows::tumbling(10), 10), vec![Window { start: 10, end: 20 }]);
        assert_eq!(assign(Windows::tumbling(10), -1), vec![Window { start: -10, end: 0 }]);
        let s = assign(Windows::sliding(10, 4), 9);
        assert_eq!(
            s,
            vec![
                Window { start: 0, end: 10 },
                Window { start: 4, end: 14 },
                Window { start: 8, end: 18 }
            ]
        );
        assert!(s.iter().all(|w| w.start <= 9 && 9 < w.end));
        assert_eq!(assign(Windows::session(5), 7), vec![Window { start: 7, end: 12 }]);
    }

    #[test]
    fn bad_windows_are_refused_with_the_reason() {
        assert!(Windows::tumbling(0).validate().unwrap_err().contains("positive"));
        assert!(Windows::sliding(10, 0).validate().unwrap_err().contains("positive"));
        assert!(Windows::sliding(1_000_000, 1)
            .validate()
            .unwrap_err()
            .contains("larger slide"));
        assert!(Windows::session(-1).validate().unwrap_err().contains("positive"));
    }
}
