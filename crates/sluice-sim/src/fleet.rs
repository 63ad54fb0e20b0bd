//! The simulated fleet: one real `Engine` per node, each on its own manual clock (skewed as the
//! scenario says), all sharing one `MemoryStore` whose clock, latency and outages follow the
//! scenario; and the nodes' flush timers, fired in time order as `run_flush_loop` fires them
//! in `sluice serve`.
//!
//! Nothing waits on a runtime: the futures are polled here. A flush that the store has not
//! answered yet (latency) stays in flight while the node keeps deciding requests, and is polled
//! at the moments its round trip moves on: when it reaches the store (half its latency) and
//! when the answer is back (all of it). Polled on a coarser timer, every flight of a round
//! landed at the same poll in node order: replies under a few milliseconds all looked alike,
//! and a reply that comes before the others' flushes of a boundary never did.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use sluice_config::RuleSet;
use sluice_core::{Clock, ManualClock};
use sluice_engine::{EARLY_SYNC_DELAY, Engine, EngineOptions, FlushReport};
use sluice_store::MemoryStore;

use crate::report::EstimateSample;
use crate::scenario::{Latency, Scenario};
use crate::traffic::Rng;

pub(crate) const NS: u64 = 1_000_000_000;
/// How soon a leaving node whose last flush has been answered takes itself off the fleet's
/// list, simulated nanoseconds.
const LEAVE_NS: u64 = 1_000_000;

fn poll_once<F: Future + ?Sized>(f: Pin<&mut F>) -> Poll<F::Output> {
    f.poll(&mut Context::from_waker(Waker::noop()))
}

/// The output of a future that cannot wait: the simulator adds latency to flushes only.
pub(crate) fn ready<F: Future>(f: F) -> F::Output {
    match poll_once(std::pin::pin!(f)) {
        Poll::Ready(v) => v,
        Poll::Pending => unreachable!("the simulator adds latency to flushes only"),
    }
}

/// The nodes and the store they share. Times given to its methods are true times in
/// nanoseconds since the start (`t0` on the store's clock).
pub(crate) struct Fleet {
    pub(crate) t0: u64,
    store_clock: ManualClock,
    pub(crate) store: Arc<MemoryStore>,
    outages: Vec<(u64, u64)>,
    skews: Vec<i64>,
    clocks: Vec<ManualClock>,
    pub(crate) engines: Vec<Engine>,
}

impl Fleet {
    /// The fleet of `s` running `rules`, the store's clock at `t0`. The nodes that start with
    /// the run have been up for a moment, as a fleet usually has: each has announced itself
    /// and heard how many there are (two rounds, so that the first to announce hears of the
    /// others too).
    pub(crate) fn new(rules: &RuleSet, s: &Scenario, t0: u64) -> Self {
        let store_clock = ManualClock::new(t0);
        let store = Arc::new(MemoryStore::new(Arc::new(store_clock.clone())));
        let skew_of = |i: usize| s.nodes.skew_ms.get(i).copied().unwrap_or(0) * 1_000_000;
        let skews: Vec<i64> = (0..s.nodes.count).map(skew_of).collect();
        let clocks: Vec<ManualClock> = skews
            .iter()
            .map(|&skew| ManualClock::new(t0.saturating_add_signed(skew)))
            .collect();
        let engines: Vec<Engine> = (0..s.nodes.count)
            .map(|i| {
                let options = EngineOptions {
                    node_id: Some(format!("node-{i}")),
                    expected_instances: s.nodes.expected.unwrap_or(1),
                    // Futures are polled here on manual clocks: no tokio timers.
                    exact_budget_timer: false,
                    follow_store_clock: s.store.clock,
                    ..EngineOptions::default()
                };
                let clock = Arc::new(clocks[i].clone()) as Arc<dyn Clock>;
                Engine::new(rules, &Default::default(), store.clone(), clock, options)
            })
            .collect();
        for _ in 0..2 {
            for (i, engine) in engines.iter().enumerate() {
                if s.nodes.join_ns(i) == 0 {
                    ready(engine.announce());
                }
            }
        }
        Self {
            t0,
            store_clock,
            store,
            outages: s.store.outages.clone(),
            skews,
            clocks,
            engines,
        }
    }

    /// The store's clock at `x`, and the store down during the scenario's outages.
    pub(crate) fn set_store(&self, x: u64) {
        self.store_clock.set(self.t0 + x);
        let secs = x / NS;
        let down = self.outages.iter().any(|&(a, b)| (a..b).contains(&secs));
        self.store.set_available(!down);
    }

    /// Node `i`'s clock at `x` (with its skew).
    pub(crate) fn set_clock(&self, i: usize, x: u64) {
        self.clocks[i].set((self.t0 + x).saturating_add_signed(self.skews[i]));
    }

    /// How far node `i`'s engine clock reads ahead of true time: its skew, corrected by the
    /// offset to the store's clock it measured.
    fn shift(&self, i: usize) -> i64 {
        self.skews[i].saturating_add(self.engines[i].clock_offset_ns())
    }
}

