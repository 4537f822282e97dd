//! A thread of a sink's own for its blocking calls, so that no worker ever
//! waits for the disk.
//!
//! A worker runs many tasks in turn and must never block: a `write` or an
//! `fsync` on a worker stalls every record of every task on that core for
//! as long as the disk takes (milliseconds, at the tail). A sink that
//! writes files or a database hands that work to an [`IoThread`]: the
//! worker submits requests (a buffer to append, a sync, a commit) and goes
//! on; the thread handles them one at a time, in order, with the sink's
//! [`IoHandler`], and hands each reply back. The sink takes the replies at
//! its next call ([`IoThread::try_reply`]), typically in
//! [`crate::Sink::ready`], which also tells the runtime when the sink has
//! too much in flight: the task then stops reading input, exactly like a
//! producer in front of a full ring (backpressure, never drop).
//!
//! Contract:
//! - **In order.** Requests are handled in submission order, replies come
//!   back in that order, and each request gets a [`Ticket`] (1, 2, 3, ...);
//!   request `t` is complete once [`IoThread::done`] is at least `t`.
//! - **Bounded.** At most `capacity` requests are in flight (submitted, and
//!   their reply not yet taken). A sink bounds its own data requests below
//!   that (its `ready` says false first), so that requests the runtime
//!   cannot refuse (a barrier's sync, a commit) always fit; only if
//!   `capacity` of them pile up does [`IoThread::submit`] wait, for the
//!   oldest reply, as the last resort of a bounded queue.
//! - **Failure is final.** The first request that fails (or panics) stops
//!   the thread: it handles nothing more, every later call on this side
//!   returns the error (naming the thread and the request that failed), and
//!   every waiter for a later ticket gets it too. The task then fails and
//!   the job restarts from its last completed checkpoint, which is what an
//!   exactly-once sink needs: an I/O error is never retried blindly (after
//!   a failed `fsync` the kernel may have dropped the data).
//! - **Wake-ups.** With a [`Waker`] set ([`IoThread::set_waker`], from
//!   [`crate::SinkContext::waker`]), every completion wakes the sink's
//!   worker if it parked, so replies are taken within microseconds, not at
//!   the next park timeout.
//! - **Naps.** With [`IoThread::set_nap`]`(d)`, a thread that runs out
//!   of requests naps until `d` after the last request was submitted
//!   before it parks, and does not count as parked meanwhile: a request
//!   submitted during the nap costs the submitter no wake-up (a fence and
//!   a load) and waits at most until the nap ends. A sink that hands work
//!   over on a period (the direct sink's flush interval) sets `d` a little
//!   longer than the period: the next hand-over then comes during the nap,
//!   in steady state its worker never makes the `futex` call of a wake-up,
//!   and a request waits at most the margin. The nap is timed from the
//!   submission, not from the end of the last request, or the submitter
//!   (which hands over the next request once the last one's reply came)
//!   would fall into step behind the thread's naps. An idle sink's thread
//!   naps once and then parks. Without a nap (the default) the thread
//!   parks at once. A request off the period (a barrier's) is followed by
//!   [`IoThread::wake`], which cuts the nap short.
//! - **Durability waits off the worker.** [`IoThread::completion`] gives a
//!   job that waits for a ticket: return it as a sink's
//!   [`crate::PreCommit`] job and the runtime acknowledges the checkpoint
//!   only after the request (say, an `fsync`) completed, waiting on the
//!   snapshot pool instead of the worker.
//! - **Placement.** The thread runs on the job's helper cores (see
//!   [`crate::HelperPlacement`]): those of the thread that spawns it.
//! - **Drop** stops the thread after the request it is handling (those
//!   still queued are dropped unhandled, as a crash would) and joins it, so
//!   no I/O of a failed attempt overlaps with the restore of the next one.
//!
//! No allocation and no lock on the worker per request: requests go
//! through a lock-free single-producer ring ([`rtrb`]) of `capacity`
//! slots, and the worker wakes the thread only if it parked (a fence and a
//! load otherwise, the protocol of the workers' own parking), and then
//! through the job's wake-up relay (`core/src/relay.rs`: one wake-up of the
//! relay thread covers a burst of them across sinks); replies come
//! back through a bounded channel the worker polls without blocking. A
//! channel with a lock on its wake-up path (the standard library's
//! `sync_channel` locks a mutex to wake a receiver that sleeps) made the
//! worker wait for that lock while the I/O thread, on another core, held
//! it: `strace` of a worker under the two-phase file sink showed 9 such
//! waits in one second, of 0.6-0.9 ms each (strace slows what it traces),
//! and none in 9 s with the ring. A completion costs the I/O thread a
//! short lock and, only if someone waits, a wake-up.
//!
//! ```
//! use weir_core::io_thread::{IoHandler, IoThread};
//! use weir_core::BoxError;
//!
//! /// Appends buffers to a file; hands each buffer back for reuse.
//! struct Appender(std::fs::File);
//!
//! impl IoHandler for Appender {
//!     type Request = Vec<u8>;
//!     type Reply = Vec<u8>;
//!     fn handle(&mut self, mut buf: Vec<u8>) -> Result<Vec<u8>, BoxError> {
//!         use std::io::Write;
//!         self.0.write_all(&buf)?;
//!         buf.clear();
//!         Ok(buf)
//!     }
//! }
//!
//! let dir = tempfile::tempdir().unwrap();
//! let file = std::fs::File::create(dir.path().join("out")).unwrap();
//! let mut io = IoThread::spawn("doc-appender", Appender(file), 4).unwrap();
//! let ticket = io.submit(b"hello\n".to_vec()).unwrap();
//! io.wait_for(ticket).unwrap();
//! let buf = io.try_reply().unwrap().expect("the reply of a completed request");
//! assert!(buf.is_empty() && buf.capacity() >= 6);
//! assert_eq!(std::fs::read(dir.path().join("out")).unwrap(), b"hello\n");
//! ```

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::BoxError;
use crate::threads::idle::{Parker, Waker};
use crate::threads::relay::Doorbell;

