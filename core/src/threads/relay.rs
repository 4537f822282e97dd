//! One helper thread that wakes the others, so that a worker pays for at
//! most one wake-up per burst of hand-offs.
//!
//! A worker hands work to helper threads on the helper cores: buffers and
//! syncs to a sink's log thread, epochs to its committer, snapshot jobs to
//! the spawner. Each of them parks when it has nothing to do, and waking a
//! parked thread is a `futex` call. On a virtual machine that call is not
//! cheap: waking a thread on another core sends it an interrupt, which
//! leaves the virtual machine (several µs a wake-up, tens at worst). Under
//! the WAL sink with two sink subtasks a worker would make five of them at
//! every barrier (two log threads, two committers, the spawner) and two at
//! every commit: tens of µs of every barrier during which no record moves
//! on that core (docs/design/architecture.md#where-weirs-own-threads-run).
//!
//! So a worker does not wake a helper itself: [`Doorbell::ring`] marks the
//! helper as pending in the job's [`WakeRelay`] and wakes the **relay**
//! thread, if it parked; the relay, on the helper cores, wakes every
//! pending helper. A barrier's five wake-ups cost the worker one, and
//! after a wake-up the relay keeps looking for [`RELAY_LINGER`] before it
//! parks again, so that the rest of a burst (the next task's barrier, the
//! next sink's commit) costs the worker a fence and a load each. The job
//! thread also primes the relay ([`WakeRelay::prime`]) as it triggers and
//! as it completes a checkpoint, so that the burst's first hand-off finds
//! it awake too: the worker then makes no wake-up call at all.
//!
//! Contract:
//! - **No lost wake-up.** The same protocol as the workers' parking
//!   ([`Parker`]), applied twice: a ringer publishes its work, issues a
//!   `SeqCst` fence and reads the helper's flag; if the helper parks, the
//!   ringer sets the helper's pending bit, fences again and reads the
//!   relay's flag; the relay sets its flag, fences and reads the pending
//!   bits before it parks. Either side sees the other at each step.
//! - **Bounded.** At most [`RELAY_SLOTS`] helpers are registered at once;
//!   one more is woken directly, as without a relay (correct, only
//!   dearer). A helper's slot is freed when its [`Doorbell`] drops.
//! - **Bounded linger.** The relay yields its core while it lingers, and
//!   never lingers longer than [`RELAY_LINGER`] after the last wake-up it
//!   handled or the last priming: at 100 checkpoints/s, two primings per
//!   checkpoint, at most 1% of a helper core, given up to any thread that
//!   wants it.
//! - **Drop** stops the relay thread and joins it; pending wake-ups are
//!   handled first.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::threads::idle::Parker;
use crate::threads::placement::HelperCores;

/// Helpers registered with one relay at most: 256, against two or three
/// per sink subtask and one spawner per job. One more is woken directly.
pub(crate) const RELAY_SLOTS: usize = 256;

/// How long the relay keeps looking after the last wake-up it handled or
/// the last priming, before it parks: covers a barrier's or a commit's
/// burst across a worker's tasks (about 20 µs with the paced state copy)
/// and the barrier's trip from the trigger to the sinks. Short, because a
/// busy helper core delays the workers' core on a virtual machine: a
/// 200 µs linger, or a relay that polls, keeps the helper core busy
/// enough to put milliseconds into the worker core's tail latency, while
/// 50 µs costs the relay almost no CPU time and still spares the worker
/// nearly every `futex` call under the WAL sink at 100 checkpoints/s
/// (docs/notebook/benchmarks-2026-12.md, "The barrier's work on the
/// worker: a paced state copy and a wake-up relay").
pub(crate) const RELAY_LINGER: Duration = Duration::from_micros(50);

const WORDS: usize = RELAY_SLOTS / 64;

struct Inner {
    /// The relay thread's own parking.
    parker: Parker,
    /// Bit `i`: helper `i` was found parked by a ringer.
    pending: [AtomicU64; WORDS],
    /// The registered helpers, by slot; locked only to register, to free
    /// a slot and by the relay thread, never by a ringer.
    targets: Mutex<Vec<Option<Arc<Parker>>>>,
    stop: AtomicBool,
    /// [`WakeRelay::prime`] was called: linger even with nothing to wake.
    primed: AtomicBool,
    /// Times a ringer found the relay parked and unparked it (tests).
    #[cfg(test)]
    unparks: AtomicU64,
    /// Times the relay thread took a priming (tests: a woken relay may
    /// linger and park again before a test thread sees it awake).
    #[cfg(test)]
    primings: AtomicU64,
}

