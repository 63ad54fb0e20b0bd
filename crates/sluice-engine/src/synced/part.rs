//! What a front door that hands a synced key's room on to its own clients (RLQS) reads of the
//! key: this instance's part of the fleet's room, and the room itself; and usage its clients
//! already admitted, recorded without a decision.
//!
//! The part follows how the fleet's admissions of the key split among the instances, as the
//! store tells them at each flush (each instance's count in the window, and the previous
//! window's as it fades out of the last window's span), with a floor: the instances the key
//! knows of (this one, the live others, the phantoms not listed yet) keep [`FLOOR`] of the
//! room over their number, and the rest is split by admissions. When all instances read the
//! same counts the shares add up to one, so the parts do too; each reads the others' counts a
//! flush late, so every count is projected from when it was last known to now, and a boundary
//! reply of a key whose usage is recorded reads again once the others' flushes of that
//! boundary have landed (the instance whose flush landed first otherwise held a count of the
//! other's a span old: parts adding up to 1.06-1.14). An instance whose clients just started
//! still gets its floor, admits it, and its count grows its share; two instances whose clients
//! both want more than the room drift to an even split (the floor pulls them) rather than keep
//! whatever split they started with.

use sluice_core::Nanos;

use super::SyncedRule;
use super::model;
use crate::health::StoreView;

/// The part of a key's room kept evenly among the instances that know of it; the rest is
/// split by the instances' admissions. Admissions say nothing of a demand the room refused:
/// two instances whose Envoys both want more than the room keep the split they had, moving
/// towards even by this much of the way each window. At a tenth, one user at 3x the limit
/// whose traffic turned from 9:1 to even kept 3:1 for three windows and more in the simulator
/// (`examples/scenarios/rlqs/two-instances.yaml`); at 0.3 it is within 10% of even in three,
/// while the 9:1 split still gives the small instance its demand and the large one the rest
/// (over seeds 1-12, windows after the first two 87-104 of 100 against 88-108 at a tenth; at
/// a half, nine windows under 90 as the large instance's part shrank).
pub const FLOOR: f64 = 0.3;

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
        let known = 1 + phantoms + shared.map_or(0, |x| x.live_others(p, now).count() as u64);
        // Every instance's count as the store has it (what their last flushes sent), projected
        // from when they flushed to now (`count_share`): this instance's own count is fresher
        // than the others' by up to a flush (its clients' last report in it, theirs not), and
        // shares of counts of different ages added up to 1.11 (windows at 118 of 100 with
        // two real instances).
        let flushed = model::KeyView {
            local: view
                .local
                .saturating_sub(u32::try_from(state.unsent()).unwrap_or(u32::MAX)),
            ..view
        };
        // Its own count as of its last flush, projected too: its clients (Envoys) admit between
        // their reports, so "nothing counted since the flush" does not make the count current
        // (taken as current, the 9:1 split's large instance got 60 to 65 of 100, windows 87
        // to 90).
        let flushed_at = shared.map_or(now, |x| x.heard_at);
        let share = count_share(
            p,
            (&flushed, flushed_at),
            shared,
            (window_start, now),
            phantoms,
        )
        .unwrap_or(1.0 / known as f64);
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

/// This instance's share of the key's admissions over about the last window: its count in
/// the window, and the previous window's weighted by the part of it a window back from now
/// still covers, over the fleet's (the others' counts as their entries and the last total
/// read tell them; instances not listed yet, `phantoms`, taken to have counted what this one
/// has). `None` before anyone admitted anything. Counts, not rates: an Envoy's usage reaches
/// the engine in lumps, once per report, and the rates sampled per span swung with the
/// phase of the reports (parts adding up to 1.15 in a real fleet); counts read at each flush
/// add up, so every instance reading the same store state gets shares that add up to one.
fn count_share(
    p: &super::params::SyncedParams,
    (view, flushed_at): (&model::KeyView, Nanos),
    shared: Option<&super::shared::Shared>,
    (window_start, now): (Nanos, Nanos),
    phantoms: u64,
) -> Option<f64> {
    let elapsed = now.saturating_sub(window_start).min(p.window_ns) as f64;
    let back = 1.0 - elapsed / p.window_ns.max(1) as f64;
    let listed: f64 = shared.map_or(0.0, |x| {
        x.others
            .iter()
            .map(|o| f64::from(o.count) * projection(x.quiet_until(p, o), (window_start, now)))
            .sum()
    });
    let others_now = listed.max(f64::from(view.others_read));
    let others_before = f64::from(view.prev_global.saturating_sub(view.prev_local));
    let own = f64::from(view.local) * projection(flushed_at, (window_start, now))
        + back * f64::from(view.prev_local);
    let total = own * (1 + phantoms) as f64 + others_now + back * others_before;
    (total > 0.0).then(|| own / total)
}

/// The most a count is scaled up by [`projection`].
const MAX_PROJECTION: f64 = 3.0;

/// How much a count in the window read as of `at` grows by `now` at the same pace: the window's
/// time elapsed by `now` over that elapsed by `at` (at most [`MAX_PROJECTION`], and 1 for a
/// count read before the window began or in the future).
fn projection(at: Nanos, (window_start, now): (Nanos, Nanos)) -> f64 {
    if at <= window_start || at >= now {
        return 1.0;
    }
    let by_now = now.saturating_sub(window_start) as f64;
    let by_then = at.saturating_sub(window_start) as f64;
    (by_now / by_then).min(MAX_PROJECTION)
}

/// A `share` (0..=1) of the admissions of `known` instances, with [`FLOOR`] of the room kept
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
    fn a_count_read_earlier_in_the_window_is_projected_to_now() {
        const S: Nanos = 1_000_000_000;
        // Read 5 s into the window, now 10 s in: twice as much by now.
        assert_eq!(projection(105 * S, (100 * S, 110 * S)), 2.0);
        // Read just after the window began: at most three times.
        assert_eq!(projection(100 * S + 1, (100 * S, 110 * S)), MAX_PROJECTION);
        // Read in the window before, or not yet: as it is.
        assert_eq!(projection(99 * S, (100 * S, 110 * S)), 1.0);
        assert_eq!(projection(111 * S, (100 * S, 110 * S)), 1.0);
    }

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