/// The longest nap [`IoThread::set_nap`] takes: 10 ms. A request that
/// comes during a nap waits for its end, so a nap is a latency the sink
/// chooses, bounded here; longer idle waits are parks, which a submit
/// cuts short.
pub const MAX_NAP: Duration = Duration::from_millis(10);

/// The position of a request in submission order: 1 for the first.
pub type Ticket = u64;

/// What an [`IoThread`] runs: owns the files or connections, handles one
/// request at a time.
pub trait IoHandler: Send + 'static {
    /// What the sink asks for.
    type Request: Send + 'static;
    /// What comes back (buffers to reuse, times, results).
    type Reply: Send + 'static;

    /// Handles one request. An error stops the thread for good (see the
    /// module docs): return one only for what must fail the task.
    fn handle(&mut self, request: Self::Request) -> Result<Self::Reply, BoxError>;
}

/// Progress of the thread, shared with waiters.
#[derive(Debug, Default)]
struct Progress {
    /// Requests completed (replies sent).
    done: u64,
    /// Why the thread stopped on a failed request.
    failed: Option<Arc<str>>,
    /// The thread has exited (failed, dropped, or its queue closed).
    exited: bool,
    /// Threads waiting on `changed`: a completion notifies only if any.
    waiting: usize,
}

#[derive(Debug, Default)]
struct Shared {
    progress: Mutex<Progress>,
    /// `progress.failed` is set: lets the worker's per-turn check skip the
    /// lock.
    failed: AtomicBool,
    changed: Condvar,
    /// Set by drop: handle nothing more.
    stop: AtomicBool,
    waker: OnceLock<Waker>,
    /// How long after a submission the thread naps before it parks, in
    /// nanoseconds (0: it parks at once). See [`IoThread::set_nap`].
    nap_ns: AtomicU64,
    /// When the last request was submitted ([`crate::clock`]), while
    /// naps are on.
    submitted_ns: AtomicU64,
    /// Times the thread parked, and naps it ended early for a request
    /// (tests).
    #[cfg(test)]
    parks: AtomicU64,
    #[cfg(test)]
    naps_cut: AtomicU64,
    /// Times the thread went to sleep in a nap (tests).
    #[cfg(test)]
    nap_sleeps: AtomicU64,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn update(&self, f: impl FnOnce(&mut Progress)) {
        let notify = {
            let mut p = self.lock();
            f(&mut p);
            p.waiting > 0
        };
        if notify {
            self.changed.notify_all();
        }
        if let Some(w) = self.waker.get() {
            w.wake();
        }
    }

