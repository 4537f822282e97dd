//! Where weir's own threads run besides the workers: the job thread (with
//! the checkpoint coordinator), the snapshot pool, and sinks' I/O threads.
//!
//! Every microsecond one of those threads runs on a worker's core is a
//! microsecond the worker's records wait: on a 2-core machine with two
//! pinned workers, a coordinator writing a manifest or a sink's thread
//! waking for a write preempts a worker, and a checkpoint every 10 ms
//! turns that into milliseconds at the tail of processing latency. Given
//! cores no worker uses, weir keeps its helpers there
//! ([`HelperPlacement::SpareCores`], the default), so the workers' cores
//! run workers only; with a worker on every core, helpers float where the
//! operating system puts them.
//!
//! The chosen cores follow the threads that spawn others: worker threads
//! and the job thread carry them in a thread-local, and
//! [`crate::threads::io_thread::IoThread::spawn`] pins a new sink thread to the
//! cores of the thread that spawns it, so a user's sink gets the same
//! placement without asking.

use std::cell::RefCell;
use std::sync::Arc;

use crate::{Error, Result};

/// Where weir's helper threads (job thread, snapshot pool, sinks' I/O
/// threads) run; see the module docs.
///
/// ```
/// use weir_core::{HelperPlacement, RuntimeConfig};
/// // Two workers, and weir's other threads on core 2 (of at least 3).
/// let cfg = RuntimeConfig {
///     workers: 2,
///     helpers: HelperPlacement::Cores(vec![2]),
///     ..RuntimeConfig::default()
/// };
/// # let _ = cfg;
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum HelperPlacement {
    /// On the cores no worker is pinned to, if there are any (fewer workers
    /// than cores, workers pinned); otherwise anywhere. The default.
    #[default]
    SpareCores,
    /// Anywhere: the operating system decides.
    Unpinned,
    /// On these core ids (as `core_affinity` numbers them).
    Cores(Vec<usize>),
}

/// The cores a job's helper threads are pinned to (`None`: unpinned).
pub(crate) type HelperCores = Option<Arc<[usize]>>;

/// The helper cores of a job: see [`HelperPlacement`].
pub(crate) fn helper_cores(
    placement: &HelperPlacement,
    workers: usize,
    pin_workers: bool,
    cores: &[usize],
) -> Result<HelperCores> {
    match placement {
        HelperPlacement::Unpinned => Ok(None),
        HelperPlacement::Cores(list) => {
            if list.is_empty() {
                return Err(Error::config(
                    "helpers",
                    "[]",
                    "an empty core list: use HelperPlacement::Unpinned to let the system place them",
                ));
            }
            if list.iter().any(|c| !cores.contains(c)) {
                return Err(Error::config(
                    "helpers",
                    format!("{list:?}"),
                    "lists a core this process may not run on (see core_affinity::get_core_ids)",
                ));
            }
            Ok(Some(list.clone().into()))
        }
        HelperPlacement::SpareCores => {
            if !pin_workers || cores.is_empty() || workers >= cores.len() {
                return Ok(None);
            }
            // Worker `w` runs on `cores[w mod cores]` (see `spawn_workers`).
            let spare: Vec<usize> = cores[workers..].to_vec();
            Ok(Some(spare.into()))
        }
    }
}

thread_local! {
    /// The helper cores of the job this thread belongs to.
    static CURRENT: RefCell<HelperCores> = const { RefCell::new(None) };
}

/// Marks the calling thread as one of a job's threads with these helper
/// cores (threads it spawns through weir follow them).
pub(crate) fn set_current(cores: HelperCores) {
    CURRENT.with(|c| *c.borrow_mut() = cores);
}

/// The helper cores of the calling thread's job.
pub(crate) fn current() -> HelperCores {
    CURRENT.with(|c| c.borrow().clone())
}

/// Pins the calling thread to `cores` and makes them its helper cores;
/// `None` leaves it where it is. Best effort, like the workers' pinning: a
/// refusal leaves the thread unpinned.
pub(crate) fn enter(cores: HelperCores) {
    if let Some(list) = &cores {
        let _ = pin_current(list);
    }
    set_current(cores);
}

/// Restricts the calling thread to `cores`.
fn pin_current(cores: &[usize]) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid, empty set (it is plain bits).
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let limit = 8 * std::mem::size_of::<libc::cpu_set_t>();
    for &c in cores.iter().filter(|&&c| c < limit) {
        // SAFETY: `c` is below the set's capacity in bits (checked above)
        // and `set` is a valid cpu_set_t owned here.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 is the
    // calling thread. The call only reads `set`.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The cores the calling thread may run on (for tests).
#[cfg(test)]
fn allowed_cores() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid, empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    assert_eq!(rc, 0, "sched_getaffinity");
    (0..8 * std::mem::size_of::<libc::cpu_set_t>())
        // SAFETY: `c` is below the set's capacity in bits.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

thread_local! {
    /// Set on worker threads for their whole life.
    static ON_WORKER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the calling thread is one of weir's worker threads, which must
/// never wait for I/O (see [`crate::threads::io_thread`]).
pub fn on_worker_thread() -> bool {
    ON_WORKER.with(|w| w.get())
}

/// Marks the calling thread as a worker thread for the rest of its life.
pub(crate) fn mark_worker_thread() {
    ON_WORKER.with(|w| w.set(true));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spare_cores_are_those_no_worker_uses() {
        let cores = [0, 1, 2, 3];
        let p = HelperPlacement::SpareCores;
        assert_eq!(helper_cores(&p, 3, true, &cores).unwrap().as_deref(), Some(&[3][..]));
        assert_eq!(
            helper_cores(&p, 1, true, &cores).unwrap().as_deref(),
            Some(&[1, 2, 3][..])
        );
        assert_eq!(helper_cores(&p, 4, true, &cores).unwrap(), None, "no spare core");
        assert_eq!(helper_cores(&p, 6, true, &cores).unwrap(), None, "workers share cores");
        assert_eq!(helper_cores(&p, 1, false, &cores).unwrap(), None, "workers not pinned");
        assert_eq!(helper_cores(&HelperPlacement::Unpinned, 1, true, &cores).unwrap(), None);
        let listed = HelperPlacement::Cores(vec![0, 2]);
        assert_eq!(
            helper_cores(&listed, 4, true, &cores).unwrap().as_deref(),
            Some(&[0, 2][..])
        );
        for bad in [vec![], vec![7]] {
            let e = helper_cores(&HelperPlacement::Cores(bad), 1, true, &cores)
                .unwrap_err()
                .to_string();
            assert!(e.contains("helpers"), "{e}");
        }
    }

    #[test]
    fn entering_pins_the_thread_and_is_inherited_through_the_thread_local() {
        let first = *core_affinity::get_core_ids()
            .unwrap_or_default()
            .first()
            .map(|c| &c.id)
            .unwrap_or(&0);
        std::thread::spawn(move || {
            let cores: HelperCores = Some(vec![first].into());
            enter(cores.clone());
            assert_eq!(allowed_cores(), vec![first]);
            assert_eq!(current(), cores);
        })
        .join()
        .unwrap();
        assert_eq!(current(), None, "other threads are not affected");
    }
}
