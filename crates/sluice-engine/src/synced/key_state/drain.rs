//! What a key hands to the next flush: [`KeyState::drain`] takes its counts (and samples its
//! demand), and whether they go with this instance's entry.

use std::sync::Arc;

use sluice_core::Nanos;
use sluice_store::NodeEntry;

use super::super::flags::{Activity, KeyFlags};
use super::super::model;
use super::super::params::SyncedParams;
use super::super::shared::Shared;
use super::super::time::store_ms;
use super::{Drain, Flight, KeyState, Sending};

impl KeyState {
    /// Takes what the next flush sends for the key: the previous window's carried count, the
    /// window's unsent count (with a demand sample, and this instance's entry when the key
    /// exchanges entries). The counts leave the key (the flight holds them) until
    /// [`KeyState::absorb`] settles them.
    pub(crate) fn drain(
        &mut self,
        p: &SyncedParams,
        mut shared: Option<&mut Shared>,
        node: &Arc<str>,
        now: Nanos,
        early: bool,
    ) -> Drain {
        let w = p.window_of(now);
        self.roll(p, shared.as_deref_mut(), w, now);
        let window = self.key_window(w);
        let window_start = p.window_start(window);
        let mut flight = Flight {
            window,
            carry: None,
            current: None,
            early,
            sent_at: now,
            refused: self.offered > self.unflushed,
        };
        if self.carry > 0 {
            flight.carry = Some(std::mem::take(&mut self.carry));
            self.flags.insert(KeyFlags::IN_FLIGHT);
        }
        // An early sync reads the others even when this instance has nothing new to add.
        if self.unflushed == 0 && self.offered == 0 && !early {
            if flight.carry.is_some() {
                let (entry, first_write) = (None, false);
                return Drain::Send(Sending {
                    flight,
                    entry,
                    first_write,
                });
            }
            let idle = !self.has(KeyFlags::IN_FLIGHT)
                && self.activity.idle()
                && now >= self.blocked_until(p, window_start);
            return if idle { Drain::Idle } else { Drain::Quiet };
        }
        // The first interval opens with the key's first hit, which is not part of the rate:
        // it is set aside, and a single hit (an early sync right after a cold key's first
        // request) tells no rate yet: the next interval starts here.
        let timeline = p.timeline();
        let elapsed = now.saturating_sub(timeline.at(window_start, self.demand_at));
        let hits = if self.activity.contains(Activity::SAMPLED) {
            Some(self.offered)
        } else {
            self.offered.checked_sub(1).filter(|&h| h > 0)
        };
        if let (Some(hits), true) = (hits, elapsed > 0) {
            self.demand = self.demand.sampled(hits, elapsed, p.span_ns);
        }
        self.activity.insert(Activity::SAMPLED);
        self.offered = 0;
        self.demand_at = timeline.stamp(window_start, now);
        // An early sync of a settled key only reads the total: its entries are current.
        let read_only = early && self.seen_entries() && self.settled();
        let entry = (!read_only && self.exchanges_entries(p, shared.as_deref(), window_start, now))
            .then(|| NodeEntry {
                node: node.clone(),
                count: self.local.into(),
                at_ms: store_ms(now),
                rate_milli: self.demand.store_milli(),
            });
        flight.current = Some(std::mem::take(&mut self.unflushed));
        self.flags.insert(KeyFlags::IN_FLIGHT);
        Drain::Send(Sending {
            flight,
            entry,
            first_write: !self.has(KeyFlags::PREV_KNOWN),
        })
    }

    /// Entries are exchanged on the key's first flush in a window, until whether it is shared
    /// is settled, after a failed flush, and whenever the key is shared (the last reply showed
    /// another instance: an entry, or counts no entry accounts for; or a gap just ended)
    /// unless it is far below its limit. Otherwise a flush only adds its count (one command
    /// instead of three) and the total tells when someone else starts.
    fn exchanges_entries(
        &self,
        p: &SyncedParams,
        shared: Option<&Shared>,
        window_start: Nanos,
        now: Nanos,
    ) -> bool {
        p.predictive()
            && (!self.has(KeyFlags::PREV_KNOWN)
                || !self.settled()
                || self.has(KeyFlags::CUT_OFF)
                || shared.is_some_and(|x| {
                    x.needed(now) && !model::far_below(p, &self.view(), x, window_start, now, 0)
                }))
    }
}