/// Half of a round trip rounded up, at least a nanosecond: the store's side of a call waits
/// half its latency out and the rest back.
fn half(latency: Duration) -> u64 {
    (latency.as_nanos() as u64).div_ceil(2).max(1)
}

type Flight<'e> = Pin<Box<dyn Future<Output = FlushReport> + 'e>>;

/// A simulated node's timer state.
struct NodeTimer<'e> {
    /// Next time its timer fires, ns since the start (true time).
    next: u64,
    inflight: Option<Flight<'e>>,
    /// Half the round trip of the flight in flight: it reaches the store after one step and
    /// its answer is back after two (later calls of the same flight take no time).
    step: u64,
    /// When its early sync goes (keys asked for one), ns since the start.
    early: Option<u64>,
    final_sent: bool,
    gone: bool,
}

impl NodeTimer<'_> {
    /// Its next event: the timer or an early sync.
    fn due(&self) -> u64 {
        self.early.map_or(self.next, |e| e.min(self.next))
    }

    /// Drops the flush in flight once it has completed.
    fn poll_inflight(&mut self) {
        if let Some(f) = self.inflight.as_mut()
            && poll_once(f.as_mut()).is_ready()
        {
            self.inflight = None;
        }
    }
}

/// A flush's round trip to the store, drawn log-normal through the scenario's median and 99th
/// percentile (`store.latency_ms`; none: no latency).
pub(crate) struct LatencyDraw {
    rng: Rng,
    latency: Option<Latency>,
}

impl LatencyDraw {
    /// Draws from `latency` with the scenario's `seed` and a `stream` of its own.
    pub(crate) fn new(seed: u64, stream: u64, latency: Option<Latency>) -> Self {
        Self {
            rng: Rng::seeded(seed, stream),
            latency,
        }
    }

    pub(crate) fn sample(&mut self) -> Duration {
        let Some(l) = self.latency else {
            return Duration::ZERO;
        };
        let ms = match l.p99 {
            Some(p99) if p99 > l.median && l.median > 0.0 => {
                let sigma = (p99 / l.median).ln() / 2.326;
                (l.median.ln() + sigma * self.rng.normal()).exp()
            }
            _ => l.median,
        };
        Duration::from_secs_f64((ms / 1000.0).min(600.0))
    }
}

/// The nodes' flush timers over a [`Fleet`], and what the observer node's flushes show of the
/// busiest key.
pub(crate) struct Timers<'e> {
    fleet: &'e Fleet,
    /// When each node leaves (ns since the start).
    leave: Vec<Option<u64>>,
    /// When each node crashes (ns since the start).
    crash: Vec<Option<u64>>,
    nodes: Vec<NodeTimer<'e>>,
    latency: LatencyDraw,
    tick_ns: u64,
    /// The node whose view of the busiest key is sampled at its flushes, and that key.
    observer: (usize, &'e str),
    pub(crate) estimates: Vec<EstimateSample>,
}

