//! A helper thread that runs a piece of work on a fixed grid of times
//! (`start + k * period`) and can be paused and resumed.
//!
//! Why it exists: the metrics endpoint's sampler must cost nothing while
//! paused (the thread waits on a condition variable; no timer wakes it),
//! and a pause must return only once the work in progress has ended, so
//! that a caller measuring what the work costs (`weir bench --metrics-ab`)
//! can tell which stretch of time it belongs to. Grid points that pass
//! while paused are skipped, not made up at the resume: the work runs once
//! per period of unpaused time on average, however the pauses fall, and a
//! pattern of pauses cannot bunch the runs up.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// A thread running work periodically until dropped; see the module.
pub struct Periodic {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct Shared {
    /// Held for the whole of each run of the work.
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Default)]
struct State {
    stop: bool,
    paused: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Periodic {
    /// Starts a thread named `name` running `work` every `period`: at
    /// once unless `paused`, then at the points of the grid from now.
    pub fn spawn(
        name: &str,
        period: Duration,
        paused: bool,
        work: impl FnMut() + Send + 'static,
    ) -> std::io::Result<Periodic> {
        let shared = Arc::new(Shared::default());
        shared.lock().paused = paused;
        let s = Arc::clone(&shared);
        let thread = thread::Builder::new()
            .name(name.into())
            .spawn(move || run(&s, period, work))?;
        Ok(Periodic {
            shared,
            thread: Some(thread),
        })
    }

    /// Pauses (`true`) or resumes (`false`) the work; returns once a run in
    /// progress has ended, so nothing of it runs after a pause returns.
    /// Resumed, the next run is at the next point of the grid.
    pub fn pause(&self, paused: bool) {
        self.shared.lock().paused = paused;
        self.shared.wake.notify_all();
    }
}

impl Drop for Periodic {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(shared: &Shared, period: Duration, mut work: impl FnMut()) {
    let origin = Instant::now();
    let mut next = origin;
    let mut g = shared.lock();
    loop {
        if g.stop {
            return;
        }
        if g.paused {
            g = shared.wake.wait(g).unwrap_or_else(|p| p.into_inner());
            next = grid_after(origin, Instant::now(), period);
            continue;
        }
        let now = Instant::now();
        if now < next {
            g = shared
                .wake
                .wait_timeout(g, next - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            continue;
        }
        // With the lock held: `pause` waits for this run to end.
        work();
        next = grid_after(origin, Instant::now(), period);
    }
}

/// The first point of the grid `origin + k * period` after `now`.
fn grid_after(origin: Instant, now: Instant, period: Duration) -> Instant {
    let k = now.saturating_duration_since(origin).as_nanos() / period.as_nanos().max(1) + 1;
    origin + period * u32::try_from(k).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
        let t0 = Instant::now();
        while !ok() {
            assert!(t0.elapsed() < Duration::from_secs(30), "timed out waiting for {what}");
            thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn paused_work_does_not_run_and_resumes() {
        let period = Duration::from_millis(200);
        let count = Arc::new(AtomicU64::new(0));
        let c = Arc::clone(&count);
        let p = Periodic::spawn("periodic-test", period, true, move || {
            c.fetch_add(1, Ordering::Relaxed);
        })
        .unwrap();
        // Paused from the start: not even the first run.
        thread::sleep(period * 3);
        assert_eq!(count.load(Ordering::Relaxed), 0);
        p.pause(false);
        wait_for("runs after resuming", || count.load(Ordering::Relaxed) >= 2);
        // The pause holds the lock: no run is in progress after it.
        p.pause(true);
        let at_pause = count.load(Ordering::Relaxed);
        thread::sleep(period * 3);
        assert_eq!(count.load(Ordering::Relaxed), at_pause);
        drop(p);
    }

    #[test]
    fn unpaused_it_runs_at_once() {
        let count = Arc::new(AtomicU64::new(0));
        let c = Arc::clone(&count);
        let p = Periodic::spawn("periodic-test", Duration::from_secs(3600), false, move || {
            c.fetch_add(1, Ordering::Relaxed);
        })
        .unwrap();
        wait_for("the first run", || count.load(Ordering::Relaxed) == 1);
        // Dropping ends the thread even in a long wait.
        drop(p);
        assert_eq!(count.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn the_grid_skips_the_points_that_passed() {
        let o = Instant::now();
        let p = Duration::from_millis(100);
        assert_eq!(grid_after(o, o, p), o + p);
        assert_eq!(grid_after(o, o + Duration::from_millis(99), p), o + p);
        assert_eq!(grid_after(o, o + Duration::from_millis(100), p), o + 2 * p);
        assert_eq!(grid_after(o, o + Duration::from_millis(1234), p), o + 13 * p);
    }
}
