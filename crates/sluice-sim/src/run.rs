//! Drives the real engine: one `Engine` per simulated node, each with its own manual clock, all
//! sharing one `MemoryStore` whose latency and outages follow the scenario. Nothing waits on a
//! runtime: the simulator polls the engines' futures itself and moves the clocks, so a run is
//! deterministic.
//!
//! Time moves from event to event: requests, and each node's flush timer, which fires on the
//! node's own (skewed) span boundaries like `run_flush_loop` does in `sluice serve`. A
//! flush that the store has not answered yet (latency) stays in flight while the node keeps
//! deciding requests, and is polled every 5 ms of simulated time until it completes. Latency
//! applies to flushes (and clock probes) only: an `exact` decision is atomic in the store, so
//! latency would change its response time, not what is admitted.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use sluice_core::{Clock, ManualClock};
use sluice_engine::{Engine, EngineOptions, FlushReport};
use sluice_store::MemoryStore;

use crate::policy::POLICIES;
use crate::report::{EstimateSample, PolicyReport, Report};
use crate::scenario::Scenario;
use crate::tally::{KeyCount, Tally};
use crate::traffic::{Arrival, Generated, Rng, generate};

const NS: u64 = 1_000_000_000;
/// How often an in-flight flush is polled, simulated nanoseconds.
const POLL_NS: u64 = 5_000_000;

fn poll_once<F: Future + ?Sized>(f: Pin<&mut F>) -> Poll<F::Output> {
    f.poll(&mut Context::from_waker(Waker::noop()))
}

fn ready<F: Future>(f: F) -> F::Output {
    match poll_once(std::pin::pin!(f)) {
        Poll::Ready(v) => v,
        Poll::Pending => unreachable!("the simulator adds latency to flushes only"),
    }
}

/// The rule file (domain `sim`, descriptor `key`) the simulator runs `policy` with: what real
/// processes need to run the same rule.
pub fn rule_file(policy: &str, s: &Scenario) -> String {
    let r = &s.rule;
    let cooldown = if r.cooldown_s > 0.0 {
        format!(", cooldown: {}ms", (r.cooldown_s * 1000.0).round() as u64)
    } else {
        String::new()
    };
    let expected = s.nodes.expected.unwrap_or(s.nodes.count as u64);
    // The synced policies: the rule's policy and what each adds to it.
    let synced = |policy: &str, more: &str| {
        format!(
            "mode: synced, policy: {policy}{more}, spans: {}{cooldown}",
            r.spans
        )
    };
    let (limit, extra) = match policy {
        "reactive" => (r.limit, synced("reactive", "")),
        "predictive" => (r.limit, synced("predictive", "")),
        "predictive_share" => (r.limit, synced("predictive", ", small_limits: share")),
        "predictive_sliding" => (r.limit, synced("predictive", ", algorithm: sliding_window")),
        "exact" => (r.limit, "mode: exact, on_store_error: deny".to_owned()),
        "local" => (r.limit, "mode: local".to_owned()),
        _ => ((r.limit / expected).max(1), "mode: local".to_owned()),
    };
    format!(
        "domain: sim\ndescriptors:\n  - key: key\n    rate_limit: {{ window: {}s, requests_per_unit: {limit}, {extra} }}\n",
        r.window_s
    )
}

fn rules_for(policy: &str, s: &Scenario) -> sluice_config::RuleSet {
    let domain = sluice_config::parse_domain(Path::new("scenario"), &rule_file(policy, s))
        .expect("generated rules are valid");
    sluice_config::RuleSet::new(vec![domain]).expect("one domain")
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

type Flight<'e> = Pin<Box<dyn Future<Output = FlushReport> + 'e>>;

/// A simulated node's timer state.
struct NodeTimer<'e> {
    /// Next time its timer fires, ns since the start (true time).
    next: u64,
    inflight: Option<Flight<'e>>,
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
}

