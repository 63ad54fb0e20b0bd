//! How a key takes the store's answer to a flush: [`KeyState::absorb`] puts back counts that
//! did not arrive and reads the total, the previous window's and the other instances' entries;
//! it decides whether the key is settled as shared or not, and whether an early sync should
//! read the others again before the span's budget runs out.

use sluice_core::Nanos;
use sluice_store::FlushOutcome;

use super::super::flags::{Activity, KeyFlags, Sharing};
use super::super::model;
use super::super::params::SyncedParams;
use super::super::reply::{listed_others, unlisted_demand};
use super::super::shared::{Budget, Other, Read, Shared, set_others};
use super::{Flight, KeyState, Replies, sat32};
use crate::health::StoreView;

impl KeyState {
    /// Applies the store's answer to a flight: counts that did not reach the store go back
    /// to their windows; a reply for the window brings the total, the previous window's and
    /// the others' entries. Returns whether every count of the flight arrived.
    pub(crate) fn absorb(
        &mut self,
        p: &SyncedParams,
        shared: &mut Option<Shared>,
        flight: &Flight,
        replies: Replies<'_>,
        node: &str,
        (now, store): (Nanos, StoreView),
    ) -> bool {
        self.flags.remove(KeyFlags::IN_FLIGHT);
        let kw = self.key_window(p.window_of(now));
        let mut ok = true;
        if let Some(count) = flight.carry
            && replies.carry.is_none()
        {
            ok = false;
            self.restore(kw, flight.window - 1, count);
        }
        let Some(sent) = flight.current else {
            return ok;
        };
        let Some(outcome) = replies.current else {
            self.flags.insert(KeyFlags::CUT_OFF);
            self.restore(kw, flight.window, sent);
            return false;
        };
        if self.has(KeyFlags::CUT_OFF) {
            self.flags.remove(KeyFlags::CUT_OFF);
            shared.get_or_insert_default().grace_until = now.saturating_add(2 * p.span_ns);
        }
        if let Some(x) = shared {
            x.heard_at = now;
        }
        if flight.window == kw {
            self.absorb_outcome(p, shared, (outcome, flight), node, kw, (now, store));
        } else if flight.window + 1 == kw {
            self.prev_global = self.prev_global.max(sat32(outcome.total));
        }
        ok
    }

    /// A reply for the key's current window: the total, the previous window's, the entries.
    fn absorb_outcome(
        &mut self,
        p: &SyncedParams,
        shared: &mut Option<Shared>,
        (outcome, flight): (&FlushOutcome, &Flight),
        node: &str,
        kw: u64,
        (now, store): (Nanos, StoreView),
    ) {
        let window_start = p.window_start(kw);
        let early = flight.early;
        if early {
            self.activity.early_replied();
        }
        let cold_start = !self.seen_entries();
        // Our own count as of the snapshot is in the total; what came after is not.
        let own = u64::from(self.local.saturating_sub(self.unflushed));
        self.others_read = sat32(outcome.total.saturating_sub(own));
        if !p.reads_previous() {
            // Nothing to read of the previous window: the first write is done.
            self.flags.insert(KeyFlags::PREV_KNOWN);
        }
        if let Some(previous) = outcome.previous_total {
            self.read_previous(p, previous, window_start, now);
        }
        // What the total holds beyond our own count and every listed entry's.
        let listed: u64 = outcome
            .entries
            .iter()
            .filter(|e| &*e.node != node)
            .map(|e| e.count)
            .sum();
        let unlisted = outcome.total.saturating_sub(own.saturating_add(listed));
        // Whether another instance flushed at the last span boundary, as this instance last
        // heard: it flushes at this one too, and a reply that only shows the others as one
        // group cannot tell whether that flush has landed yet.
        let flushed_last_span = shared.as_ref().is_some_and(|x| {
            x.live_others(p, now)
                .any(|o| flushed_in_last_span(p, o, now))
        });
        let unlisted = (unlisted > 0 && p.predictive()).then(|| {
            let demand = unlisted_demand(p, shared.as_ref(), outcome, unlisted, window_start, now);
            Other::unlisted_group(sat32(unlisted), now, demand)
        });
        let had_group = unlisted.is_some();
        if !outcome.entries.is_empty() {
            let reply = (outcome, flight, node);
            self.take_entries(
                p,
                shared,
                reply,
                (listed, unlisted),
                window_start,
                (now, store),
            );
        } else if self.seen_entries() && early {
            // Right after a flush failed (the grace), the others' counts since their entries
            // may still be on their way: the total says nothing of when they were counted,
            // and dated now they would not be extrapolated over the gap. Their entries stay
            // as they were; the estimate keeps the total as its floor. (A store that stalled
            // past one boundary: the first retried flush to land read the other's entry
            // from before the stall as its count now, and budgeted the room it did not
            // have: 36 of 30 in the window.)
            if let Some(x) = shared
                && !x.in_grace(now)
            {
                x.rebase(p, self.others_read.into(), now);
            }
        } else if self.seen_entries() {
            others_from_count_only(shared, unlisted, window_start, now);
        }
        if outcome.total > p.limit {
            self.block(p, window_start, now);
        }
        if self.seen_entries()
            && let Some(x) = shared
        {
            let group_behind = had_group && flushed_last_span;
            let reply = Reply {
                early,
                group_behind,
                refused: flight.refused,
                cold_start,
            };
            self.set_reply_budget(p, x, reply, window_start, (now, store));
        }
    }

