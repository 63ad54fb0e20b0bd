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
use std::path::Path;

use crate::fleet::{Fleet, NS, Timers, ready};
use crate::policy::POLICIES;
use crate::report::{EstimateSample, PolicyReport, Report};
use crate::scenario::Scenario;
use crate::tally::{KeyCount, Tally};
use crate::traffic::{Arrival, Generated, generate};

/// The rule file (domain `sim`, descriptor `key`, and `tenant` with the same limit when some
/// traffic has a tenant) the simulator runs `policy` with: what real processes need to run the
/// same rule.
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
        // Several Sluice serving the Envoys share the room as `sluice serve` instances on one
        // store do.
        "rlqs" if s.rlqs.instances > 1 => (r.limit, synced("predictive", "")),
        // One Sluice serving every Envoy: its local count is the exact one.
        "local" | "rlqs" => (r.limit, "mode: local".to_owned()),
        _ => ((r.limit / expected).max(1), "mode: local".to_owned()),
    };
    let rate_limit = format!(
        "rate_limit: {{ window: {}s, requests_per_unit: {limit}, {extra} }}",
        r.window_s
    );
    let tenant = if s.has_tenants() {
        format!("  - key: tenant\n    {rate_limit}\n")
    } else {
        String::new()
    };
    format!("domain: sim\ndescriptors:\n  - key: key\n    {rate_limit}\n{tenant}")
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

/// The tally of a run over `traffic` starting at `t0` (true clock).
fn tally_for<'t>(s: &Scenario, traffic: &'t Generated, busiest: u32, t0: u64) -> Tally<'t> {
    Tally {
        limit: s.rule.limit,
        busiest,
        over: Vec::new(),
        over_first: Vec::new(),
        over_warm: Vec::new(),
        over_by_window: Default::default(),
        admitted_by_window: Default::default(),
        busiest_series: Default::default(),
        counts: vec![KeyCount::default(); traffic.keys.len()],
        closed: Vec::new(),
        first_window: t0 / (s.rule.window_s * NS),
        attacks: &traffic.attacks,
        full_at: vec![None; traffic.attacks.len()],
        reactions: vec![None; traffic.attacks.len()],
    }
}

/// The start of a run on the true clock: a window boundary.
fn start_of(s: &Scenario) -> u64 {
    let window_ns = s.rule.window_s * NS;
    1_800_000_000_000_000_000u64.div_ceil(window_ns) * window_ns
}

/// Simulates `policy` on `traffic`: every request decided by its node's engine at its time,
/// the nodes' flush timers fired in between, the true counts kept alongside.
fn simulate(
    policy: &str,
    s: &Scenario,
    traffic: &Generated,
    (busiest, observer): (u32, usize),
    progress: &mut dyn FnMut(u64),
) -> PolicyReport {
    if policy == "rlqs" {
        return simulate_envoys(s, traffic, busiest, progress);
    }
    let window_ns = s.rule.window_s * NS;
    let t0 = start_of(s);
    let fleet = Fleet::new(&rules_for(policy, s), s, t0);
    let busiest_key = traffic
        .keys
        .get(busiest as usize)
        .map_or("", String::as_str);
    let mut timers = Timers::new(&fleet, s, (observer, busiest_key));
    let mut tally = tally_for(s, traffic, busiest, t0);
    let window = (window_ns, policy == "predictive_sliding");
    let (mut admitted, mut false_denials) = (0u64, 0u64);
    for (n, a) in traffic.arrivals.iter().enumerate() {
        let &Arrival {
            t, node, key, cost, ..
        } = a;
        if n % 4096 == 4095 {
            progress(4096);
        }
        timers.advance(t);
        fleet.set_store(t);
        fleet.set_clock(node as usize, t);
        let engine = &fleet.engines[node as usize];
        let user = [("key", traffic.keys[key as usize].as_str())];
        let tenant = a
            .tenant
            .map(|t| [("tenant", traffic.keys[t as usize].as_str())]);
        let request: &[[(&str, &str); 1]] = match &tenant {
            Some(tenant) => &[user, *tenant],
            None => &[user],
        };
        let verdict =
            ready(engine.check("sim", request, u64::from(cost))).expect("the sim domain exists");
        if engine.early_sync_wanted() {
            timers.ask_early(node as usize, t);
        }
        admitted += u64::from(verdict.allowed);
        // Each rule's key tallied with its own decision; the tenant's only when the user's rule
        // admitted the request (a denial stops the counting: the tenant never saw it).
        let by_rule = |i: usize| {
            verdict
                .statuses
                .iter()
                .find(|s| s.descriptor == i)
                .map_or(verdict.allowed, |s| {
                    s.outcome != sluice_engine::Outcome::Denied
                })
        };
        let user_allowed = by_rule(0);
        let decided = (u64::from(cost), user_allowed);
        false_denials += u64::from(tally.record((key, t, t0 + t), decided, window));
        if let Some(tenant) = a.tenant
            && user_allowed
        {
            let decided = (u64::from(cost), by_rule(1));
            false_denials += u64::from(tally.record((tenant, t, t0 + t), decided, window));
        }
    }
    progress(traffic.arrivals.len() as u64 % 4096);
    timers.advance(s.duration_s * NS);
    for key in 0..tally.counts.len() {
        let c = tally.counts[key];
        tally.close(key as u32, c);
    }
    let estimates = std::mem::take(&mut timers.estimates);
    let outcome = Outcome {
        admitted,
        false_denials,
        store_ops: fleet.store.operations(),
        store_commands: fleet.store.commands(),
        estimates,
    };
    report_of(policy, s, traffic, tally, outcome)
}

