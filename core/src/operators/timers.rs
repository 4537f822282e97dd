//! Timers of keyed operators: per key, a set of event-time and
//! processing-time instants at which the operator wants to be called back.
//!
//! The timers live in a [`MapStore`] of the memory-mapped backend (key ->
//! `(domain, time)`), so they are checkpointed with the operator's state
//! and restored with it, rescaling included. An in-memory queue ordered
//! by time, rebuilt from the store on restore, finds the due ones; a
//! deleted timer stays in the queue and is skipped when popped (the store
//! is the truth). A processing-time timer that fell due while the job was
//! down fires at the first check after recovery; an event-time timer fires
//! once the watermark passes it.

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::Result;
use crate::state::{MapStore, PodCodec, StateHandle, StateKey, StoreOptions};

/// Which clock a timer follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TimeDomain {
    /// Fires when the operator's watermark reaches the time.
    EventTime,
    /// Fires when the wall clock (epoch milliseconds) reaches the time.
    ProcessingTime,
}

impl TimeDomain {
    fn tag(self) -> u8 {
        match self {
            TimeDomain::EventTime => 0,
            TimeDomain::ProcessingTime => 1,
        }
    }
}

/// The wall clock in epoch milliseconds: the processing-time domain.
pub fn processing_time_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The timers of one keyed operator subtask.
pub(crate) struct TimerService<K> {
    pub(crate) store: MapStore<K, (u8, i64), u8, PodCodec>,
    event: BTreeMap<i64, Vec<K>>,
    processing: BTreeMap<i64, Vec<K>>,
}

impl<K: StateKey> TimerService<K> {
    pub(crate) fn create(opts: StoreOptions) -> Result<Self> {
        Ok(Self::with_store(MapStore::create(opts)?))
    }

    pub(crate) fn restore(opts: StoreOptions, root: &Path, handles: &[StateHandle]) -> Result<Self> {
        Ok(Self::with_store(MapStore::restore(opts, root, handles)?))
    }

    fn with_store(store: MapStore<K, (u8, i64), u8, PodCodec>) -> Self {
        let mut s = TimerService {
            store,
            event: BTreeMap::new(),
            processing: BTreeMap::new(),
        };
        let mut all = Vec::new();
        s.store.for_each(|k, &(d, t), _| all.push((k.clone(), d, t)));
        for (k, d, t) in all {
            s.queue(d).entry(t).or_default().push(k);
        }
        s
    }

    fn queue(&mut self, tag: u8) -> &mut BTreeMap<i64, Vec<K>> {
        if tag == 0 {
            &mut self.event
        } else {
            &mut self.processing
        }
    }

    /// Registers a timer; registering one that exists does nothing.
    pub(crate) fn register(&mut self, key: &K, domain: TimeDomain, time: i64) -> Result<()> {
        let uk = (domain.tag(), time);
        if self.store.get(key, &uk).is_some() {
            return Ok(());
        }
        self.store.put(key, &uk, &1)?;
        self.queue(domain.tag()).entry(time).or_default().push(key.clone());
        Ok(())
    }

    /// Deletes a timer, if it exists.
    pub(crate) fn delete(&mut self, key: &K, domain: TimeDomain, time: i64) {
        // The queue entry is skipped when it comes up.
        self.store.remove(key, &(domain.tag(), time));
    }

    /// Removes and returns a timer of `domain` due at or before `now`,
    /// earliest first.
    pub(crate) fn pop_due(&mut self, domain: TimeDomain, now: i64) -> Option<(i64, K)> {
        let tag = domain.tag();
        loop {
            let mut entry = self.queue(tag).first_entry()?;
            let time = *entry.key();
            if time > now {
                return None;
            }
            let key = entry.get_mut().pop();
            if entry.get().is_empty() {
                entry.remove();
            }
            let Some(key) = key else { continue };
            if self.store.remove(&key, &(tag, time)) {
                return Some((time, key));
            }
        }
    }

    /// The earliest pending time of `domain`, if any (deleted timers
    /// included: a lower bound).
    pub(crate) fn next_time(&self, domain: TimeDomain) -> Option<i64> {
        let q = if domain == TimeDomain::EventTime {
            &self.event
        } else {
            &self.processing
        };
        q.keys().next().copied()
    }

    /// Live timers.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.store.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(dir: &Path) -> StoreOptions {
        StoreOptions::new(dir)
    }

    #[test]
    fn timers_fire_in_time_order_once_and_deleted_ones_never() {
        let dir = tempfile::tempdir().unwrap();
        let mut t: TimerService<u64> = TimerService::create(opts(dir.path())).unwrap();
        t.register(&1, TimeDomain::EventTime, 30).unwrap();
        t.register(&2, TimeDomain::EventTime, 10).unwrap();
        t.register(&2, TimeDomain::EventTime, 10).unwrap();
        t.register(&3, TimeDomain::EventTime, 20).unwrap();
        t.register(&3, TimeDomain::ProcessingTime, 5).unwrap();
        t.delete(&3, TimeDomain::EventTime, 20);
        assert_eq!(t.len(), 3);
        assert_eq!(t.pop_due(TimeDomain::EventTime, 25), Some((10, 2)));
        assert_eq!(
            t.pop_due(TimeDomain::EventTime, 25),
            None,
            "the deleted timer at 20 is skipped"
        );
        assert_eq!(t.pop_due(TimeDomain::ProcessingTime, 4), None);
        assert_eq!(t.pop_due(TimeDomain::ProcessingTime, 5), Some((5, 3)));
        assert_eq!(t.pop_due(TimeDomain::EventTime, i64::MAX), Some((30, 1)));
        assert_eq!(t.pop_due(TimeDomain::EventTime, i64::MAX), None);
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn timers_survive_snapshot_and_restore() {
        let dir = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        let mut t: TimerService<u64> = TimerService::create(opts(dir.path())).unwrap();
        for k in 0..100u64 {
            t.register(&k, TimeDomain::EventTime, (k as i64) * 7 % 50).unwrap();
        }
        let handle = t.store.snapshot(1).write(root.path()).unwrap();
        t.store.snapshot_done(1, true);
        // Fired after the snapshot: the restored service still has it.
        assert!(t.pop_due(TimeDomain::EventTime, 0).is_some());
        drop(t);
        let dir2 = tempfile::tempdir().unwrap();
        let mut r: TimerService<u64> = TimerService::restore(opts(dir2.path()), root.path(), &[handle]).unwrap();
        let mut fired = Vec::new();
        while let Some((time, k)) = r.pop_due(TimeDomain::EventTime, i64::MAX) {
            fired.push((time, k));
        }
        assert_eq!(fired.len(), 100);
        assert!(fired.windows(2).all(|w| w[0].0 <= w[1].0), "in time order");
    }
}