impl Inner {
    fn any_pending(&self) -> bool {
        self.pending.iter().any(|w| w.load(Ordering::Relaxed) != 0)
    }

    /// Wakes every pending helper; whether there was any.
    fn wake_pending(&self) -> bool {
        let mut any = false;
        for (w, word) in self.pending.iter().enumerate() {
            let mut bits = word.swap(0, Ordering::Acquire);
            if bits == 0 {
                continue;
            }
            any = true;
            let targets = self.targets.lock().unwrap_or_else(|p| p.into_inner());
            while bits != 0 {
                let slot = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                // A freed slot's late bit wakes nothing (or, reused, its
                // new helper once, spuriously: it parks again). Unparked
                // whether or not it says it parked: a bit may come from
                // `ring_always`, for a helper that naps unflagged.
                if let Some(Some(target)) = targets.get(slot) {
                    target.unpark();
                }
            }
        }
        any
    }

    fn run(&self) {
        self.parker.register();
        loop {
            // The stop first: what was pending before it is still woken.
            let stopping = self.stop.load(Ordering::Acquire);
            let primed = self.primed.swap(false, Ordering::AcqRel);
            #[cfg(test)]
            self.primings.fetch_add(u64::from(primed), Ordering::Relaxed);
            if self.wake_pending() | primed {
                // A burst: keep looking a little, yielding the core.
                let mut last = Instant::now();
                while last.elapsed() < RELAY_LINGER && !self.stop.load(Ordering::Acquire) {
                    std::thread::yield_now();
                    if self.wake_pending() {
                        last = Instant::now();
                    }
                }
            }
            if stopping {
                break;
            }
            self.parker.park_unless(|| {
                self.any_pending() || self.primed.load(Ordering::Acquire) || self.stop.load(Ordering::Acquire)
            });
        }
    }
}

/// A job's wake-up relay thread; see the module docs.
pub(crate) struct WakeRelay {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for WakeRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WakeRelay").finish_non_exhaustive()
    }
}

impl WakeRelay {
    /// Starts the relay thread on `helpers` (the cores of weir's own
    /// threads; `None`: unpinned).
    pub(crate) fn start(helpers: HelperCores) -> std::io::Result<Arc<Self>> {
        let inner = Arc::new(Inner {
            parker: Parker::default(),
            pending: [const { AtomicU64::new(0) }; WORDS],
            targets: Mutex::new(vec![None; RELAY_SLOTS]),
            stop: AtomicBool::new(false),
            primed: AtomicBool::new(false),
            #[cfg(test)]
            unparks: AtomicU64::new(0),
            #[cfg(test)]
            primings: AtomicU64::new(0),
        });
        let i = Arc::clone(&inner);
        let thread = std::thread::Builder::new()
            .name("weir-wake-relay".into())
            .spawn(move || {
                crate::threads::placement::enter(helpers);
                i.run();
            })?;
        Ok(Arc::new(WakeRelay {
            inner,
            thread: Some(thread),
        }))
    }

    /// Wakes the relay (from a thread that is not a worker) to linger for
    /// [`RELAY_LINGER`]: the job thread calls this as it triggers or
    /// completes a checkpoint, just before the workers' burst of
    /// hand-offs for it (the barrier's syncs and snapshot jobs, the
    /// commits), which then find the relay awake and cost them no wake-up.
    pub(crate) fn prime(&self) {
        self.inner.primed.store(true, Ordering::Release);
        self.inner.parker.wake();
    }

    /// A slot for `target`, if one is free.
    fn register(&self, target: &Arc<Parker>) -> Option<usize> {
        let mut targets = self.inner.targets.lock().unwrap_or_else(|p| p.into_inner());
        let slot = targets.iter().position(Option::is_none)?;
        targets[slot] = Some(Arc::clone(target));
        Some(slot)
    }

    fn unregister(&self, slot: usize) {
        self.inner.targets.lock().unwrap_or_else(|p| p.into_inner())[slot] = None;
    }
}

