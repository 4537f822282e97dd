//! Named fault points for crash tests.
//!
//! Durable steps call [`hit`] with a point name. Tests arm a point with
//! `arm` to make its next hits fail with an I/O error, or to abort the
//! process (simulating a crash between two durable steps). Unarmed, a hit is
//! one relaxed atomic load: nothing armed, nothing to look up.
//!
//! Arming exists only with the cargo feature `fault-injection` (the tests
//! and CI turn it on): in a default build [`hit`] always passes and
//! [`arm_from_env`] arms nothing, so no environment variable can make a
//! production build fail or abort.
//!
//! Since every durable step passes a fault point, they also tell where I/O
//! runs: with [`forbid_on_workers`] on, a point hit on a worker thread fails
//! like an armed one, naming the point and the thread, which is how tests
//! show that no sink waits for the disk on a worker.

#[cfg(any(test, feature = "fault-injection"))]
use std::collections::HashMap;
#[cfg(any(test, feature = "fault-injection"))]
use std::sync::atomic::{AtomicBool, Ordering};
#[cfg(any(test, feature = "fault-injection"))]
use std::sync::Mutex;

#[cfg(any(test, feature = "fault-injection"))]
static ANY_ARMED: AtomicBool = AtomicBool::new(false);
#[cfg(any(test, feature = "fault-injection"))]
static FORBID_ON_WORKERS: AtomicBool = AtomicBool::new(false);
#[cfg(any(test, feature = "fault-injection"))]
static POINTS: Mutex<Option<HashMap<String, Action>>> = Mutex::new(None);

#[cfg(any(test, feature = "fault-injection"))]
/// What an armed fault point does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Fail the next `n` hits with an I/O error.
    Fail(u32),
    /// Skip `n` hits, then abort the process (a crash).
    AbortAfter(u32),
    /// Skip `n` hits, then fail the next one with an I/O error.
    FailAfter(u32),
    /// Sleep this many microseconds at every hit (a slow disk), then go on.
    Sleep(u32),
}

#[cfg(any(test, feature = "fault-injection"))]
/// Arms fault point `name` (process-wide).
pub fn arm(name: &str, action: Action) {
    let mut p = POINTS.lock().unwrap_or_else(|e| e.into_inner());
    p.get_or_insert_with(HashMap::new).insert(name.to_string(), action);
    ANY_ARMED.store(true, Ordering::Release);
}

#[cfg(any(test, feature = "fault-injection"))]
/// Disarms every fault point.
pub fn disarm_all() {
    let mut p = POINTS.lock().unwrap_or_else(|e| e.into_inner());
    *p = None;
    ANY_ARMED.store(false, Ordering::Release);
}

#[cfg(any(test, feature = "fault-injection"))]
/// Makes every fault point hit on a worker thread fail (process-wide)
/// while `on`: durable steps belong on a sink's own thread (see
/// [`crate::threads::io_thread`]). Also set by the environment variable
/// `WEIR_FORBID_WORKER_IO=1` through [`arm_from_env`].
pub fn forbid_on_workers(on: bool) {
    FORBID_ON_WORKERS.store(on, Ordering::Release);
}

#[cfg(any(test, feature = "fault-injection"))]
/// Arms the points listed in the environment variable `WEIR_FAULTS`
/// (`name=fail:N`, `name=fail-after:N`, `name=abort-after:N` or
/// `name=sleep-us:N`,
/// comma-separated); used by
/// crash tests that run the `weir` program as a child process.
pub fn arm_from_env() {
    if std::env::var("WEIR_FORBID_WORKER_IO").is_ok_and(|v| v == "1") {
        forbid_on_workers(true);
    }
    let Ok(spec) = std::env::var("WEIR_FAULTS") else {
        return;
    };
    for item in spec.split(',').filter(|s| !s.is_empty()) {
        let Some((name, action)) = item.split_once('=') else {
            continue;
        };
        let action = match action.split_once(':') {
            Some(("fail", n)) => n.parse().ok().map(Action::Fail),
            Some(("abort-after", n)) => n.parse().ok().map(Action::AbortAfter),
            Some(("fail-after", n)) => n.parse().ok().map(Action::FailAfter),
            Some(("sleep-us", n)) => n.parse().ok().map(Action::Sleep),
            _ => None,
        };
        if let Some(a) = action {
            arm(name, a);
        }
    }
}

/// Without the `fault-injection` feature: arms nothing. If `WEIR_FAULTS` or
/// `WEIR_FORBID_WORKER_IO` is set, says (as a warning) that it is ignored.
#[cfg(not(any(test, feature = "fault-injection")))]
pub fn arm_from_env() {
    for var in ["WEIR_FAULTS", "WEIR_FORBID_WORKER_IO"] {
        if std::env::var_os(var).is_some() {
            tracing::warn!(
                "{var} is set but ignored: this build has no fault injection (cargo feature fault-injection)"
            );
        }
    }
}

/// Passes through fault point `name`: always `Ok` in a build without the
/// `fault-injection` feature.
#[cfg(not(any(test, feature = "fault-injection")))]
#[inline(always)]
pub fn hit(_name: &str) -> std::io::Result<()> {
    Ok(())
}

#[cfg(any(test, feature = "fault-injection"))]
/// Passes through fault point `name`.
#[inline]
pub fn hit(name: &str) -> std::io::Result<()> {
    if FORBID_ON_WORKERS.load(Ordering::Acquire) && crate::threads::placement::on_worker_thread() {
        let thread = std::thread::current();
        return Err(std::io::Error::other(format!(
            "fault point {name} was hit on worker thread {}: a durable step ran on a worker \
             instead of the sink's own thread",
            thread.name().unwrap_or("?")
        )));
    }
    if !ANY_ARMED.load(Ordering::Acquire) {
        return Ok(());
    }
    let mut p = POINTS.lock().unwrap_or_else(|e| e.into_inner());
    let Some(action) = p.as_mut().and_then(|m| m.get_mut(name)) else {
        return Ok(());
    };
    match action {
        Action::Fail(0) => Ok(()),
        Action::Fail(n) => {
            *n -= 1;
            Err(std::io::Error::other(format!("injected fault at {name}")))
        }
        Action::AbortAfter(0) => {
            eprintln!("weir: injected crash at fault point {name}");
            std::process::abort()
        }
        Action::AbortAfter(n) => {
            *n -= 1;
            Ok(())
        }
        Action::FailAfter(0) => {
            *action = Action::Fail(0);
            Err(std::io::Error::other(format!("injected fault at {name}")))
        }
        Action::FailAfter(n) => {
            *n -= 1;
            Ok(())
        }
        Action::Sleep(us) => {
            let d = std::time::Duration::from_micros(u64::from(*us));
            drop(p);
            std::thread::sleep(d);
            Ok(())
        }
    }
}