    /// The previous window's total, read with this one's: a penalty longer than the window,
    /// earned in the last one, blocks the key here too. The instances that saw the key go
    /// over block it from then; one that hears of it only now blocks until the earliest end
    /// any of them can have (it went over after the last window began).
    fn read_previous(&mut self, p: &SyncedParams, previous: u64, window_start: Nanos, now: Nanos) {
        self.prev_global = self.prev_global.max(sat32(previous));
        self.flags.insert(KeyFlags::PREV_KNOWN);
        if previous > p.limit && p.cooldown_ns > p.window_ns {
            let until = (window_start - p.window_ns).saturating_add(p.cooldown_ns);
            if until > now && until > self.blocked_until(p, window_start) {
                self.set_blocked_until(p, window_start, until);
            }
        }
    }

    /// A reply that lists entries: the others as they list them (and the unlisted group of
    /// what the total holds beyond them), whether the key is settled as shared.
    fn take_entries(
        &mut self,
        p: &SyncedParams,
        shared: &mut Option<Shared>,
        (outcome, flight, node): (&FlushOutcome, &Flight, &str),
        (listed, unlisted): (u64, Option<Other>),
        window_start: Nanos,
        (now, store): (Nanos, StoreView),
    ) {
        let others_seen =
            listed > 0 || unlisted.is_some() || outcome.entries.iter().any(|e| &*e.node != node);
        let had_others = shared.as_ref().is_some_and(|x| !x.others.is_empty());
        let mut others = listed_others(
            p,
            shared,
            outcome,
            node,
            (window_start, now),
            unlisted.is_some(),
        );
        others.extend(unlisted);
        if had_others && others.is_empty() && store.fleet.max(p.expected_instances) > 1 {
            // Every other instance went quiet for two spans: gone, or quiet between two
            // bursts of a client that comes back on every instance at once. Settled as
            // shared, the key would now count as this instance's alone and take the
            // whole room at the next burst (87 of a burst whose room was 59 an instance,
            // the mix of users). It is settled again as a new key is: the instances not
            // listed count as this one does until a boundary reply and a read after a
            // boundary's flushes have landed show nobody else counts it.
            // An early read that finds them so keeps the window's boundary reply: sent once
            // a boundary's flushes have landed, it is itself such a read and settles the key
            // below. Unsettled by it, a key refused on the phantoms (a client pinned here,
            // a trickle elsewhere that stopped) had nothing to flush at the next boundaries
            // and no reply to settle it there: locked out for most of the window (82 of 300).
            let sharing = self.flags.sharing();
            let unsettled = if flight.early && sharing.boundary_replied() {
                Sharing::OneBoundaryReply
            } else {
                sharing.unsettle()
            };
            self.flags.set_sharing(unsettled);
        }
        set_others(shared, others, now);
        if self.settles(
            p,
            shared.as_ref(),
            others_seen,
            (flight, window_start),
            (now, store),
        ) {
            self.flags.set_sharing(Sharing::Settled);
        }
        self.flags.set_sharing(self.flags.sharing().entries_seen());
        if model::phantoms(p, &self.view(), shared.as_ref(), now, store.fleet) > 0 {
            // Instances not listed yet get their share of the room: a budget, kept with
            // the key's shared state.
            shared.get_or_insert_with(|| Shared::heard_at(now));
        }
    }

