//! The fleet: each instance announces itself on the store, which answers with how many
//! instances are live (and its clock); synced keys with no history start from that number.

use std::sync::atomic::Ordering;

use metrics::gauge;

use super::{PROBE_EVERY_NS, StoreLink, count_store_error};

/// How often an instance announces itself to the store: every second until two answers in a
/// row agree on the fleet's size (a fleet that starts together learns its size at once), then
/// every 30 s; an instance not heard from for [`LIVE_FOR`] has left.
const ANNOUNCE_EVERY_NS: u64 = 30_000_000_000;
const LIVE_FOR: std::time::Duration = std::time::Duration::from_secs(90);

impl StoreLink {
    /// Instances live on the store (0 until the first announcement is answered).
    pub(crate) fn fleet(&self) -> u64 {
        self.fleet.load(Ordering::Relaxed)
    }

    /// Announces this instance to the store when due (see [`ANNOUNCE_EVERY_NS`]): the store
    /// answers with the instances live, and its clock.
    /// Nothing is announced for an engine with no synced or exact rule (`announces` false).
    pub(crate) async fn announce_if_due(&self, announces: bool) {
        let raw_now = self.clock.now();
        let last = self.last_announce.load(Ordering::Relaxed);
        let every = if self.fleet_steady.load(Ordering::Relaxed) {
            ANNOUNCE_EVERY_NS
        } else {
            PROBE_EVERY_NS
        };
        if !announces || (last > 0 && raw_now.saturating_sub(last) < every) {
            return;
        }
        self.announce().await;
    }

    /// Announces this instance to the store now: the store answers with the instances live
    /// (kept for [`StoreLink::view`]) and its clock.
    pub(crate) async fn announce(&self) {
        let raw_now = self.clock.now();
        self.last_announce.store(raw_now.max(1), Ordering::Relaxed);
        match self.store.announce(&self.node, LIVE_FOR).await {
            Ok(presence) => {
                self.observe_store_time(raw_now, self.clock.now(), presence.store_time);
                let before = self.fleet.swap(presence.live, Ordering::Relaxed);
                self.fleet_steady
                    .store(before == presence.live, Ordering::Relaxed);
                gauge!("sluice_fleet_instances").set(presence.live as f64);
            }
            Err(e) => count_store_error(&e),
        }
    }

    /// Takes this instance off the fleet's list (it is stopping): the others, and an
    /// instance started in its place, stop counting it at their next announcement instead
    /// of [`LIVE_FOR`] later.
    pub(crate) async fn leave_fleet(&self) {
        if self.last_announce.load(Ordering::Relaxed) == 0 {
            return;
        }
        if let Err(e) = self.store.leave(&self.node).await {
            count_store_error(&e);
        }
    }
}