impl<'e> Timers<'e> {
    pub(crate) fn new(fleet: &'e Fleet, s: &Scenario, observer: (usize, &'e str)) -> Self {
        let span_ns = s.rule.window_s * NS / u64::from(s.rule.spans);
        let nodes = (0..s.nodes.count)
            .map(|i| NodeTimer {
                next: s.nodes.join_ns(i),
                inflight: None,
                step: 1,
                early: None,
                final_sent: false,
                gone: false,
            })
            .collect();
        let leave = (0..s.nodes.count).map(|i| s.nodes.leave_ns(i)).collect();
        Self {
            fleet,
            leave,
            crash: (0..s.nodes.count).map(|i| s.nodes.crash_ns(i)).collect(),
            nodes,
            latency: LatencyDraw::new(s.seed, 0xfeed, s.store.latency_ms),
            tick_ns: span_ns.clamp(1, NS),
            observer,
            estimates: Vec::new(),
        }
    }

    /// Node `i` was asked for an early sync at `x`: it leaves [`EARLY_SYNC_DELAY`] later, or
    /// once the engine's clock reads `early_sync_not_before` (`run_flush_loop` waits for
    /// both), unless one asked before leaves sooner.
    pub(crate) fn ask_early(&mut self, i: usize, x: u64) {
        let at = self.early_at(i, x);
        let node = &mut self.nodes[i];
        node.early = Some(node.early.map_or(at, |e| e.min(at)));
    }

    /// When an early sync node `i` is asked for at `x` leaves, in true time.
    fn early_at(&self, i: usize, x: u64) -> u64 {
        let delay = EARLY_SYNC_DELAY.as_nanos() as u64;
        (x + delay).max(self.not_before(i))
    }

    /// Node `i`'s `early_sync_not_before`, in true time.
    fn not_before(&self, i: usize) -> u64 {
        let fleet = self.fleet;
        fleet.engines[i]
            .early_sync_not_before()
            .saturating_add_signed(-fleet.shift(i))
            .saturating_sub(fleet.t0)
    }

    /// Fires every node timer due up to `until`, in time order.
    pub(crate) fn advance(&mut self, until: u64) {
        loop {
            let Some((i, x)) = self
                .nodes
                .iter()
                .enumerate()
                .filter(|(_, n)| !n.gone)
                .map(|(i, n)| (i, n.due()))
                .min_by_key(|&(i, x)| (x, i))
            else {
                return;
            };
            if x > until {
                return;
            }
            if self.crash[i].is_some_and(|c| x >= c) {
                // Gone at once: what it counted since its last flush that landed is lost, a
                // flush in flight never answered, and its announcement ages out.
                let node = &mut self.nodes[i];
                node.inflight = None;
                node.gone = true;
                continue;
            }
            self.fleet.set_store(x);
            self.fleet.set_clock(i, x);
            let node = &self.nodes[i];
            if node.early.is_some_and(|e| e == x && e < node.next) {
                self.early_sync(i, x);
            } else {
                self.tick(i, x);
            }
        }
    }

    /// Node `i`'s early sync at `x`, as `run_flush_loop` sends it: after the flush in flight,
    /// and not before the time that flush's replies asked for (keys that read again once the
    /// others' flushes of the boundary have landed).
    fn early_sync(&mut self, i: usize, x: u64) {
        let fleet = self.fleet;
        let node = &mut self.nodes[i];
        node.poll_inflight();
        if node.inflight.is_some() {
            node.early = Some(x + node.step);
            return;
        }
        let not_before = self.not_before(i);
        let node = &mut self.nodes[i];
        if not_before > x {
            node.early = Some(not_before);
            return;
        }
        node.early = None;
        let latency = self.latency.sample();
        fleet.store.set_clock_latency(latency);
        let mut fut: Flight<'e> = Box::pin(fleet.engines[i].flush_early());
        if poll_once(fut.as_mut()).is_pending() {
            node.inflight = Some(fut);
            node.step = half(latency);
            node.next = node.next.min(x + node.step);
        }
        fleet.store.set_clock_latency(Duration::ZERO);
    }

    /// Node `i`'s timer at `x`: the flush in flight polled; with none, a new flush (a leaving
    /// node's last one, after which it is gone); the observer's sample; the next event.
    fn tick(&mut self, i: usize, x: u64) {
        let fleet = self.fleet;
        let leaving = self.leave[i].is_some_and(|l| x >= l);
        let node = &mut self.nodes[i];
        node.poll_inflight();
        let boundary = node.inflight.is_none();
        if boundary {
            let mut fut: Flight<'e> = if leaving {
                if node.final_sent {
                    // As `sluice serve` stops: its last flush answered, it takes itself off
                    // the fleet's list, and the others stop counting it at their next
                    // announcement (a node that crashed would be counted for `LIVE_FOR`).
                    ready(fleet.engines[i].leave_fleet());
                    node.gone = true;
                    return;
                }
                node.final_sent = true;
                Box::pin(fleet.engines[i].flush())
            } else {
                Box::pin(fleet.engines[i].flush_due())
            };
            let latency = self.latency.sample();
            fleet.store.set_clock_latency(latency);
            if poll_once(fut.as_mut()).is_pending() {
                node.inflight = Some(fut);
                node.step = half(latency);
            }
            fleet.store.set_clock_latency(Duration::ZERO);
        }
        if boundary && i == self.observer.0 && !leaving {
            self.sample(i, x);
        }
        self.schedule(i, x, leaving);
    }

    /// What node `i` knows of the busiest key at `x`.
    fn sample(&mut self, i: usize, x: u64) {
        let request = [("key", self.observer.1)];
        if let Some(info) = self.fleet.engines[i].key_info("sim", &request).first() {
            self.estimates.push(EstimateSample {
                t_s: x as f64 / 1e9,
                estimate: (info.estimate * 100.0).round() / 100.0,
                others_read: info.others_read,
                node_estimate: info.node_estimate,
                live_instances: info.live_instances,
            });
        }
    }

    /// Node `i`'s next events after its timer at `x`: an early sync a flush reply asked for
    /// (`run_flush_loop` wakes at once, and waits until the engine's clock reads
    /// `early_sync_not_before`), and its next tick.
    fn schedule(&mut self, i: usize, x: u64, leaving: bool) {
        let (fleet, tick_ns) = (self.fleet, self.tick_ns);
        let (engine, t0) = (&fleet.engines[i], fleet.t0);
        if self.nodes[i].early.is_none() && engine.early_sync_wanted() {
            self.nodes[i].early = Some(self.early_at(i, x));
        }
        let node = &mut self.nodes[i];
        node.next = if node.inflight.is_some() {
            x + node.step
        } else if leaving && !node.gone {
            x + LEAVE_NS
        } else {
            // The node's next tick on its engine's clock, in true time, as `run_flush_loop`
            // ticks.
            let shift = fleet.shift(i);
            let local = (t0 + x).saturating_add_signed(shift);
            let next_local = (local / tick_ns + 1) * tick_ns;
            next_local
                .saturating_add_signed(-shift)
                .saturating_sub(t0)
                .max(x + 1)
        };
    }
}