    /// This instance's budget until its next reply, set at this one: its share of the room,
    /// less what the others may have spent when the reply may lack their flushes; an early
    /// sync asked when the reply may have come before the others' flushes of the boundary
    /// and the budget left that out, will not last the span (others listed), or the key may
    /// reach its limit within two spans.
    fn set_reply_budget(
        &mut self,
        p: &SyncedParams,
        x: &mut Shared,
        reply: Reply,
        window_start: Nanos,
        (now, store): (Nanos, StoreView),
    ) {
        let Reply {
            early,
            group_behind,
            refused,
            cold_start,
        } = reply;
        let phantoms = model::phantoms(p, &self.view(), Some(x), now, store.fleet);
        let previous = x.budget();
        let split = if early && cold_start {
            model::Split::ColdStart
        } else if !early && group_behind {
            model::Split::Behind
        } else if early
            && previous.is_some_and(|b| {
                b.even || (p.span_of(b.at) != p.span_of(now) && self.prev_global > 0)
            })
        {
            // An early reply to a budget split evenly (set at the first request after a quiet
            // span), or to a read asked before any budget of this span (the estimate refused
            // the first request after a quiet span): the rates it reads are as old as the
            // quiet, the others' entries moved up to now by the read, and a burst on every
            // instance at once looks like this instance's alone. Split by those rates, an
            // instance that met a surge with a trickle's rate took 2% of the room while the
            // others' stale rates held the rest (`mix/five.yaml`, seed 5: a window at 155 of
            // 300; seed 2 of the surge alone: an instance admitted 16 of the 78 it met, a
            // window at 252 of 300). Evenly again, the surge's busy windows under 95% over
            // 24 draws went from 11 to 5 (the least from 67% to 83%), none over by more. Not
            // in a key's first window, whose budgets come from cold shares: there the even
            // split took the short mix's bursty user to 10.8% over in one draw of 24.
            model::Split::Even
        } else {
            model::Split::ByDemand
        };
        let mut budget = model::budget(
            p,
            &self.view(),
            x,
            (window_start, now),
            (phantoms, store.fleet),
            split,
        );
        let listed_behind = !early && self.listed_behind(p, x, now);
        // An early reply to an instance whose budget was set mid-span (at the first request
        // after a quiet span, or at an early reply), the key listed by others before: that
        // budget was split with rates as old as the quiet, and so were the others' if they
        // met the same burst. Having spent it, or been refused before this read (the estimate
        // of the others stops an instance short of its budget when they met the key's last
        // burst too), is the sign: they may hold budgets this reply's room still counts. The
        // others listed may be as old as the window's first flush (a trickle of 0.2/s on
        // five instances flushes the key rarely); they count all the same. Measured
        // (`stress/sparse-surge.yaml`, a trickle then a surge on five instances: first
        // windows at 329-372 of 300 before, 296-360 after; real processes, the surge of
        // `mix/five.yaml`: windows at 321 and 323 of 300, an instance refused 7 into a
        // budget of 60 read a total of 8 and took 58 more, to within 1% in the simulator and
        // on real processes). So does a spent budget split evenly, wherever it was set: an
        // even part says nothing of this instance's demand either. Not after a boundary
        // budget split by demand: with every rate fresh, a spent one is this instance's own
        // demand (a client pinned to it), and leaving the others' part out locked the next
        // burst out.
        let stale_split = early
            && previous.is_some_and(|b| b.even || set_mid_span(p, b.at, now))
            && x.others.iter().any(|o| !o.unlisted());
        let capped = match previous {
            Some(b) if stale_split => self.unflushed_by_others(b, budget, refused),
            Some(b) if listed_behind || (!early && group_behind) => {
                self.unflushed_by_others(b, budget, false)
            }
            _ => 0,
        }
        .min(budget.amount);
        budget.amount = budget.amount.saturating_sub(capped);
        let span_left = (p.span_of(now) + 1)
            .saturating_mul(p.span_ns)
            .saturating_sub(now);
        let short = f64::from(budget.amount) < self.demand.hits_in(span_left);
        let mut read_again = false;
        // A boundary reply that may lack the others' flushes of the boundary reads again once
        // they have landed when the budget will not last the span (others listed: see
        // `listed_behind` for the group), or when the key may reach its limit within two
        // spans: its room is then mostly what the others flushed moments after this reply.
        // That read gives the span its early sync back once it answers
        // (`Activity::ask_boundary_read`). Without it, a tenant whose users arrived over the window
        // had an instance read 164 where the count was 230, and the fleet admitted 104 in a
        // span with a room of 70 (`mix/five.yaml`, seed 18: a first window at 334 of 300;
        // with the read, none over).
        let behind = listed_behind || group_behind;
        let near = || model::nears_limit(p, &self.view(), x, (window_start, now), phantoms);
        let recorded = self.activity.contains(Activity::RECORDED);
        if !early && (capped > 0 || (listed_behind && short) || (behind && (recorded || near()))) {
            read_again = self.ask_early_in_span(p, now);
        }
        if !early && behind && !read_again {
            // No early sync reads the others' flushes of this boundary after this reply: the
            // count it read may lack them, and a budget set from it later after a quiet span
            // reads first (`KeyState::read_first`).
            budget.read = Read::BeforeOthers;
        }
        x.set_budget(budget);
    }

