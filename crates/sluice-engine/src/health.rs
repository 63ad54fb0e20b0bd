//! Whether the shared store is answering, as the last flush or probe found it.

use std::sync::atomic::{AtomicU8, Ordering};

/// The store as the engine last found it. Synced keys decide with it: while the store is
/// unreachable they keep to their fallback share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StoreHealth {
    /// The last flush (or probe) got an answer.
    Answering,
    /// The last flush (or probe) failed as a whole.
    Unreachable,
}

impl StoreHealth {
    pub(crate) fn answering(self) -> bool {
        self == StoreHealth::Answering
    }
}

/// A [`StoreHealth`] shared between the flush and the request path, and whether the store
/// has ever answered.
#[derive(Debug)]
pub(crate) struct HealthCell(AtomicU8);

const ANSWERING: u8 = 1;
const REACHED: u8 = 2;

impl HealthCell {
    /// Answering (until a flush says otherwise), never reached yet.
    pub(crate) fn new() -> Self {
        Self(AtomicU8::new(ANSWERING))
    }

    pub(crate) fn get(&self) -> StoreHealth {
        if self.0.load(Ordering::Relaxed) & ANSWERING != 0 {
            StoreHealth::Answering
        } else {
            StoreHealth::Unreachable
        }
    }

    /// Whether the store has ever answered.
    pub(crate) fn reached(&self) -> bool {
        self.0.load(Ordering::Relaxed) & REACHED != 0
    }

    /// Records the store's health; a change sets `sluice_store_up` and writes one log line
    /// (the failure itself is logged where it happened). Returns whether it changed.
    pub(crate) fn set(&self, health: StoreHealth) -> bool {
        let before = match health {
            StoreHealth::Answering => self.0.fetch_or(ANSWERING | REACHED, Ordering::Relaxed),
            StoreHealth::Unreachable => self.0.fetch_and(!ANSWERING, Ordering::Relaxed),
        };
        let was_answering = before & ANSWERING != 0;
        let changed = was_answering != health.answering();
        if changed {
            metrics::gauge!("sluice_store_up").set(if health.answering() { 1.0 } else { 0.0 });
            if health.answering() {
                tracing::info!("the store answers again; synced rules leave their fallback");
            }
        } else if health.answering() && before & REACHED == 0 {
            metrics::gauge!("sluice_store_up").set(1.0);
        }
        changed
    }
}

/// What a synced decision knows of the store: whether it answers, and how many instances use
/// it (as their announcements found them, at least the configured `expected_instances`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StoreView {
    pub health: StoreHealth,
    /// Instances live on the store, at least 1.
    pub fleet: u64,
}

impl StoreView {
    /// Answering, with `fleet` instances.
    #[cfg(test)]
    pub(crate) const fn answering(fleet: u64) -> Self {
        Self {
            health: StoreHealth::Answering,
            fleet: if fleet == 0 { 1 } else { fleet },
        }
    }
}
