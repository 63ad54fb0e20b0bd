//! What each listener refused, for metrics, readiness and the status page. A listener that
//! sheds (no in-flight slot, or a waiting request dropped for room) is said to be shedding
//! for [`SHEDDING_FOR`] after the last one, and `/readyz` answers 503 meanwhile: the instance
//! is turning calls away, and a load balancer should know.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use serde::Serialize;
use sluice_core::{Clock, Nanos};

use super::refusal::Refusal;

/// How long after its last shed request a listener still counts as shedding.
pub(crate) const SHEDDING_FOR: Duration = Duration::from_secs(10);

/// One listener's refusals.
pub(crate) struct DoorHealth {
    listener: &'static str,
    clock: Arc<dyn Clock>,
    /// When it last shed a request (0: never).
    last_shed: AtomicU64,
    busy: AtomicU64,
    evicted: AtomicU64,
    body_timeouts: AtomicU64,
}

impl std::fmt::Debug for DoorHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DoorHealth")
            .field("listener", &self.listener)
            .finish_non_exhaustive()
    }
}

impl DoorHealth {
    /// Counts a refusal.
    pub(crate) fn refused(&self, refusal: Refusal) {
        let listener = self.listener;
        let shed = |counter: &AtomicU64, reason: &'static str| {
            counter.fetch_add(1, Ordering::Relaxed);
            self.last_shed
                .store(self.clock.now().max(1), Ordering::Relaxed);
            metrics::counter!("sluice_requests_shed_total", "listener" => listener, "reason" => reason)
                .increment(1);
        };
        match refusal {
            Refusal::Busy => shed(&self.busy, "in_flight"),
            Refusal::Evicted => shed(&self.evicted, "waiting"),
            Refusal::BodyTimeout(_) => {
                self.body_timeouts.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("sluice_request_body_timeouts_total", "listener" => listener)
                    .increment(1);
            }
            Refusal::TooLarge(_) | Refusal::BodyError => {}
        }
    }

    fn report(&self, now: Nanos) -> ListenerReport {
        let last = self.last_shed.load(Ordering::Relaxed);
        let ago = (last != 0).then(|| Duration::from_nanos(now.saturating_sub(last)));
        ListenerReport {
            listener: self.listener,
            shedding: ago.is_some_and(|ago| ago < SHEDDING_FOR),
            last_shed_ms_ago: ago.map(|a| u64::try_from(a.as_millis()).unwrap_or(u64::MAX)),
            shed_in_flight: self.busy.load(Ordering::Relaxed),
            shed_waiting: self.evicted.load(Ordering::Relaxed),
            body_timeouts: self.body_timeouts.load(Ordering::Relaxed),
        }
    }
}

/// Every listener's record.
#[derive(Clone)]
pub(crate) struct Doors {
    clock: Arc<dyn Clock>,
    doors: Arc<Mutex<Vec<Arc<DoorHealth>>>>,
}

impl std::fmt::Debug for Doors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Doors").finish_non_exhaustive()
    }
}

impl Doors {
    pub(crate) fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            doors: Arc::default(),
        }
    }

    /// The record of `listener` (one per name: a gateway's workers share it).
    pub(crate) fn register(&self, listener: &'static str) -> Arc<DoorHealth> {
        let mut doors = self.doors.lock();
        if let Some(door) = doors.iter().find(|d| d.listener == listener) {
            return door.clone();
        }
        let door = Arc::new(DoorHealth {
            listener,
            clock: self.clock.clone(),
            last_shed: AtomicU64::new(0),
            busy: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            body_timeouts: AtomicU64::new(0),
        });
        doors.push(door.clone());
        door
    }

    /// Every listener's refusals now.
    pub(crate) fn report(&self) -> SheddingReport {
        let now = self.clock.now();
        SheddingReport {
            listeners: self.doors.lock().iter().map(|d| d.report(now)).collect(),
        }
    }
}

/// Every listener's refusals, as `/status.json` shows them.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct SheddingReport {
    pub listeners: Vec<ListenerReport>,
}

impl SheddingReport {
    /// The listeners shedding now.
    pub(crate) fn shedding(&self) -> impl Iterator<Item = &ListenerReport> {
        self.listeners.iter().filter(|l| l.shedding)
    }
}

/// One listener's refusals.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct ListenerReport {
    pub listener: &'static str,
    /// It shed a request within the last 10 s.
    pub shedding: bool,
    pub last_shed_ms_ago: Option<u64>,
    /// Requests refused because every in-flight slot was taken.
    pub shed_in_flight: u64,
    /// Requests dropped from a full waiting room (their body was still arriving).
    pub shed_waiting: u64,
    /// Requests whose body did not arrive within `body_read_timeout`.
    pub body_timeouts: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::ManualClock;

    #[test]
    fn a_listener_is_shedding_for_ten_seconds_after_its_last_shed_request() {
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        let doors = Doors::new(clock.clone());
        let grpc = doors.register("grpc");
        let _http = doors.register("http");
        assert!(Arc::ptr_eq(&grpc, &doors.register("grpc")));
        assert_eq!(doors.report().shedding().count(), 0);
        grpc.refused(Refusal::BodyTimeout(10));
        assert_eq!(
            doors.report().shedding().count(),
            0,
            "a slow client is not shedding"
        );
        grpc.refused(Refusal::Busy);
        let report = doors.report();
        let shedding: Vec<_> = report.shedding().map(|l| l.listener).collect();
        assert_eq!(shedding, ["grpc"]);
        clock.advance(SHEDDING_FOR);
        assert_eq!(doors.report().shedding().count(), 0);
        assert_eq!(doors.report().listeners[0].shed_in_flight, 1);
    }
}
