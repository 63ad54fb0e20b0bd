//! Property tests of [`KeyState`] against a model store: random checks, flushes whose replies
//! land, are lost or arrive without the key knowing (a doubt, settled as the engine's
//! `Delivery` settles it), and a clock that jumps back.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use sluice_config::Policy;
use sluice_core::{Decision, Nanos};
use sluice_store::{FlushOutcome, NodeEntry};

use super::key_state::{Drain, Flight, KeyState, Replies, Sending};
use super::model;
use super::params::SyncedParams;
use super::shared::Shared;
use crate::health::{StoreHealth, StoreView};

const SECOND: u64 = 1_000_000_000;
const WINDOW: u64 = 60 * SECOND;

/// What becomes of a flush.
#[derive(Clone, Copy, Debug)]
enum Fate {
    /// The store applies it and answers.
    Landed,
    /// It never reaches the store.
    Lost,
    /// The store applies it, but the answer never comes (a timeout after sending).
    Doubt,
}

#[derive(Clone, Debug)]
enum Op {
    /// Time moves on by `dt`, then a request of `cost`.
    Check { dt: u64, cost: u64 },
    /// The clock goes back by `dt`.
    Back { dt: u64 },
    /// The flush takes the key's counts (if none are in flight).
    Drain { dt: u64 },
    /// The flush in flight is answered.
    Answer(Fate),
    /// The store is unreachable for the next checks (or answers again).
    Health(bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..WINDOW / 8, prop_oneof![9 => 1..4u64, 1 => 1..80u64])
            .prop_map(|(dt, cost)| Op::Check { dt, cost }),
        1 => (0..WINDOW / 2).prop_map(|dt| Op::Back { dt }),
        3 => (0..WINDOW / 4).prop_map(|dt| Op::Drain { dt }),
        3 => prop_oneof![6 => Just(Fate::Landed), 1 => Just(Fate::Lost), 1 => Just(Fate::Doubt)]
            .prop_map(Op::Answer),
        1 => any::<bool>().prop_map(Op::Health),
    ]
}

fn params() -> impl Strategy<Value = SyncedParams> {
    (
        1..60u64,
        1..7u64,
        prop_oneof![Just(Policy::Predictive), Just(Policy::Reactive)],
        any::<bool>(),
        prop_oneof![Just(0), Just(10 * SECOND)],
        1..4u64,
    )
        .prop_map(
            |(limit, spans, policy, sliding, cooldown_ns, expected_instances)| SyncedParams {
                limit,
                window_ns: WINDOW,
                spans,
                span_ns: WINDOW / spans,
                cooldown_ns,
                policy,
                sliding,
                expected_instances,
            },
        )
}

/// One flush item as the model sent it: its window, its count, and what the engine's
/// delivery took off it as already known to be in the store.
struct Sent {
    window: u64,
    count: u64,
    taken: u64,
}

/// One key and a model store, with the accounts the properties are checked against.
struct World {
    p: SyncedParams,
    key: KeyState,
    shared: Option<Shared>,
    me: Arc<str>,
    now: Nanos,
    /// The latest time seen (the clock may go back).
    latest: Nanos,
    health: StoreHealth,
    /// Instances the store knows of (phantoms come from it).
    fleet: u64,
    /// Admitted by the key, per window.
    admitted: BTreeMap<u64, u64>,
    /// This instance's counts the store holds, per window.
    store: BTreeMap<u64, u64>,
    /// Counts known to be in the store while the key still has them as unsent (a doubt that
    /// arrived), per window: taken off the next items of that window.
    landed: BTreeMap<u64, u64>,
    flight: Option<(Flight, Vec<Sent>, Option<NodeEntry>, bool)>,
    /// Another instance's count per window (zero: the key is this instance's alone), and
    /// what it adds at each reply.
    other: BTreeMap<u64, u64>,
    other_step: u64,
}