    /// Records that the thread failed, and `why`: the sink reports it.
    fn fail(&self, why: String) {
        let why: Arc<str> = Arc::from(why);
        self.update(|p| {
            p.failed = Some(why);
            self.failed.store(true, Ordering::Release);
        });
    }

    /// Waits until `ticket` completed; the failure otherwise. `limit`
    /// bounds the wait (None: until the thread completes or stops).
    fn wait_for(&self, name: &str, ticket: Ticket, limit: Option<Duration>) -> Result<(), BoxError> {
        let deadline = limit.map(|l| std::time::Instant::now() + l);
        let mut p = self.lock();
        loop {
            if p.done >= ticket {
                return Ok(());
            }
            if let Some(why) = &p.failed {
                return Err(format!("{name}: {why}").into());
            }
            if p.exited {
                return Err(format!("{name}: the thread stopped before request {ticket} completed").into());
            }
            p.waiting += 1;
            p = match deadline {
                None => self.changed.wait(p).unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let left = d.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        p.waiting -= 1;
                        return Err(format!(
                            "{name}: request {ticket} did not complete within {:?} (completed: {})",
                            limit.unwrap_or_default(),
                            p.done
                        )
                        .into());
                    }
                    self.changed.wait_timeout(p, left).unwrap_or_else(|e| e.into_inner()).0
                }
            };
            p.waiting -= 1;
        }
    }
}

/// A sink's own thread for blocking calls; see the module docs.
pub struct IoThread<H: IoHandler> {
    name: Arc<str>,
    /// `None` once dropping.
    requests: Option<rtrb::Producer<H::Request>>,
    /// Wakes the thread when it parked for want of requests (through the
    /// job's wake-up relay, on a job's thread: see [`crate::threads::relay`]).
    doorbell: Doorbell,
    replies: Receiver<H::Reply>,
    /// Replies received while `submit` waited for room, not yet taken.
    backlog: VecDeque<H::Reply>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    capacity: usize,
    /// Requests submitted; the last ticket issued.
    submitted: u64,
    /// Replies received from the channel (taken, or in `backlog`).
    received: u64,
    /// Replies handed to the caller.
    taken: u64,
}

impl<H: IoHandler> std::fmt::Debug for IoThread<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoThread")
            .field("name", &self.name)
            .field("submitted", &self.submitted)
            .field("taken", &self.taken)
            .finish()
    }
}

impl<H: IoHandler> IoThread<H> {
    /// Starts thread `name` running `handler`, with at most `capacity`
    /// requests in flight (at least 1).
    pub fn spawn(name: &str, mut handler: H, capacity: usize) -> std::io::Result<Self> {
        assert!(capacity > 0, "an I/O thread needs room for at least one request");
        let (req_tx, mut req_rx) = rtrb::RingBuffer::<H::Request>::new(capacity);
        let (rep_tx, rep_rx) = mpsc::sync_channel::<H::Reply>(capacity);
        let shared = Arc::new(Shared::default());
        let s = Arc::clone(&shared);
        let parker = Arc::new(Parker::default());
        let park = Arc::clone(&parker);
        let label: Arc<str> = Arc::from(name);
        // On the job's helper cores, like every weir thread but the workers.
        let helpers = crate::threads::placement::current();
        let relay = crate::threads::relay::current();
        let thread = std::thread::Builder::new().name(name.to_string()).spawn(move || {
            crate::threads::placement::enter(helpers);
            serve(&mut handler, &mut req_rx, &rep_tx, &s, &park);
            s.update(|p| p.exited = true);
        })?;
        Ok(IoThread {
            name: label,
            requests: Some(req_tx),
            doorbell: Doorbell::new(parker, relay),
            replies: rep_rx,
            backlog: VecDeque::with_capacity(capacity),
            shared,
            thread: Some(thread),
            capacity,
            submitted: 0,
            received: 0,
            taken: 0,
        })
    }