fn simulate(
    policy: &str,
    s: &Scenario,
    traffic: &Generated,
    (busiest, observer): (u32, usize),
    progress: &mut dyn FnMut(u64),
) -> PolicyReport {
    let window_ns = s.rule.window_s * NS;
    let span_ns = window_ns / u64::from(s.rule.spans);
    let tick_ns = span_ns.clamp(1, NS);
    let t0 = 1_800_000_000_000_000_000u64.div_ceil(window_ns) * window_ns;
    let duration = s.duration_s * NS;
    let rules = rules_for(policy, s);
    let store_clock = ManualClock::new(t0);
    let store = Arc::new(MemoryStore::new(Arc::new(store_clock.clone())));
    let mut latency_rng = Rng::seeded(s.seed, 0xfeed);
    let mut sample_latency = || -> Duration {
        let Some(l) = s.store.latency_ms else {
            return Duration::ZERO;
        };
        let ms = match l.p99 {
            Some(p99) if p99 > l.median && l.median > 0.0 => {
                let sigma = (p99 / l.median).ln() / 2.326;
                (l.median.ln() + sigma * latency_rng.normal()).exp()
            }
            _ => l.median,
        };
        Duration::from_secs_f64((ms / 1000.0).min(600.0))
    };
    let skew_of = |i: usize| s.nodes.skew_ms.get(i).copied().unwrap_or(0) * 1_000_000;
    let skews: Vec<i64> = (0..s.nodes.count).map(skew_of).collect();
    let clocks: Vec<ManualClock> = skews
        .iter()
        .map(|&skew| ManualClock::new(t0.saturating_add_signed(skew)))
        .collect();
    let engines: Vec<Engine> = (0..s.nodes.count)
        .map(|i| {
            Engine::new(
                &rules,
                &Default::default(),
                store.clone(),
                Arc::new(clocks[i].clone()) as Arc<dyn Clock>,
                EngineOptions {
                    node_id: Some(format!("node-{i}")),
                    expected_instances: s.nodes.expected.unwrap_or(1),
                    // Futures are polled here on manual clocks: no tokio timers.
                    exact_budget_timer: false,
                    follow_store_clock: s.store.clock,
                    ..EngineOptions::default()
                },
            )
        })
        .collect();
    // The nodes that start with the run have been up for a moment, as a fleet usually has:
    // each has announced itself and heard how many there are (two rounds, so that the first
    // to announce hears of the others too).
    for _ in 0..2 {
        for (i, engine) in engines.iter().enumerate() {
            if s.nodes.join_s.get(i).copied().unwrap_or(0) == 0 {
                ready(engine.announce());
            }
        }
    }
    let mut timers: Vec<NodeTimer<'_>> = (0..s.nodes.count)
        .map(|i| NodeTimer {
            next: s.nodes.join_s.get(i).copied().unwrap_or(0) * NS,
            inflight: None,
            early: None,
            final_sent: false,
            gone: false,
        })
        .collect();
    let set_store = |x: u64| {
        store_clock.set(t0 + x);
        let secs = x / NS;
        store.set_available(!s.store.outages.iter().any(|&(a, b)| (a..b).contains(&secs)));
    };
    let busiest_request = [[(
        "key",
        traffic
            .keys
            .get(busiest as usize)
            .map_or("", String::as_str),
    )]];
    let mut estimates = Vec::new();
    let sliding = policy == "predictive_sliding";
    let mut tally = Tally {
        limit: s.rule.limit,
        busiest,
        over: Vec::new(),
        over_first: Vec::new(),
        over_warm: Vec::new(),
        over_by_window: BTreeMap::new(),
        admitted_by_window: BTreeMap::new(),
        busiest_series: BTreeMap::new(),
        counts: vec![KeyCount::default(); traffic.keys.len()],
        closed: Vec::new(),
        first_window: t0 / window_ns,
        attacks: &traffic.attacks,
        full_at: vec![None; traffic.attacks.len()],
        reactions: vec![None; traffic.attacks.len()],
    };

    // Fires every node timer due up to `until`, in time order.
    // Early syncs the engines asked for, taken into the node timers by `advance`.
    let early_asks: Vec<std::cell::Cell<Option<u64>>> =
        (0..s.nodes.count).map(|_| Default::default()).collect();
    let mut advance = |until: u64| {
        for (timer, ask) in timers.iter_mut().zip(&early_asks) {
            if let Some(at) = ask.take() {
                timer.early = Some(timer.early.map_or(at, |e| e.min(at)));
            }
        }
        loop {
            let Some((i, x)) = timers
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
            set_store(x);
            clocks[i].set((t0 + x).saturating_add_signed(skews[i]));
            let node = &mut timers[i];
            if node.early.is_some_and(|e| e == x && e < node.next) {
                // The early sync, as `run_flush_loop` sends it: after the flush in flight.
                if let Some(f) = node.inflight.as_mut()
                    && poll_once(f.as_mut()).is_ready()
                {
                    node.inflight = None;
                }
                if node.inflight.is_some() {
                    node.early = Some(x + POLL_NS);
                    continue;
                }
                node.early = None;
                store.set_clock_latency(sample_latency());
                let mut fut: Flight<'_> = Box::pin(engines[i].flush_early());
                if poll_once(fut.as_mut()).is_pending() {
                    node.inflight = Some(fut);
                    node.next = node.next.min(x + POLL_NS);
                }
                store.set_clock_latency(Duration::ZERO);
                continue;
            }
            let leaving = s
                .nodes
                .leave_s
                .get(i)
                .copied()
                .flatten()
                .is_some_and(|l| x >= l * NS);
            if let Some(f) = node.inflight.as_mut()
                && poll_once(f.as_mut()).is_ready()
            {
                node.inflight = None;
            }
            let boundary = node.inflight.is_none();
            if node.inflight.is_none() {
                let fut: Flight<'_> = if leaving {
                    if node.final_sent {
                        node.gone = true;
                        continue;
                    }
                    node.final_sent = true;
                    Box::pin(engines[i].flush())
                } else {
                    Box::pin(engines[i].flush_due())
                };
                store.set_clock_latency(sample_latency());
                let mut fut = fut;
                if poll_once(fut.as_mut()).is_pending() {
                    node.inflight = Some(fut);
                }
                store.set_clock_latency(Duration::ZERO);
            }
            if boundary
                && i == observer
                && !leaving
                && let Some(info) = engines[i].key_info("sim", &busiest_request[0]).first()
            {
                estimates.push(EstimateSample {
                    t_s: x as f64 / 1e9,
                    estimate: (info.estimate * 100.0).round() / 100.0,
                    others_read: info.others_read,
                    node_estimate: info.node_estimate,
                    live_instances: info.live_instances,
                });
            }
            let node = &mut timers[i];
            if node.early.is_none() && engines[i].early_sync_wanted() {
                // A flush reply asked for an early sync (`run_flush_loop` wakes at once, and
                // waits until the engine's clock reads `early_sync_not_before`).
                let shift = skews[i].saturating_add(engines[i].clock_offset_ns());
                let not_before = engines[i]
                    .early_sync_not_before()
                    .saturating_add_signed(-shift)
                    .saturating_sub(t0);
                let delay = sluice_engine::EARLY_SYNC_DELAY.as_nanos() as u64;
                node.early = Some((x + delay).max(not_before));
            }
            node.next = if node.inflight.is_some() || (leaving && !node.gone) {
                x + POLL_NS
            } else {
                // The node's next tick on its engine's clock (its own, corrected by the offset
                // to the store's it measured), in true time, as `run_flush_loop` ticks.
                let shift = skews[i].saturating_add(engines[i].clock_offset_ns());
                let local = (t0 + x).saturating_add_signed(shift);
                let next_local = (local / tick_ns + 1) * tick_ns;
                next_local
                    .saturating_add_signed(-shift)
                    .saturating_sub(t0)
                    .max(x + 1)
            };
        }
    };

    let (mut admitted, mut false_denials) = (0u64, 0u64);
    for (n, &Arrival { t, node, key, cost }) in traffic.arrivals.iter().enumerate() {
        if n % 4096 == 4095 {
            progress(4096);
        }
        advance(t);
        set_store(t);
        clocks[node as usize].set((t0 + t).saturating_add_signed(skews[node as usize]));
        let now = t0 + t;
        let window = now / window_ns;
        let request = [[("key", traffic.keys[key as usize].as_str())]];
        let verdict = ready(engines[node as usize].check("sim", &request, u64::from(cost)))
            .expect("the sim domain exists");
        let ask = &early_asks[node as usize];
        if ask.get().is_none() && engines[node as usize].early_sync_wanted() {
            ask.set(Some(t + sluice_engine::EARLY_SYNC_DELAY.as_nanos() as u64));
        }
        let count = tally.at(key, window);
        count.offered += u64::from(cost);
        if verdict.allowed {
            count.current += u64::from(cost);
            admitted += 1;
            let over = count.current > s.rule.limit;
            *tally
                .admitted_by_window
                .entry(window - tally.first_window)
                .or_default() += u64::from(cost);
            if over {
                for (a, &(attacker, start)) in tally.attacks.iter().enumerate() {
                    if attacker == key && t >= start && tally.full_at[a].is_none() {
                        tally.full_at[a] = Some(t);
                    }
                }
            }
        } else {
            let in_window = if sliding {
                let elapsed = (now % window_ns) as f64 / window_ns as f64;
                count.previous as f64 * (1.0 - elapsed) + count.current as f64
            } else {
                count.current as f64
            };
            if in_window + f64::from(cost) <= s.rule.limit as f64 {
                false_denials += 1;
            }
            for (a, &(attacker, start)) in tally.attacks.iter().enumerate() {
                if attacker == key && t >= start && tally.reactions[a].is_none() {
                    tally.reactions[a] = Some(tally.full_at[a].map_or(0, |f| t - f));
                }
            }
        }
    }
    progress(traffic.arrivals.len() as u64 % 4096);
    advance(duration);
    for key in 0..tally.counts.len() {
        let c = tally.counts[key];
        tally.close(key as u32, c);
    }
    let mut over = std::mem::take(&mut tally.over);
    over.sort_by(f64::total_cmp);
    let (mut first, mut warm) = (
        std::mem::take(&mut tally.over_first),
        std::mem::take(&mut tally.over_warm),
    );
    first.sort_by(f64::total_cmp);
    warm.sort_by(f64::total_cmp);
    let requests = traffic.arrivals.len() as u64;
    let ops = store.operations();
    let per_request = |x: u64| {
        if requests == 0 {
            0.0
        } else {
            x as f64 / requests as f64
        }
    };
    let windows = (duration.div_ceil(window_ns)) as usize;
    PolicyReport {
        policy: policy.to_owned(),
        requests,
        admitted,
        windows: over.len() as u64,
        over_max_pct: over.last().copied().unwrap_or(0.0),
        over_mean_pct: if over.is_empty() {
            0.0
        } else {
            over.iter().sum::<f64>() / over.len() as f64
        },
        over_p99_pct: percentile(&over, 0.99),
        first_windows: first.len() as u64,
        first_over_max_pct: first.last().copied().unwrap_or(0.0),
        first_over_p99_pct: percentile(&first, 0.99),
        warm_over_max_pct: warm.last().copied().unwrap_or(0.0),
        warm_over_p99_pct: percentile(&warm, 0.99),
        false_denials,
        false_denial_pct: per_request(false_denials) * 100.0,
        attack_reaction_s: if tally.reactions.iter().any(Option::is_none) {
            None
        } else {
            tally
                .reactions
                .iter()
                .flatten()
                .max()
                .map(|&ns| ns as f64 / 1e9)
        },
        store_ops: ops,
        store_ops_per_s: ops as f64 / s.duration_s as f64,
        store_ops_per_request: per_request(ops),
        store_commands_per_request: per_request(store.commands()),
        busiest_key_admitted: (0..windows as u64)
            .map(|w| tally.busiest_series.get(&w).copied().unwrap_or(0))
            .collect(),
        admitted_by_window: (0..windows as u64)
            .map(|w| tally.admitted_by_window.get(&w).copied().unwrap_or(0))
            .collect(),
        over_by_window_pct: (0..windows as u64)
            .map(|w| tally.over_by_window.get(&w).copied().unwrap_or(0.0))
            .collect(),
        estimates,
        classes: crate::classes::by_class(
            tally
                .closed
                .iter()
                .map(|&(key, c)| (traffic.keys[key as usize].as_str(), c)),
            s.rule.limit,
        ),
    }
}