impl Drop for WakeRelay {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

thread_local! {
    /// The relay of the job this thread belongs to.
    static CURRENT: RefCell<Option<Arc<WakeRelay>>> = const { RefCell::new(None) };
}

/// Marks the calling thread as one of a job's threads with this relay
/// (doorbells made on it ring through the relay).
pub(crate) fn set_current(relay: Option<Arc<WakeRelay>>) {
    CURRENT.with(|c| *c.borrow_mut() = relay);
}

/// The relay of the calling thread's job.
pub(crate) fn current() -> Option<Arc<WakeRelay>> {
    CURRENT.with(|c| c.borrow().clone())
}

/// How one helper thread is woken after work was handed to it: through
/// the job's relay when there is one (and a free slot), directly
/// otherwise. See the module docs.
#[derive(Debug)]
pub(crate) struct Doorbell {
    target: Arc<Parker>,
    relay: Option<(Arc<WakeRelay>, usize)>,
}

impl Doorbell {
    /// A doorbell for `target`, through `relay` if given and not full.
    pub(crate) fn new(target: Arc<Parker>, relay: Option<Arc<WakeRelay>>) -> Self {
        let relay = relay.and_then(|r| r.register(&target).map(|slot| (r, slot)));
        Doorbell { target, relay }
    }

    /// The helper's parker (tests).
    #[cfg(test)]
    pub(crate) fn parker(&self) -> &Arc<Parker> {
        &self.target
    }

    /// Whether this doorbell rings through a relay.
    #[cfg(test)]
    pub(crate) fn relayed(&self) -> bool {
        self.relay.is_some()
    }

    /// Call after publishing work for the helper: wakes it if it parked,
    /// through the relay if there is one. A fence and a load when the
    /// helper is awake; when it parked, a bit and, only if the relay
    /// parked too, one wake-up of the relay.
    #[inline]
    pub(crate) fn ring(&self) {
        match &self.relay {
            None => self.target.wake(),
            Some((relay, slot)) => {
                if self.target.wants_wake() {
                    Self::through(relay, *slot);
                }
            }
        }
    }

    /// [`Doorbell::ring`] whether or not the helper said it parked: also
    /// cuts short a nap it takes unflagged (an I/O thread's,
    /// [`crate::threads::io_thread::IoThread::set_nap`]). When the helper is awake
    /// its next park returns at once, and it looks again.
    pub(crate) fn ring_always(&self) {
        match &self.relay {
            None => self.target.unpark(),
            Some((relay, slot)) => Self::through(relay, *slot),
        }
    }