impl World {
    fn new(p: SyncedParams, other_step: u64) -> Self {
        Self {
            p,
            key: KeyState::default(),
            shared: None,
            me: Arc::from("me"),
            now: 1_000 * WINDOW + 7 * SECOND,
            latest: 1_000 * WINDOW + 7 * SECOND,
            health: StoreHealth::Answering,
            fleet: 1 + other_step % 4,
            admitted: BTreeMap::new(),
            store: BTreeMap::new(),
            landed: BTreeMap::new(),
            flight: None,
            other: BTreeMap::new(),
            other_step,
        }
    }

    fn view(&self) -> StoreView {
        StoreView {
            health: self.health,
            fleet: self.fleet,
        }
    }

    fn run(&mut self, op: &Op) {
        self.step(op);
        self.latest = self.latest.max(self.now);
    }

    fn step(&mut self, op: &Op) {
        match *op {
            Op::Check { dt, cost } => {
                self.now += dt;
                let store = self.view();
                let (d, _) = self
                    .key
                    .check(&self.p, self.shared.as_mut(), self.now, cost, store);
                if let Decision::Allowed(_) = d {
                    let w = self.key.pending(self.p.window_of(self.now)).0;
                    *self.admitted.entry(w).or_default() += cost;
                }
            }
            Op::Back { dt } => self.now = self.now.saturating_sub(dt),
            Op::Drain { dt } if self.flight.is_none() => {
                self.now += dt;
                // Odd steps stand for early syncs, even ones for span-boundary flushes.
                let early = dt % 2 == 1;
                let drain =
                    self.key
                        .drain(&self.p, self.shared.as_mut(), &self.me, self.now, early);
                if let Drain::Send(Sending {
                    flight,
                    entry,
                    first_write,
                }) = drain
                {
                    let mut sent = Vec::new();
                    let items = [
                        flight.carry.map(|c| (flight.window - 1, c)),
                        flight.current.map(|c| (flight.window, c)),
                    ];
                    for (window, count) in items.into_iter().flatten() {
                        let count = u64::from(count);
                        let taken = self.landed.get(&window).map_or(0, |&n| n.min(count));
                        sent.push(Sent {
                            window,
                            count,
                            taken,
                        });
                    }
                    self.flight = Some((flight, sent, entry, first_write));
                }
            }
            Op::Drain { .. } => {}
            Op::Answer(fate) => self.answer(fate),
            Op::Health(up) => {
                self.health = if up {
                    StoreHealth::Answering
                } else {
                    StoreHealth::Unreachable
                };
            }
        }
    }

    fn answer(&mut self, fate: Fate) {
        let Some((flight, sent, entry, first_write)) = self.flight.take() else {
            return;
        };
        // The store applies what was sent (the count minus what it is known to hold).
        if matches!(fate, Fate::Landed | Fate::Doubt) {
            for s in &sent {
                *self.store.entry(s.window).or_default() += s.count - s.taken;
            }
        }
        // As the engine's delivery keeps them: counts known to be in the store for items that
        // failed; a doubt that arrived adds what it carried.
        self.landed.clear();
        for s in &sent {
            let known = match fate {
                Fate::Landed => 0,
                Fate::Lost => s.taken,
                Fate::Doubt => s.count,
            };
            if known > 0 {
                self.landed.insert(s.window, known);
            }
        }
        let outcomes: Vec<FlushOutcome> = sent
            .iter()
            .map(|s| {
                let other = self.other.entry(s.window).or_default();
                *other += self.other_step;
                let other = *other;
                let total = self.store.get(&s.window).copied().unwrap_or(0) + other;
                let previous = self.store.get(&(s.window - 1)).copied().unwrap_or(0)
                    + self.other.get(&(s.window - 1)).copied().unwrap_or(0);
                let mut entries = Vec::new();
                if let Some(mine) = entry.as_ref().filter(|_| s.window == flight.window) {
                    entries.push(mine.clone());
                    if other > 0 {
                        entries.push(NodeEntry {
                            node: Arc::from("other"),
                            count: other,
                            at_ms: self.now / 1_000_000,
                            rate_milli: 2_000,
                        });
                    }
                }
                FlushOutcome {
                    total,
                    previous_total: first_write.then_some(previous),
                    entries,
                }
            })
            .collect();
        let replies = match fate {
            Fate::Landed => {
                let at = |w: u64| {
                    sent.iter()
                        .position(|s| s.window == w)
                        .map(|i| &outcomes[i])
                };
                Replies {
                    carry: flight.carry.and_then(|_| at(flight.window - 1)),
                    current: flight.current.and_then(|_| at(flight.window)),
                }
            }
            _ => Replies::default(),
        };
        let store = self.view();
        self.key.absorb(
            &self.p,
            &mut self.shared,
            &flight,
            replies,
            "me",
            (self.now, store),
        );
    }