    /// Asks for an early sync in `now`'s span (at a reply, after which it reads again once
    /// the boundary's flushes have landed): whether this call asked. With no check in this
    /// span yet, the early sync asked in the last one is not this span's: the span starts
    /// here (a check must not start it again and ask a second time).
    fn ask_early_in_span(&mut self, p: &SyncedParams, now: Nanos) -> bool {
        self.enter_span(p, now);
        self.activity.ask_boundary_read()
    }

    /// What a budget set at this reply leaves out of the room it read, when the reply may
    /// lack the others' latest counts (one to a boundary's flush that came before the others'
    /// flushes of it) and this instance spent its last budget (or, `refused`, was refused
    /// before the read): the others may have spent theirs too since their last flush, which
    /// their demand rates do not tell when the traffic is a burst on every instance at once.
    /// Their budgets were the rest of the room this one's was a share of, and they are taken
    /// to have spent as much of them as this instance did of its own; this one's share of
    /// that is left out until a read shows their counts (at a boundary: the early sync this
    /// asks for, moments later).
    /// Measured in the simulator (`mix/surge.yaml`, a burst a window on five instances after
    /// a trickle): warm windows at 304-315 of 300 before, 297-303 after; the first reply
    /// after the burst read 18 for the others, who had admitted some 190 since, and set a
    /// budget of 182 of an empty room.
    fn unflushed_by_others(&self, previous: Budget, budget: Budget, refused: bool) -> u32 {
        let since = self.local.saturating_sub(previous.local_at);
        let spent = since >= previous.amount || refused;
        if !spent || previous.amount == 0 || previous.share <= 0.0 {
            return 0;
        }
        let share = f64::from(previous.share).max(0.01);
        let others = f64::from(since.min(previous.amount)) * (1.0 - share) / share;
        (others * f64::from(budget.share))
            .ceil()
            .min(f64::from(u32::MAX)) as u32
    }

    /// Whether a reply to a span-boundary flush may have come before the others' flushes of
    /// the same boundary: instances flush at the same boundaries, and the first to land reads
    /// the others as they were a span ago, taking their counts since from their demand. An
    /// early sync moments later reads them as they are, when the budget set now will not last
    /// the span, leaves out what the others may have spent
    /// ([`KeyState::unflushed_by_others`]), or the key nears its limit
    /// ([`model::nears_limit`]). A reply that shows the others as one unlisted group, one of
    /// whom flushed at the last boundary, may have come before them too; it reads again only
    /// for what they may have spent or a key nearing its limit, not for a short budget (a
    /// group's demand is the group's, and an early sync asked for a short budget would take
    /// the span's one read a key quiet since needs: a client moving to another instance).
    fn listed_behind(&self, p: &SyncedParams, shared: &Shared, now: Nanos) -> bool {
        shared
            .live_others(p, now)
            .any(|o| !o.unlisted() && flushed_in_last_span(p, o, now))
    }

