//! What the status page says of the flushes: when the last one ended, how long it took, how
//! many were answered or failed, and the last failure.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use sluice_core::Nanos;

#[derive(Debug, Default)]
pub(crate) struct FlushRecord {
    /// When the last flush with items ended (engine clock; 0: none yet).
    last_at: AtomicU64,
    last_took_ns: AtomicU64,
    answered: AtomicU64,
    failed: AtomicU64,
    last_error: Mutex<Option<String>>,
}

/// The flushes as the status page shows them.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct FlushSummary {
    /// When the last flush ended, in milliseconds since the epoch of the engine's clock
    /// (`None`: no flush yet).
    pub last_at_ms: Option<u64>,
    /// How long it took, in milliseconds.
    pub last_took_ms: f64,
    /// Flushes answered by the store since start.
    pub answered: u64,
    /// Flushes that failed as a whole since start.
    pub failed: u64,
    /// The last failure's message (no secrets: store errors never carry credentials).
    pub last_error: Option<String>,
}

impl FlushRecord {
    pub(crate) fn record(&self, ended: Nanos, took: Nanos, error: Option<String>) {
        self.last_at.store(ended, Ordering::Relaxed);
        self.last_took_ns.store(took, Ordering::Relaxed);
        let counter = if error.is_some() {
            &self.failed
        } else {
            &self.answered
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if error.is_some() {
            *self.last_error.lock() = error;
        }
    }

    pub(crate) fn summary(&self) -> FlushSummary {
        let last_at = self.last_at.load(Ordering::Relaxed);
        FlushSummary {
            last_at_ms: (last_at > 0).then_some(last_at / 1_000_000),
            last_took_ms: self.last_took_ns.load(Ordering::Relaxed) as f64 / 1e6,
            answered: self.answered.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            last_error: self.last_error.lock().clone(),
        }
    }
}