    /// Counts are conserved in the key's window and the one before: admitted = in the store +
    /// unsent + in flight - known to be in the store twice over; and in every window the store
    /// never holds more than was admitted.
    fn check_conservation(&self) -> Result<(), TestCaseError> {
        let (kw, unflushed, carry) = self.key.pending(self.p.window_of(self.now));
        let in_flight = |w: u64| -> u64 {
            self.flight.as_ref().map_or(0, |(_, sent, _, _)| {
                sent.iter().filter(|s| s.window == w).map(|s| s.count).sum()
            })
        };
        let get = |m: &BTreeMap<u64, u64>, w: u64| m.get(&w).copied().unwrap_or(0);
        let previous = kw.checked_sub(1).map(|w| (w, u64::from(carry)));
        for (w, unsent) in [(kw, u64::from(unflushed))].into_iter().chain(previous) {
            let accounted = get(&self.store, w) + unsent + in_flight(w) - get(&self.landed, w);
            prop_assert_eq!(
                get(&self.admitted, w),
                accounted,
                "window {} (key's {})",
                w,
                kw
            );
        }
        for (w, &stored) in &self.store {
            prop_assert!(
                stored <= get(&self.admitted, *w),
                "window {} counted twice",
                w
            );
        }
        Ok(())
    }

    /// The budget left is never negative: what the key admitted since its budget was set stays
    /// within the budget as it stood at the latest time seen (a sliding window's budget grows
    /// with time, so after the clock goes back it is smaller than when those were admitted;
    /// the key then admits nothing more until it has room again).
    fn check_budget(&self) -> Result<(), TestCaseError> {
        let Some(shared) = &self.shared else {
            return Ok(());
        };
        let Some(budget) = shared.budget() else {
            return Ok(());
        };
        let (kw, _, _) = self.key.pending(self.p.window_of(self.now));
        let window_start = self.p.window_start(kw);
        let since = u64::from(self.key.local.saturating_sub(budget.local_at));
        let now = self.latest.max(budget.at);
        let allowed = model::budget_now(&self.p, &self.key.view(), &budget, window_start, now);
        prop_assert!(
            since <= allowed,
            "spent {} of a budget of {}",
            since,
            allowed
        );
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn counts_are_conserved_and_a_lone_instance_keeps_to_its_limit(
        p in params(),
        ops in prop::collection::vec(op(), 1..200),
    ) {
        let mut world = World::new(p.clone(), 0);
        for op in &ops {
            world.run(op);
            world.check_conservation()?;
        }
        for (w, &n) in &world.admitted {
            prop_assert!(n <= p.limit, "window {}: admitted {} of {}", w, n, p.limit);
        }
    }

    #[test]
    fn a_shared_key_conserves_counts_and_never_overspends_its_budget(
        p in params(),
        other_step in 1..6u64,
        ops in prop::collection::vec(op(), 1..200),
    ) {
        let mut world = World::new(p, other_step);
        for op in &ops {
            world.run(op);
            world.check_conservation()?;
            world.check_budget()?;
        }
    }
}