/// The `rlqs` policy (rlqs.rs): the nodes are Envoys deciding by their assignments; its "store
/// operations" are the reports Sluice answered, the calls to the shared state (with several
/// instances, their flushes to the store they share are not among them).
fn simulate_envoys(
    s: &Scenario,
    traffic: &Generated,
    busiest: u32,
    progress: &mut dyn FnMut(u64),
) -> PolicyReport {
    let t0 = start_of(s);
    let run = crate::rlqs::simulate_rlqs((s, &rules_for("rlqs", s)), traffic, t0, progress);
    let mut tally = tally_for(s, traffic, busiest, t0);
    let window = (s.rule.window_s * NS, false);
    let (mut admitted, mut false_denials) = (0u64, 0u64);
    for (&Arrival { t, key, cost, .. }, &allowed) in traffic.arrivals.iter().zip(&run.decisions) {
        admitted += u64::from(allowed);
        false_denials +=
            u64::from(tally.record((key, t, t0 + t), (u64::from(cost), allowed), window));
    }
    for key in 0..tally.counts.len() {
        let c = tally.counts[key];
        tally.close(key as u32, c);
    }
    let outcome = Outcome {
        admitted,
        false_denials,
        store_ops: run.reports,
        store_commands: run.reports,
        estimates: Vec::new(),
    };
    report_of("rlqs", s, traffic, tally, outcome)
}

/// What a simulation counted besides the tally.
struct Outcome {
    admitted: u64,
    false_denials: u64,
    store_ops: u64,
    store_commands: u64,
    estimates: Vec<EstimateSample>,
}

/// A policy's figures from its simulation's tally and outcome.
fn report_of(
    policy: &str,
    s: &Scenario,
    traffic: &Generated,
    mut tally: Tally<'_>,
    outcome: Outcome,
) -> PolicyReport {
    let sorted = |v: &mut Vec<f64>| {
        let mut v = std::mem::take(v);
        v.sort_by(f64::total_cmp);
        v
    };
    let (over, first, warm) = (
        sorted(&mut tally.over),
        sorted(&mut tally.over_first),
        sorted(&mut tally.over_warm),
    );
    let max = |v: &[f64]| v.last().copied().unwrap_or(0.0);
    let requests = traffic.arrivals.len() as u64;
    let per_request = |x: u64| {
        if requests == 0 {
            0.0
        } else {
            x as f64 / requests as f64
        }
    };
    let windows = (s.duration_s * NS).div_ceil(s.rule.window_s * NS);
    let reaction = if tally.reactions.iter().any(Option::is_none) {
        None
    } else {
        let slowest = tally.reactions.iter().flatten().max();
        slowest.map(|&ns| ns as f64 / 1e9)
    };
    let ops = outcome.store_ops;
    PolicyReport {
        policy: policy.to_owned(),
        requests,
        admitted: outcome.admitted,
        windows: over.len() as u64,
        over_max_pct: max(&over),
        over_mean_pct: if over.is_empty() {
            0.0
        } else {
            over.iter().sum::<f64>() / over.len() as f64
        },
        over_p99_pct: percentile(&over, 0.99),
        first_windows: first.len() as u64,
        first_over_max_pct: max(&first),
        first_over_p99_pct: percentile(&first, 0.99),
        warm_over_max_pct: max(&warm),
        warm_over_p99_pct: percentile(&warm, 0.99),
        false_denials: outcome.false_denials,
        false_denial_pct: per_request(outcome.false_denials) * 100.0,
        attack_reaction_s: reaction,
        store_ops: ops,
        store_ops_per_s: ops as f64 / s.duration_s as f64,
        store_ops_per_request: per_request(ops),
        store_commands_per_request: per_request(outcome.store_commands),
        busiest_key_admitted: series(&tally.busiest_series, windows),
        admitted_by_window: series(&tally.admitted_by_window, windows),
        over_by_window_pct: series(&tally.over_by_window, windows),
        estimates: outcome.estimates,
        classes: crate::classes::by_class(
            tally
                .closed
                .iter()
                .map(|&(key, c)| (traffic.keys[key as usize].as_str(), c)),
            s.rule.limit,
        ),
    }
}

/// `map`'s value for each of `windows` windows (none: the default).
fn series<T: Copy + Default>(map: &BTreeMap<u64, T>, windows: u64) -> Vec<T> {
    (0..windows)
        .map(|w| map.get(&w).copied().unwrap_or_default())
        .collect()
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
