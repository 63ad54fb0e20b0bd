//! What a front door that hands a synced key's room on to its own clients (RLQS) reads of the
//! key: this instance's part of the fleet's room, and the room itself; and usage its clients
//! already admitted, recorded without a decision.
//!
//! The part follows the demand each instance's entries carry in the store (the predictive
//! policy's shares, [`model::share`]), with a floor: every instance the key knows of (this one,
//! the live others, the phantoms not listed yet) keeps [`FLOOR`] of the room over their
//! number, and the rest is split by demand. When all instances read the same entries the
//! shares add up to one, so the parts do too: the fleet hands out no more than the room. An
//! instance whose demand is small (its clients just started) still gets its floor, admits
//! it, and its demand (what it admitted) grows its share from one report to the next; two
//! instances whose clients both want more than the room drift to an even split rather than
//! keep whatever split they started with.

use sluice_core::Nanos;

use super::SyncedRule;
use super::model;
use crate::health::StoreView;

/// The part of a key's room kept evenly among the instances that know of it; the rest is
/// split by demand.
pub const FLOOR: f64 = 0.1;

/// This instance's part of a synced key's room, and the room the fleet has left.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct KeyPart {
    /// This instance's part, 0..=1.
    pub part: f64,
    /// The fleet's room left in the window by the estimate of the global count (this
    /// instance's budget aside); `None` where the store decides (a limit too small to share).
    pub room: Option<u64>,
}

impl SyncedRule {
    /// This instance's part of `key`'s room at `now` (an untracked key: an even part of the
    /// fleet).
    pub(crate) fn part(&self, key: &str, now: Nanos, store: StoreView) -> KeyPart {
        let p = &self.params;
        let parties = store.fleet.max(p.expected_instances).max(1);
        let even = KeyPart {
            part: 1.0 / parties as f64,
            room: None,
        };
        // Decided at the store: the room is the fleet's, read by every instance alike.
        if self.decides_at_store(store) {
            return even;
        }
        let guard = self.keys.guard();
        let Some(cell) = self.keys.get(key, &guard) else {
            return even;
        };
        let mut state = cell.lock();
        let shared_guard = self.shared.guard();
        let mut shared = self.lock_shared(&state, key, &shared_guard);
        let w = p.window_of(now);
        state.roll(p, shared.as_deref_mut(), w, now);
        let window_start = p.window_start(state.key_window(w));
        let view = state.view();
        let shared = shared.as_deref();
        if !p.predictive() {
            // Reactive: no entries, no demand shares; its own count scaled by the node estimate.
            let nodes = model::node_estimate(&view).max(parties);
            return KeyPart {
                part: 1.0 / nodes as f64,
                room: None,
            };
        }
        let phantoms = model::phantoms(p, &view, shared, now, store.fleet);
        let estimate = model::estimate(
            p,
            &view,
            shared,
            window_start,
            now,
            (store.health, phantoms),
        );
        let room = Some((p.limit as f64 - estimate).max(0.0).floor() as u64);
        let (share, known) = match shared {
            Some(x) => (
                model::share(p, &view, x, now, (phantoms, store.fleet)),
                1 + phantoms + x.live_others(p, now).count() as u64,
            ),
            // No other instance listed: alone, or others not listed yet (phantoms), each
            // taken to demand what this one does.
            None => (1.0 / (1 + phantoms) as f64, 1 + phantoms),
        };
        KeyPart {
            part: with_floor(share, known),
            room,
        }
    }

    /// Records `count` requests of `key` admitted elsewhere (a client enforcing its own
    /// assignment) without deciding: counted here and flushed like any admission.
    pub(crate) fn record(&self, key: &str, now: Nanos, count: u64) {
        let guard = self.keys.guard();
        let entry = match self.keys.get(key, &guard) {
            Some(k) => k,
            None => self.keys.get_or_insert_with(
                ecow::EcoString::from(key),
                parking_lot::Mutex::default,
                &guard,
            ),
        };
        let mut state = entry.lock();
        let shared_guard = self.shared.guard();
        let shared = self.lock_shared(&state, key, &shared_guard);
        let mut shared = shared;
        state.record(&self.params, shared.as_deref_mut(), now, count);
    }
}

/// A demand `share` (0..=1) of `known` instances' demand, with [`FLOOR`] of the room kept
/// evenly among them.
pub(crate) fn with_floor(share: f64, known: u64) -> f64 {
    let share = if share.is_finite() {
        share.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let known = known.max(1) as f64;
    FLOOR / known + (1.0 - FLOOR) * share
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_add_up_to_the_room_and_none_is_locked_out() {
        for n in 1..=8u64 {
            // Any split of the demand among n instances.
            let weights: Vec<f64> = (0..n).map(|i| (i * i) as f64).collect();
            let total: f64 = weights.iter().sum::<f64>().max(1e-9);
            let parts: Vec<f64> = weights.iter().map(|w| with_floor(w / total, n)).collect();
            let sum: f64 = parts.iter().sum();
            assert!(sum <= 1.0 + 1e-9, "{n}: {parts:?}");
            assert!(
                parts.iter().all(|&p| p >= FLOOR / n as f64 - 1e-12),
                "{parts:?}"
            );
        }
        // Alone: the whole room.
        assert!((with_floor(1.0, 1) - 1.0).abs() < 1e-12);
        assert_eq!(with_floor(f64::NAN, 2), FLOOR / 2.0);
    }
}
