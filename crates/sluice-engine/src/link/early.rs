//! The early-sync wake-up: a key whose span's safe share is spent asks for its counts to go
//! out before the span ends; the request path rings, the flush loop waits for the ring.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use sluice_core::Nanos;
use tokio::sync::Notify;

/// Whether keys asked for an early sync since the last early flush, and from when it may leave.
pub(crate) struct EarlySync {
    wanted: AtomicBool,
    wake: Notify,
    /// The engine time before which the early sync asked for should not leave (0: at once):
    /// see `SyncedRule::read_ahead_at`.
    not_before: AtomicU64,
}

impl EarlySync {
    pub(crate) fn new() -> Self {
        Self {
            wanted: AtomicBool::new(false),
            wake: Notify::new(),
            not_before: AtomicU64::new(0),
        }
    }

    /// A key asked for an early sync: wake the flush loop.
    pub(crate) fn wake(&self) {
        if !self.wanted.swap(true, Ordering::Relaxed) {
            self.wake.notify_one();
        }
    }

    /// Whether keys wait for an early sync.
    pub(crate) fn wanted(&self) -> bool {
        self.wanted.load(Ordering::Relaxed)
    }

    /// The engine time before which the early sync asked for should not leave (0: at once).
    pub(crate) fn not_before(&self) -> Nanos {
        self.not_before.load(Ordering::Relaxed)
    }

    /// Resolves once keys have asked for an early sync.
    pub(crate) async fn asked(&self) {
        if !self.wanted() {
            self.wake.notified().await;
        }
    }

    /// An early flush starts: what was asked so far goes with it.
    pub(crate) fn take(&self) {
        self.wanted.store(false, Ordering::Relaxed);
        self.not_before.store(0, Ordering::Relaxed);
    }

    /// Keys read ahead of the others' flushes of a boundary: they read again at `at`.
    pub(crate) fn wake_at(&self, at: Nanos) {
        self.not_before.fetch_max(at, Ordering::Relaxed);
        self.wake();
    }
}