    /// The thread's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Has the worker of the calling sink woken at every completion (set
    /// once; later calls are ignored).
    pub fn set_waker(&self, waker: Waker) {
        let _ = self.shared.waker.set(waker);
    }

    /// Has the thread, once out of requests, nap until `nap` after the
    /// last submission before it parks (see the module docs): requests
    /// that come within it cost the submitter no wake-up. At most
    /// [`MAX_NAP`]; zero turns naps off. Each submission then reads the
    /// clock once.
    ///
    /// # Panics
    ///
    /// If `nap` is over [`MAX_NAP`].
    pub fn set_nap(&self, nap: Duration) {
        assert!(nap <= MAX_NAP, "an I/O thread's nap of {nap:?} is over {MAX_NAP:?}");
        self.shared.nap_ns.store(nap.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Cuts the thread's nap short, if it naps ([`IoThread::set_nap`]), so
    /// that requests already submitted are handled now: for a request off
    /// the submitter's period (a barrier's, the end's), whose waiter should
    /// not wait for the nap to end. Goes through the job's wake-up relay
    /// like a submit's wake-up; a thread that is awake loops once more.
    pub fn wake(&self) {
        self.doorbell.ring_always();
    }

    /// The error the thread stopped with, if it failed.
    pub fn check(&self) -> Result<(), BoxError> {
        if !self.shared.failed.load(Ordering::Acquire) {
            return Ok(());
        }
        match &self.shared.lock().failed {
            None => Ok(()),
            Some(why) => Err(format!("{}: {why}", self.name).into()),
        }
    }

    /// Queues `request`; returns its ticket. Fails if the thread failed.
    /// Waits only when `capacity` requests are in flight (see the module
    /// docs), for the oldest one's reply.
    pub fn submit(&mut self, request: H::Request) -> Result<Ticket, BoxError> {
        self.check()?;
        while self.submitted - self.received >= self.capacity as u64 {
            // Last resort of the bound: wait for the oldest reply.
            match self.replies.recv_timeout(Duration::from_millis(100)) {
                Ok(reply) => {
                    self.backlog.push_back(reply);
                    self.received += 1;
                }
                Err(RecvTimeoutError::Timeout) => self.check()?,
                Err(RecvTimeoutError::Disconnected) => {
                    self.check()?;
                    return Err(format!("{}: the thread stopped", self.name).into());
                }
            }
        }
        let ring = self.requests.as_mut().expect("only drop closes the queue");
        if ring.is_abandoned() {
            self.check()?;
            return Err(format!("{}: the thread stopped", self.name).into());
        }
        if self.shared.nap_ns.load(Ordering::Relaxed) > 0 {
            // Before the push: the thread that pops it naps from here.
            self.shared
                .submitted_ns
                .store(crate::clock::now_ns(), Ordering::Relaxed);
        }
        // Never full: queued requests <= in flight < capacity = its slots.
        if ring.push(request).is_err() {
            unreachable!(
                "{}: request ring full with fewer than its capacity in flight",
                self.name
            );
        }
        self.doorbell.ring();
        self.submitted += 1;
        Ok(self.submitted)
    }

    /// The next reply, in order, if its request completed; the thread's
    /// error if it failed.
    pub fn try_reply(&mut self) -> Result<Option<H::Reply>, BoxError> {
        // A failure first: what completed before it no longer matters.
        self.check()?;
        if let Some(r) = self.backlog.pop_front() {
            self.taken += 1;
            return Ok(Some(r));
        }
        match self.replies.try_recv() {
            Ok(r) => {
                self.received += 1;
                self.taken += 1;
                Ok(Some(r))
            }
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => {
                self.check()?;
                Err(format!("{}: the thread stopped", self.name).into())
            }
        }
    }

    /// Requests submitted whose reply was not taken yet.
    pub fn in_flight(&self) -> usize {
        (self.submitted - self.taken) as usize
    }

    /// The last ticket issued (0 before the first request).
    pub fn last_ticket(&self) -> Ticket {
        self.submitted
    }

    /// Requests completed so far.
    pub fn done(&self) -> Ticket {
        self.shared.lock().done
    }

    /// Waits here until request `ticket` completed. Blocking: for restore,
    /// tools and tests, never on a worker (hand [`IoThread::completion`]
    /// to the runtime there).
    pub fn wait_for(&self, ticket: Ticket) -> Result<(), BoxError> {
        self.shared.wait_for(&self.name, ticket, None)
    }

    /// A job that waits until request `ticket` completed, and fails with
    /// the thread's error if it failed or stopped first: a
    /// [`crate::SyncJob`] for [`crate::PreCommit::with_sync`].
    pub fn completion(&self, ticket: Ticket) -> Box<dyn FnOnce() -> Result<(), crate::error::BoxError> + Send> {
        let shared = Arc::clone(&self.shared);
        let name = Arc::clone(&self.name);
        Box::new(move || shared.wait_for(&name, ticket, None))
    }
}

impl<H: IoHandler> Drop for IoThread<H> {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // Closing the queue ends the thread after the request in hand.
        self.requests = None;
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
        // Unblock a reply send, should the thread be in one.
        while self.replies.try_recv().is_ok() {}
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// An I/O thread's loop: hands each request to `handler` in order and
/// sends its reply back, until the thread is stopped, the sink's side is
/// gone, or a request fails; out of requests, it naps or parks.
fn serve<H: IoHandler>(
    handler: &mut H,
    req_rx: &mut rtrb::Consumer<H::Request>,
    rep_tx: &mpsc::SyncSender<H::Reply>,
    s: &Shared,
    park: &Parker,
) {
    park.register();
    let mut ticket = 0u64;
    // Napped since the last request: the next empty look parks.
    let mut napped = true;
    loop {
        if s.stop.load(Ordering::Acquire) {
            break;
        }
        let request = match req_rx.pop() {
            Ok(r) => r,
            // The sink's side is gone: nothing more will come.
            Err(_) if req_rx.is_abandoned() && req_rx.is_empty() => break,
            Err(_) => {
                let nap = s.nap_ns.load(Ordering::Relaxed);
                if !napped && nap > 0 {
                    napped = true;
                    // Not flagged as parked: a submit now rings no
                    // one, and the request is found after the nap.
                    // A leftover unpark (a ring that raced with an
                    // earlier park) returns early: nap again. Drop
                    // sets `stop` and unparks: that ends it.
                    nap_until(s, req_rx, s.submitted_ns.load(Ordering::Relaxed).saturating_add(nap));
                    continue;
                }
                #[cfg(test)]
                s.parks.fetch_add(1, Ordering::Relaxed);
                park.park_unless(|| !req_rx.is_empty() || req_rx.is_abandoned() || s.stop.load(Ordering::Acquire));
                continue;
            }
        };
        ticket += 1;
        napped = false;
        match catch_unwind(AssertUnwindSafe(|| handler.handle(request))) {
            Ok(Ok(reply)) => {
                // Never blocks: at most `capacity` replies are
                // unreceived (the other side's invariant).
                if rep_tx.send(reply).is_err() {
                    break;
                }
                s.update(|p| p.done = ticket);
            }
            Ok(Err(e)) => {
                s.fail(format!("request {ticket} failed: {e}"));
                break;
            }
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".into());
                s.fail(format!("request {ticket} panicked: {msg}"));
                break;
            }
        }
    }
}

/// Naps until `until` (clock ns): ends early when a request comes, the
/// sink's side is gone or the thread is stopped.
fn nap_until<R>(s: &Shared, req_rx: &rtrb::Consumer<R>, until: u64) {
    // (Tests count the naps a request cut short.)
    #[cfg(test)]
    let mut slept = false;
    loop {
        let now = crate::clock::now_ns();
        if now >= until || req_rx.is_abandoned() || s.stop.load(Ordering::Acquire) {
            break;
        }
        if !req_rx.is_empty() {
            #[cfg(test)]
            s.naps_cut.fetch_add(u64::from(slept), Ordering::Relaxed);
            break;
        }
        #[cfg(test)]
        s.nap_sleeps.fetch_add(1, Ordering::Relaxed);
        std::thread::park_timeout(Duration::from_nanos(until - now));
        #[cfg(test)]
        {
            slept = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Echoes numbers; fails on 13, panics on 666, sleeps on values >= 1000
    /// (value - 1000 ms).
    struct Echo(Arc<AtomicUsize>);

    impl IoHandler for Echo {
        type Request = u64;
        type Reply = u64;
        fn handle(&mut self, n: u64) -> Result<u64, BoxError> {
            self.0.fetch_add(1, Ordering::SeqCst);
            match n {
                13 => Err("unlucky".into()),
                666 => panic!("the beast"),
                n if n >= 1000 => {
                    std::thread::sleep(Duration::from_millis(n - 1000));
                    Ok(n)
                }
                n => Ok(n * 2),
            }
        }
    }

    fn echo(capacity: usize) -> (IoThread<Echo>, Arc<AtomicUsize>) {
        let handled = Arc::new(AtomicUsize::new(0));
        let io = IoThread::spawn("test-io", Echo(Arc::clone(&handled)), capacity).unwrap();
        (io, handled)
    }

    #[test]
    fn a_submit_wakes_a_parked_thread() {
        let (mut io, handled) = echo(4);
        for round in 1..=12u64 {
            // Let the thread run out of requests and park (its park lasts a
            // minute in tests): only the submit's wake-up gets it going.
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while !io.doorbell.parker().is_sleeping() {
                assert!(std::time::Instant::now() < deadline, "the thread never parked");
                std::thread::yield_now();
            }
            let t = io.submit(round).unwrap();
            io.shared
                .wait_for("test-io", t, Some(Duration::from_secs(30)))
                .expect("a parked thread is woken by the submit");
            assert_eq!(io.try_reply().unwrap(), Some(2 * round), "round {round}");
        }
        assert_eq!(handled.load(Ordering::SeqCst), 12);
    }

    /// A submitter that hands over a request every period, with the nap
    /// a little longer than the period (the direct sink's use): each
    /// request comes while the thread naps, so the thread does not park
    /// between them. Without a nap it parks after every request.
    #[test]
    fn a_napping_thread_finds_periodic_requests_without_parking() {
        const ROUNDS: u64 = 40;
        const PERIOD: Duration = Duration::from_millis(2);
        let parks = |nap: Duration| {
            let (mut io, _) = echo(4);
            io.set_nap(nap);
            let start = std::time::Instant::now();
            // (Past 13, which the echo handler fails.)
            for (k, n) in (100..100 + ROUNDS).enumerate() {
                let t = io.submit(n).unwrap();
                io.wait_for(t).unwrap();
                assert_eq!(io.try_reply().unwrap(), Some(2 * n), "request {n}");
                // The next request one period after this one was due.
                let next = start + PERIOD * (k as u32 + 1);
                std::thread::sleep(next.saturating_duration_since(std::time::Instant::now()));
            }
            io.shared.parks.load(Ordering::Relaxed)
        };
        // A millisecond of margin; a quarter of the rounds allows for a
        // test thread descheduled that long on a loaded machine.
        let napping = parks(PERIOD + Duration::from_millis(1));
        assert!(
            napping <= ROUNDS / 4,
            "parked {napping} times in {ROUNDS} rounds with naps"
        );
        let parking = parks(Duration::ZERO);
        assert!(
            parking >= ROUNDS / 2,
            "parked only {parking} times in {ROUNDS} rounds without naps"
        );
    }

    /// `wake` cuts a nap short: a request submitted during the nap is
    /// handled when the wake comes, not at the nap's end. Without the wake
    /// the nap runs out (a second's nap would, in a test: here 10 ms).
    #[test]
    fn wake_cuts_a_nap_short() {
        for wake in [true, false] {
            let (mut io, _) = echo(4);
            io.set_nap(MAX_NAP);
            let t = io.submit(100).unwrap();
            io.wait_for(t).unwrap();
            // Once the thread sleeps in its nap (until MAX_NAP after that
            // submission), the next request comes.
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while io.shared.nap_sleeps.load(Ordering::Relaxed) == 0 {
                assert!(std::time::Instant::now() < deadline, "the thread never napped");
                std::thread::yield_now();
            }
            let t = io.submit(101).unwrap();
            if wake {
                io.wake();
            }
            io.wait_for(t).unwrap();
            assert_eq!(io.try_reply().unwrap(), Some(200));
            assert_eq!(io.try_reply().unwrap(), Some(202));
            let cut = io.shared.naps_cut.load(Ordering::Relaxed);
            assert_eq!(cut, u64::from(wake), "naps cut short, with wake {wake}");
        }
    }

    #[test]
    #[should_panic(expected = "over")]
    fn a_nap_is_bounded() {
        let (io, _) = echo(1);
        io.set_nap(MAX_NAP + Duration::from_nanos(1));
    }

    #[test]
    fn requests_are_handled_in_order_and_bounded() {
        let (mut io, _) = echo(3);
        let tickets: Vec<Ticket> = (1..=3).map(|n| io.submit(n).unwrap()).collect();
        assert_eq!(tickets, vec![1, 2, 3]);
        assert_eq!(io.in_flight(), 3);
        // Full: the fourth waits for the oldest reply, which goes to the backlog.
        assert_eq!(io.submit(4).unwrap(), 4);
        io.wait_for(4).unwrap();
        let replies: Vec<u64> = std::iter::from_fn(|| io.try_reply().unwrap()).collect();
        assert_eq!(replies, vec![2, 4, 6, 8]);
        assert_eq!(io.in_flight(), 0);
        assert_eq!(io.done(), 4);
    }

    #[test]
    fn a_failure_is_final_and_reaches_every_waiter() {
        let (mut io, handled) = echo(8);
        io.submit(1).unwrap();
        let bad = io.submit(13).unwrap();
        // The thread may have failed request 2 already, and then the next
        // submit says so; otherwise the later request's completion does.
        let err = match io.submit(2) {
            Ok(later) => {
                let job = io.completion(later);
                job().unwrap_err().to_string()
            }
            Err(e) => e.to_string(),
        };
        assert!(
            err.contains("test-io") && err.contains("request 2 failed: unlucky"),
            "{err}"
        );
        assert!(io.wait_for(bad).is_err());
        assert!(io.wait_for(1).is_ok(), "completed before the failure");
        // Nothing after the failure was handled, and every call now fails.
        assert_eq!(handled.load(Ordering::SeqCst), 2);
        assert!(io.submit(3).is_err());
        assert!(io.try_reply().is_err());
    }

    #[test]
    fn a_panic_fails_the_thread_with_its_message() {
        let (mut io, _) = echo(2);
        let t = io.submit(666).unwrap();
        let err = io.wait_for(t).unwrap_err().to_string();
        assert!(err.contains("panicked: the beast"), "{err}");
        assert!(io.check().is_err());
    }

    #[test]
    fn completion_jobs_wait_off_thread_and_wake_the_worker() {
        let (mut io, _) = echo(4);
        let parker = Arc::new(crate::threads::idle::Parker::default());
        io.set_waker(Waker::new(Some(Arc::clone(&parker))));
        let t = io.submit(1050).unwrap();
        let job = io.completion(t);
        let waiter = std::thread::spawn(job);
        assert_eq!(io.try_reply().unwrap(), None, "not done yet");
        waiter.join().unwrap().unwrap();
        assert_eq!(io.try_reply().unwrap(), Some(1050));
    }

    #[test]
    fn drop_stops_after_the_request_in_hand_and_releases_waiters() {
        let (mut io, handled) = echo(8);
        io.submit(1100).unwrap();
        let queued = io.submit(1).unwrap();
        let job = io.completion(queued);
        let start = std::time::Instant::now();
        // Wait until the slow request is being handled.
        while handled.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        drop(io);
        assert!(start.elapsed() < Duration::from_secs(5));
        assert_eq!(
            handled.load(Ordering::SeqCst),
            1,
            "the queued request was dropped unhandled"
        );
        let err = job().unwrap_err().to_string();
        assert!(err.contains("stopped before request 2"), "{err}");
    }

    #[test]
    fn a_bounded_wait_reports_how_far_it_got() {
        let (mut io, _) = echo(2);
        let t = io.submit(1300).unwrap();
        let err = io
            .shared
            .wait_for("test-io", t, Some(Duration::from_millis(20)))
            .unwrap_err()
            .to_string();
        assert!(err.contains("did not complete within"), "{err}");
        io.wait_for(t).unwrap();
    }
}