    /// Whether a reply with entries settles whether the key is shared. With a fleet of
    /// several instances: once the reply lists all of them, or at the second reply to a
    /// span-boundary flush in the same window when it shows another instance (by then every
    /// instance that counted the key in the window before the last boundary has flushed it),
    /// or, once one such reply came, at the reply to a read sent late enough in its span for
    /// every flush of the span's boundary to have landed ([`SyncedParams::read_ahead_margin`]).
    /// A second boundary reply that shows nobody else asks for that read instead: the
    /// instances that first counted the key since the last boundary flush it at this one,
    /// maybe after this reply. With no fleet known: once a reply shows another instance, or
    /// at the second reply.
    ///
    /// A reply to the flush at the window's own start does not count towards the two: nobody
    /// had counted in the new window before it, and the others' counts of the window before
    /// are in that window's entries, not this one's. Counted, it let an instance that met a
    /// key near the end of a window settle it as its own at the next window's first
    /// boundaries, whose flushes all land at once (each reply before the others'), and admit
    /// the whole limit alone for a span (simulated: 28 of 20 in a window of
    /// `first-window/churn-3`).
    fn settles(
        &mut self,
        p: &SyncedParams,
        shared: Option<&Shared>,
        others_seen: bool,
        (flight, window_start): (&Flight, Nanos),
        (now, store): (Nanos, StoreView),
    ) -> bool {
        let parties = store.fleet.max(p.expected_instances);
        if parties <= 1 {
            return others_seen || self.seen_entries();
        }
        let listed = shared.map_or(0, |x| x.live_others(p, now).count() as u64);
        if listed + 1 >= parties {
            return true;
        }
        if flight.early {
            // Not for a limit too small to share: one more instance's cold share is a large
            // part of it, and it would only be read at the next flush.
            let sent = flight.sent_at;
            let span_start = p.span_of(sent).saturating_mul(p.span_ns);
            return p.shareable(parties)
                && self.flags.sharing().boundary_replied()
                && sent >= span_start + p.read_ahead_margin();
        }
        if p.span_of(now) == p.span_of(window_start) {
            return false;
        }
        let before = self.flags.sharing();
        let (phase, second) = before.boundary_reply();
        self.flags.set_sharing(phase);
        if second && !before.settled() && !others_seen && p.shareable(parties) {
            // Alone in this reply, which may have come before the flushes of this boundary of
            // instances that first counted the key since the last one: settled as its own, the
            // key would have no budget for the span, and a burst on every instance would take
            // the whole room here (`fleet_changes.rs`: 332 of 300). The read after the
            // boundary's flushes settles it.
            self.ask_early_in_span(p, now);
            return false;
        }
        second
    }
}

/// What a reply that sets the budget was: to an early sync; one that may have come before
/// the flushes of an unlisted group, one of whom flushed at the last boundary; to a flush taken
/// after requests were refused; the first with entries for the key (its cold start).
#[derive(Clone, Copy, Debug)]
struct Reply {
    early: bool,
    group_behind: bool,
    refused: bool,
    cold_start: bool,
}

/// Whether `other` was last heard of in the span before `now`'s: it flushed at the last
/// boundary.
fn flushed_in_last_span(p: &SyncedParams, other: &Other, now: Nanos) -> bool {
    let span_start = p.span_of(now).saturating_mul(p.span_ns);
    (span_start.saturating_sub(p.span_ns)..span_start).contains(&other.at)
}

/// Whether a budget was set in `now`'s span after its boundary's replies (at the first request
/// after a quiet span, or at an early reply).
fn set_mid_span(p: &SyncedParams, at: Nanos, now: Nanos) -> bool {
    let span_start = p.span_of(now).saturating_mul(p.span_ns);
    at >= span_start + p.settle_margin()
}

/// A flush that only added its count (the key was ours alone, or far below its limit):
/// anything beyond our count is someone else's, one unlisted group. The entries known from
/// before go: their counts are in that total too. Except, with nothing beyond our count, the
/// ones carried from the previous window (entries or its unlisted group): they have not
/// flushed in this one yet (its boundaries' flushes land together), and dropping them would
/// leave the key to this instance alone for a span.
fn others_from_count_only(
    shared: &mut Option<Shared>,
    unlisted: Option<Other>,
    window_start: Nanos,
    now: Nanos,
) {
    let mut others = shared
        .as_mut()
        .map(|x| std::mem::take(&mut x.others))
        .unwrap_or_default();
    others.retain(|o| unlisted.is_none() && o.at <= window_start);
    others.extend(unlisted);
    set_others(shared, others, now);
}