/// The key with the most requests, and the node that sees most of them.
fn busiest_and_observer(traffic: &Generated, nodes: usize) -> (u32, usize) {
    let mut per_key = vec![0u64; traffic.keys.len()];
    for a in &traffic.arrivals {
        per_key[a.key as usize] += 1;
    }
    let busiest = (0..per_key.len())
        .max_by_key(|&k| (per_key[k], std::cmp::Reverse(k)))
        .unwrap_or(0) as u32;
    let mut per_node = vec![0u64; nodes];
    for a in traffic.arrivals.iter().filter(|a| a.key == busiest) {
        per_node[a.node as usize] += 1;
    }
    let observer = (0..nodes)
        .max_by_key(|&n| (per_node[n], std::cmp::Reverse(n)))
        .unwrap_or(0);
    (busiest, observer)
}

/// Runs every policy of the scenario on the same traffic.
pub fn run(s: &Scenario) -> Report {
    run_with_progress(s, &mut |_, _| {})
}

/// [`run`], calling `progress(done, total)` as requests are simulated (`total` counts every
/// policy's pass over the traffic).
pub fn run_with_progress(s: &Scenario, progress: &mut dyn FnMut(u64, u64)) -> Report {
    let traffic = generate(s);
    let (busiest, observer) = busiest_and_observer(&traffic, s.nodes.count);
    let policies: Vec<String> = s
        .policies
        .clone()
        .unwrap_or_else(|| POLICIES.iter().map(|p| (*p).to_owned()).collect());
    let total = traffic.arrivals.len() as u64 * policies.len() as u64;
    let mut done = 0;
    Report {
        limit: s.rule.limit,
        window_s: s.rule.window_s,
        spans: s.rule.spans,
        nodes: s.nodes.count,
        duration_s: s.duration_s,
        busiest_key: traffic
            .keys
            .get(busiest as usize)
            .cloned()
            .unwrap_or_default(),
        observer_node: observer,
        policies: policies
            .iter()
            .map(|p| {
                simulate(p, s, &traffic, (busiest, observer), &mut |n| {
                    done += n;
                    progress(done, total);
                })
            })
            .collect(),
    }
}
