//! What a failed sink instance leaves its replacement when one subtask
//! recovers alone (dedup mode).
//!
//! Under dedup the job thread drops a failed task's chain and then
//! restores its replacement, in the same process, with the disk and its
//! page cache as the failed instance left them. The failed instance may
//! know then what its files only tell after a slow read: the WAL sink
//! knows which epochs it published since its lazy commit record and where
//! they end in its log, which a restore otherwise finds by reading back a
//! second of log. It [`leave`]s that as it is dropped; the replacement's
//! restore [`take`]s it, and checks it against what is on disk before it
//! relies on it (a hint never replaces a check, it only saves a read).
//!
//! Only within one such recovery, on the job thread ([`Carried::enter`]):
//! anywhere else `leave` drops the value and `take` finds nothing, so a
//! whole-job restart or a new process reads everything from disk as
//! before, and nothing left outlives the recovery it was left for.
//!
//! ```
//! use std::path::Path;
//! // Outside a recovery nothing is carried.
//! weir_core::carry::leave(Path::new("/wal/subtask-000"), 42u64);
//! assert_eq!(weir_core::carry::take::<u64>(Path::new("/wal/subtask-000")), None);
//! ```

use std::any::Any;
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

type Left = HashMap<PathBuf, Box<dyn Any + Send>>;

thread_local! {
    /// The values left in the recovery this thread is in, if any.
    static SCOPE: RefCell<Option<Left>> = const { RefCell::new(None) };
}

/// What was left in one recovery: the job thread holds it from the failed
/// chain's drop to its replacement's restore, and drops it after. Public
/// so that a sink's tests can play a recovery:
///
/// ```
/// use std::path::Path;
/// use weir_core::carry::{self, Carried};
/// let mut recovery = Carried::default();
/// recovery.enter(|| carry::leave(Path::new("/wal/subtask-000"), 42u64)); // the failed instance's drop
/// let left = recovery.enter(|| carry::take::<u64>(Path::new("/wal/subtask-000"))); // its replacement's restore
/// assert_eq!(left, Some(42));
/// ```
#[derive(Default)]
pub struct Carried(Left);

impl std::fmt::Debug for Carried {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

impl Carried {
    /// Runs `f` with this recovery's values reachable through [`leave`]
    /// and [`take`] on this thread (also when `f` panics, they are put
    /// back).
    pub fn enter<R>(&mut self, f: impl FnOnce() -> R) -> R {
        struct Restore<'a>(&'a mut Left);
        impl Drop for Restore<'_> {
            fn drop(&mut self) {
                if let Some(left) = SCOPE.with(|s| s.borrow_mut().take()) {
                    *self.0 = left;
                }
            }
        }
        let map = std::mem::take(&mut self.0);
        SCOPE.with(|s| *s.borrow_mut() = Some(map));
        let _restore = Restore(&mut self.0);
        f()
    }
}

/// Leaves `value` under `key` (the sink's own folder: one per subtask)
/// for the replacement of the instance being dropped; dropped at once
/// outside a recovery. A value left earlier under `key` is replaced.
pub fn leave<T: Any + Send>(key: &Path, value: T) {
    SCOPE.with(|s| {
        if let Some(left) = s.borrow_mut().as_mut() {
            left.insert(key.to_path_buf(), Box::new(value));
        }
    });
}

/// Takes what the failed instance left under `key`, if this runs in its
/// recovery and it left a `T`.
pub fn take<T: Any + Send>(key: &Path) -> Option<T> {
    SCOPE.with(|s| {
        let mut s = s.borrow_mut();
        let value = s.as_mut()?.remove(key)?;
        value.downcast::<T>().ok().map(|b| *b)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_left_in_a_recovery_reaches_its_replacement_once() {
        let key = Path::new("/wal/subtask-001");
        let mut carried = Carried::default();
        carried.enter(|| leave(key, 7u64));
        // Between the drop and the restore, outside: not reachable.
        assert_eq!(take::<u64>(key), None);
        // Another type under the key is not it.
        assert_eq!(carried.enter(|| take::<u32>(key)), None);
        let mut again = Carried::default();
        assert_eq!(
            again.enter(|| take::<u64>(key)),
            None,
            "another recovery's values are its own"
        );
        carried.enter(|| leave(key, 8u64));
        assert_eq!(carried.enter(|| take::<u64>(key)), Some(8));
        assert_eq!(carried.enter(|| take::<u64>(key)), None, "taken once");
    }

    #[test]
    fn a_panic_inside_keeps_what_was_left() {
        let key = Path::new("/wal/subtask-002");
        let mut carried = Carried::default();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            carried.enter(|| {
                leave(key, 1u8);
                panic!("a failed chain's drop panicked");
            })
        }));
        assert!(r.is_err());
        assert_eq!(take::<u8>(key), None, "the scope ended with the panic");
        assert_eq!(carried.enter(|| take::<u8>(key)), Some(1));
    }
}
