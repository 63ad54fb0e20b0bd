//! The [`StoreLink`]: this instance's one way to the shared store. It holds the store handle,
//! the store-corrected clock, the store's health, the fleet's size, exact mode's breaker and
//! the early-sync wake-up, and is used alike by the request path (a decision taken at the
//! store, a synced key's view of the store) and by the flush. One link is shared by an engine
//! and the engines its reloads build, so what it has learnt survives a reload.

mod early;
mod fleet;
mod offset;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use metrics::counter;
use sluice_core::{Clock, Nanos};
use sluice_store::{CounterStore, StoreError};

use crate::exact::breaker::{Breaker, BreakerState};
use crate::exact::decisions::StoreCalls;
use crate::health::{HealthCell, StoreHealth, StoreView};
pub(crate) use early::EarlySync;
use offset::ClockOffset;

/// The store side that requests and flushes share (see the module documentation).
pub(crate) struct StoreLink {
    store: Arc<dyn CounterStore>,
    clock: Arc<dyn Clock>,
    node: Arc<str>,
    /// Correct the clock by the store's `TIME` (`EngineOptions::follow_store_clock`).
    follow_store_clock: bool,
    /// Store time minus local time, as measured from trustworthy readings.
    offset: ClockOffset,
    health: HealthCell,
    /// Exact mode's breaker and time budget per request.
    breaker: Breaker,
    exact_timeout: Option<std::time::Duration>,
    /// Instances live on the store as the last announcement found them (0: not known yet).
    fleet: AtomicU64,
    /// When this instance last announced itself (raw local time), and whether the last two
    /// answers agreed on the fleet's size.
    last_announce: AtomicU64,
    fleet_steady: AtomicBool,
    /// Keys asked for an early sync; wakes the flush loop.
    pub(crate) early: EarlySync,
    /// The runtime the engine was built on (the server's main one), where decisions taken in
    /// the store run whichever thread asks (`StoreCalls::exact`).
    home: Option<tokio::runtime::Handle>,
}

/// Nanoseconds between probes of an idle store (and between announcements until the fleet's
/// size is steady).
pub(crate) const PROBE_EVERY_NS: u64 = 1_000_000_000;

/// Counts a store error in `sluice_store_errors_total` (flushes, probes and exact mode alike).
pub(crate) fn count_store_error(e: &StoreError) {
    counter!("sluice_store_errors_total", "kind" => e.kind()).increment(1);
}

impl StoreLink {
    pub(crate) fn new(
        store: Arc<dyn CounterStore>,
        clock: Arc<dyn Clock>,
        node: Arc<str>,
        follow_store_clock: bool,
        exact: &sluice_config::ExactCalls,
        exact_budget_timer: bool,
    ) -> Self {
        Self {
            store,
            clock,
            node,
            follow_store_clock,
            offset: ClockOffset::new(),
            health: HealthCell::new(),
            breaker: Breaker::new(exact),
            exact_timeout: exact_budget_timer.then_some(exact.timeout),
            fleet: AtomicU64::new(0),
            last_announce: AtomicU64::new(0),
            fleet_steady: AtomicBool::new(false),
            early: EarlySync::new(),
            home: tokio::runtime::Handle::try_current().ok(),
        }
    }

    /// The store itself (the flush's round trips).
    pub(crate) fn store(&self) -> &dyn CounterStore {
        &*self.store
    }

    /// The local clock, uncorrected (round trips are timed on it).
    pub(crate) fn raw_clock(&self) -> &dyn Clock {
        &*self.clock
    }

    /// What a synced decision knows of the store now.
    pub(crate) fn view(&self) -> StoreView {
        StoreView {
            health: self.health(),
            fleet: self.fleet.load(Ordering::Relaxed).max(1),
        }
    }

    /// Whether the store takes decisions (`exact` mode's scripts); etcd does not.
    pub(crate) fn runs_exact(&self) -> bool {
        self.store.runs_exact()
    }

    /// How a decision taken in the store calls it (exact rules, synced small limits).
    pub(crate) fn exact_calls(&self) -> StoreCalls<'_> {
        StoreCalls {
            store: &self.store,
            breaker: &self.breaker,
            timeout: self.exact_timeout,
            home: self.home.as_ref(),
        }
    }

    pub(crate) fn breaker_state(&self) -> BreakerState {
        self.breaker.state()
    }

    pub(crate) fn node(&self) -> &Arc<str> {
        &self.node
    }

    /// The current time corrected by the offset to the store's clock.
    pub(crate) fn now(&self) -> Nanos {
        let raw = self.clock.now() as i128 + i128::from(self.offset_ns());
        raw.clamp(0, i128::from(u64::MAX)) as u64
    }

    pub(crate) fn offset_ns(&self) -> i64 {
        self.offset.get()
    }

    /// Whether the store's `TIME` corrects this instance's clock.
    pub(crate) fn follows_store_clock(&self) -> bool {
        self.follow_store_clock
    }

    pub(crate) fn health(&self) -> StoreHealth {
        self.health.get()
    }

    /// Records the store's health (see [`HealthCell::set`]); returns whether it changed.
    pub(crate) fn set_health(&self, health: StoreHealth) -> bool {
        self.health.set(health)
    }

    pub(crate) fn reached(&self) -> bool {
        self.health.reached()
    }

    /// Takes the store's clock as read between `sent` and `received` (raw local times), when
    /// the reading can be trusted ([`ClockOffset::observe`]).
    pub(crate) fn observe_store_time(&self, sent: Nanos, received: Nanos, store_time: Nanos) {
        if self.follow_store_clock {
            self.offset.observe(sent, received, store_time);
        }
    }

    /// Reads the store's clock (the cheapest call): the offset follows it and the store is
    /// answering, or the store is unreachable and the error is counted and returned.
    pub(crate) async fn probe(&self) -> Result<(), StoreError> {
        let sent_at = self.clock.now();
        match self.store.time().await {
            Ok(store_time) => {
                self.observe_store_time(sent_at, self.clock.now(), store_time);
                self.health.set(StoreHealth::Answering);
                Ok(())
            }
            Err(e) => {
                if self.health.set(StoreHealth::Unreachable) {
                    tracing::warn!(store = %self.store.describe(), error = %e, "the store does not answer; local fallback limits apply until it does");
                }
                count_store_error(&e);
                Err(e)
            }
        }
    }
}
