//! How one key's state is updated atomically in memory.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Holds one key's state and applies transitions to it atomically.
pub trait StateCell<S>: Default + Send + Sync {
    /// Applies `f` to the current state and stores the state it returns. `f` may run more than
    /// once (lock-free cells retry on contention), so it must be a pure function of its input.
    fn transition<R>(&self, f: impl FnMut(S) -> (R, S)) -> R;
}

/// A lock-free cell for states that fit in one `u64` (GCRA, leaky queue): a compare-and-swap
/// loop that writes only this key's word, so threads working on different keys never contend.
#[derive(Debug, Default)]
pub struct AtomicCell(AtomicU64);

impl StateCell<u64> for AtomicCell {
    #[inline]
    fn transition<R>(&self, mut f: impl FnMut(u64) -> (R, u64)) -> R {
        let mut current = self.0.load(Ordering::Acquire);
        loop {
            let (result, next) = f(current);
            if next == current {
                return result;
            }
            match self
                .0
                .compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return result,
                Err(actual) => current = actual,
            }
        }
    }
}

/// A cell guarded by its own mutex, for states larger than a word. The lock belongs to the key,
/// not to a shard, so different keys never contend.
#[derive(Debug, Default)]
pub struct LockedCell<S>(Mutex<S>);

impl<S: Default + Send> StateCell<S> for LockedCell<S> {
    #[inline]
    fn transition<R>(&self, mut f: impl FnMut(S) -> (R, S)) -> R {
        // A panic while holding the lock cannot leave a half-written state: the state is
        // replaced whole, so a poisoned lock is safe to keep using.
        let mut guard = self.0.lock().unwrap_or_else(|poison| poison.into_inner());
        let (result, next) = f(std::mem::take(&mut *guard));
        *guard = next;
        result
    }
}