    /// Marks helper `slot` pending in `relay` and wakes the relay if it
    /// parked.
    #[inline]
    fn through(relay: &WakeRelay, slot: usize) {
        relay.inner.pending[slot / 64].fetch_or(1 << (slot % 64), Ordering::Relaxed);
        if relay.inner.parker.wants_wake() {
            #[cfg(test)]
            relay.inner.unparks.fetch_add(1, Ordering::Relaxed);
            relay.inner.parker.unpark();
        }
    }
}

impl Drop for Doorbell {
    fn drop(&mut self) {
        if let Some((relay, slot)) = self.relay.take() {
            relay.unregister(slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// A helper that parks (a minute in tests) until its doorbell rings,
    /// and reports each time it found work.
    fn helper(work: Arc<AtomicU64>) -> (Arc<Parker>, mpsc::Receiver<u64>, JoinHandle<()>) {
        let parker = Arc::new(Parker::default());
        let (tx, rx) = mpsc::channel();
        let p = Arc::clone(&parker);
        let t = std::thread::spawn(move || {
            p.register();
            let mut seen = 0;
            loop {
                let now = work.load(Ordering::Acquire);
                if now == u64::MAX {
                    break;
                }
                if now > seen {
                    seen = now;
                    tx.send(now).unwrap();
                    continue;
                }
                p.park_unless(|| work.load(Ordering::Acquire) != seen);
            }
        });
        (parker, rx, t)
    }

    fn wait_until(what: &str, f: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_ring_through_a_parked_relay_wakes_a_parked_helper() {
        let relay = WakeRelay::start(None).unwrap();
        let work = Arc::new(AtomicU64::new(0));
        let (parker, rx, t) = helper(Arc::clone(&work));
        let bell = Doorbell::new(parker, Some(Arc::clone(&relay)));
        assert!(bell.relayed());
        for round in 1..=10u64 {
            // Both parked (a minute each in tests): only the ring's wake-up
            // of the relay, and the relay's of the helper, get it going.
            wait_until("the helper never parked", || bell.parker().is_sleeping());
            wait_until("the relay never parked", || relay.inner.parker.is_sleeping());
            work.store(round, Ordering::Release);
            bell.ring();
            assert_eq!(rx.recv_timeout(Duration::from_secs(30)), Ok(round));
        }
        // Not one unpark per round: an unpark that lands between the
        // relay's flag and its park leaves a token, its next park returns
        // at once, and a ring while it loops back finds it awake (it then
        // sees the ring's pending bit itself). Seen under a loaded test
        // run. The recv above is what fails if rings do not get through.
        assert!(relay.inner.unparks.load(Ordering::Relaxed) >= 1);
        work.store(u64::MAX, Ordering::Release);
        bell.ring();
        t.join().unwrap();
    }

    #[test]
    fn a_burst_wakes_every_helper_for_one_wake_up_of_the_relay() {
        let relay = WakeRelay::start(None).unwrap();
        let helpers: Vec<_> = (0..5)
            .map(|_| {
                let work = Arc::new(AtomicU64::new(0));
                let (parker, rx, t) = helper(Arc::clone(&work));
                (Doorbell::new(parker, Some(Arc::clone(&relay))), work, rx, t)
            })
            .collect();
        for (bell, ..) in &helpers {
            wait_until("a helper never parked", || bell.parker().is_sleeping());
        }
        wait_until("the relay never parked", || relay.inner.parker.is_sleeping());
        // Hold the relay at its first wake-up: it takes the lock to wake
        // the helpers, so it cannot park again while the burst rings.
        let held = relay.inner.targets.lock().unwrap();
        helpers[0].1.store(1, Ordering::Release);
        helpers[0].0.ring();
        wait_until("the relay never woke", || !relay.inner.parker.is_sleeping());
        for (bell, work, ..) in &helpers[1..] {
            work.store(1, Ordering::Release);
            bell.ring();
        }
        drop(held);
        for (_, _, rx, _) in &helpers {
            assert_eq!(rx.recv_timeout(Duration::from_secs(30)), Ok(1));
        }
        assert_eq!(
            relay.inner.unparks.load(Ordering::Relaxed),
            1,
            "the ringer woke the relay once for five helpers"
        );
        for (bell, work, _, t) in helpers {
            work.store(u64::MAX, Ordering::Release);
            bell.ring();
            t.join().unwrap();
        }
    }

    #[test]
    fn a_full_relay_rings_directly_and_a_dropped_doorbell_frees_its_slot() {
        let relay = WakeRelay::start(None).unwrap();
        let bells: Vec<Doorbell> = (0..RELAY_SLOTS)
            .map(|_| Doorbell::new(Arc::new(Parker::default()), Some(Arc::clone(&relay))))
            .collect();
        assert!(bells.iter().all(Doorbell::relayed));
        // One more: woken directly, and still woken.
        let work = Arc::new(AtomicU64::new(0));
        let (parker, rx, t) = helper(Arc::clone(&work));
        let direct = Doorbell::new(parker, Some(Arc::clone(&relay)));
        assert!(!direct.relayed());
        wait_until("the helper never parked", || direct.parker().is_sleeping());
        work.store(1, Ordering::Release);
        direct.ring();
        assert_eq!(rx.recv_timeout(Duration::from_secs(30)), Ok(1));
        drop(bells);
        let again = Doorbell::new(Arc::new(Parker::default()), Some(Arc::clone(&relay)));
        assert!(again.relayed(), "freed slots are reused");
        work.store(u64::MAX, Ordering::Release);
        direct.ring();
        t.join().unwrap();
    }

    #[test]
    fn a_primed_relay_is_awake_for_the_first_ring() {
        let relay = WakeRelay::start(None).unwrap();
        let work = Arc::new(AtomicU64::new(0));
        let (parker, rx, t) = helper(Arc::clone(&work));
        let bell = Doorbell::new(parker, Some(Arc::clone(&relay)));
        wait_until("the helper never parked", || bell.parker().is_sleeping());
        wait_until("the relay never parked", || relay.inner.parker.is_sleeping());
        relay.prime();
        wait_until("the primed relay never woke", || {
            relay.inner.primings.load(Ordering::Relaxed) >= 1
        });
        work.store(1, Ordering::Release);
        bell.ring();
        assert_eq!(rx.recv_timeout(Duration::from_secs(30)), Ok(1));
        // The ring may come after the linger on a slow machine; on time, it
        // made no wake-up of the relay.
        assert!(relay.inner.unparks.load(Ordering::Relaxed) <= 1);
        work.store(u64::MAX, Ordering::Release);
        bell.ring();
        t.join().unwrap();
    }

    #[test]
    fn dropping_the_relay_stops_its_thread() {
        let relay = WakeRelay::start(None).unwrap();
        wait_until("the relay never parked", || relay.inner.parker.is_sleeping());
        let start = Instant::now();
        drop(relay);
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "joined without waiting for its park"
        );
    }
}
