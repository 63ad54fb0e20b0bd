//! Drives the real engine: one `Engine` per simulated node, each with its own manual clock, all
//! sharing one `MemoryStore`; every engine call completes without waiting (no I/O), so the run
//! needs no async runtime and is deterministic.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use serde::Serialize;
use sluice_core::{Clock, ManualClock};
use sluice_engine::{Engine, EngineOptions};
use sluice_store::MemoryStore;

use crate::scenario::{Scenario, Traffic};

/// All policies, in report order.
pub const POLICIES: [&str; 5] = [
    "reactive",
    "predictive",
    "predictive_sliding",
    "exact",
    "local",
];

fn ready<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => unreachable!("simulated stores never wait"),
    }
}

/// xorshift64*: small, fast, and the same everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Time to the next Poisson arrival at `rate` per second, in nanoseconds.
    fn exp_ns(&mut self, rate: f64) -> u64 {
        (-(1.0 - self.unit()).ln() / rate * 1e9) as u64
    }
}

/// One request: time since the start (ns), node, key index.
type Arrival = (u64, u32, u32);

fn arrivals(s: &Scenario, keys: &mut Vec<String>) -> Vec<Arrival> {
    let duration = s.duration_s * 1_000_000_000;
    let mut out = Vec::new();
    let mut key_index: HashMap<String, u32> = HashMap::new();
    let mut intern = |k: String, keys: &mut Vec<String>| {
        *key_index.entry(k.clone()).or_insert_with(|| {
            keys.push(k);
            (keys.len() - 1) as u32
        })
    };
    for (g, traffic) in s.traffic.iter().enumerate() {
        let mut rng = Rng(s.seed ^ (0x9e37_79b9_7f4a_7c15_u64.wrapping_mul(g as u64 + 1)) | 1);
        match traffic {
            Traffic::Steady {
                rate,
                keys: n,
                weights,
            } if *rate > 0.0 => {
                let total: f64 = weights.iter().sum();
                let ids: Vec<u32> = (0..*n).map(|k| intern(format!("key-{k}"), keys)).collect();
                let mut t = 0;
                loop {
                    t += rng.exp_ns(*rate);
                    if t >= duration {
                        break;
                    }
                    let node = if weights.is_empty() {
                        (rng.next() % s.nodes.count as u64) as u32
                    } else {
                        let mut x = rng.unit() * total;
                        let mut pick = weights.len() - 1;
                        for (i, w) in weights.iter().enumerate() {
                            if x < *w {
                                pick = i;
                                break;
                            }
                            x -= w;
                        }
                        pick as u32
                    };
                    out.push((t, node, ids[(rng.next() % n.max(&1)) as usize]));
                }
            }
            Traffic::Attacker {
                rate,
                node,
                key,
                start_s,
                end_s,
            } if *rate > 0.0 => {
                let id = intern(key.clone(), keys);
                let mut t = start_s * 1_000_000_000;
                let end = (end_s * 1_000_000_000).min(duration);
                loop {
                    t += rng.exp_ns(*rate);
                    if t >= end {
                        break;
                    }
                    out.push((t, *node as u32, id));
                }
            }
            _ => {}
        }
    }
    out.sort_unstable();
    out
}

/// One policy's results.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PolicyReport {
    /// Policy name.
    pub policy: String,
    /// Requests offered.
    pub requests: u64,
    /// Requests admitted.
    pub admitted: u64,
    /// Key-windows that saw traffic.
    pub windows: u64,
    /// Over-admission per key-window in % of the limit: max, mean, p99.
    pub over_max_pct: f64,
    /// Mean over-admission, % of the limit.
    pub over_mean_pct: f64,
    /// 99th percentile over-admission, % of the limit.
    pub over_p99_pct: f64,
    /// Requests denied while the true count in their window was below the limit.
    pub false_denials: u64,
    /// False denials in % of requests.
    pub false_denial_pct: f64,
    /// Store round trips (flushes and exact decisions).
    pub store_ops: u64,
    /// Store round trips per simulated second.
    pub store_ops_per_s: f64,
    /// Store round trips per request.
    pub store_ops_per_request: f64,
    /// Admitted per window for the busiest key (for plots).
    pub busiest_key_admitted: Vec<u64>,
}

/// All policies' results.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Report {
    /// Limit per window.
    pub limit: u64,
    /// Window, seconds.
    pub window_s: u64,
    /// Nodes.
    pub nodes: usize,
    /// Per policy.
    pub policies: Vec<PolicyReport>,
}

fn rules_for(policy: &str, s: &Scenario) -> sluice_config::RuleSet {
    let r = &s.rule;
    let (limit, extra) = match policy {
        "reactive" => (
            r.limit,
            format!("mode: synced, policy: reactive, spans: {}", r.spans),
        ),
        "predictive" => (
            r.limit,
            format!("mode: synced, policy: predictive, spans: {}", r.spans),
        ),
        "predictive_sliding" => (
            r.limit,
            format!(
                "mode: synced, policy: predictive, algorithm: sliding_window, spans: {}",
                r.spans
            ),
        ),
        "exact" => (r.limit, "mode: exact, on_store_error: deny".to_owned()),
        _ => (
            (r.limit / s.nodes.count as u64).max(1),
            "mode: local".to_owned(),
        ),
    };
    let yaml = format!(
        "domain: sim\ndescriptors:\n  - key: key\n    rate_limit: {{ window: {}s, requests_per_unit: {limit}, {extra} }}\n",
        r.window_s
    );
    let domain = sluice_config::parse_domain(Path::new("scenario"), &yaml)
        .expect("generated rules are valid");
    sluice_config::RuleSet::new(vec![domain]).expect("one domain")
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn simulate(policy: &str, s: &Scenario, arrivals: &[Arrival], keys: &[String]) -> PolicyReport {
    let window_ns = s.rule.window_s * 1_000_000_000;
    let t0 = 1_800_000_000_000_000_000u64.div_ceil(window_ns) * window_ns;
    let rules = rules_for(policy, s);
    let store_clock = ManualClock::new(t0);
    let store = Arc::new(MemoryStore::new(Arc::new(store_clock.clone())));
    let nodes: Vec<(ManualClock, i64, Engine)> = (0..s.nodes.count)
        .map(|i| {
            let skew = s.nodes.skew_ms.get(i).copied().unwrap_or(0) * 1_000_000;
            let clock = ManualClock::new(t0.saturating_add_signed(skew));
            let engine = Engine::new(
                &rules,
                &Default::default(),
                store.clone(),
                Arc::new(clock.clone()) as Arc<dyn Clock>,
                EngineOptions {
                    node_id: Some(format!("node-{i}")),
                    expected_instances: s.nodes.count as u64,
                    ..EngineOptions::default()
                },
            );
            (clock, skew, engine)
        })
        .collect();
    let mut admitted_in: HashMap<(u32, u64), u64> = HashMap::new();
    let (mut admitted, mut false_denials) = (0u64, 0u64);
    for &(t, node, key) in arrivals {
        let now = t0 + t;
        store_clock.set(now);
        let secs = t / 1_000_000_000;
        store.set_available(!s.store.outages.iter().any(|&(a, b)| (a..b).contains(&secs)));
        for (clock, skew, engine) in &nodes {
            clock.set(now.saturating_add_signed(*skew));
            ready(engine.flush_due());
        }
        let window = now / window_ns;
        let count = admitted_in.entry((key, window)).or_default();
        let request = [[("key", keys[key as usize].as_str())]];
        let verdict =
            ready(nodes[node as usize].2.check("sim", &request, 1)).expect("the sim domain exists");
        if verdict.allowed {
            *count += 1;
            admitted += 1;
        } else if *count < s.rule.limit {
            false_denials += 1;
        }
    }
    let mut over: Vec<f64> = admitted_in
        .values()
        .map(|&a| a.saturating_sub(s.rule.limit) as f64 * 100.0 / s.rule.limit as f64)
        .collect();
    over.sort_by(f64::total_cmp);
    let busiest = admitted_in
        .iter()
        .fold(HashMap::<u32, u64>::new(), |mut m, (&(k, _), &a)| {
            *m.entry(k).or_default() += a;
            m
        })
        .into_iter()
        .max_by_key(|&(k, a)| (a, std::cmp::Reverse(k)))
        .map(|(k, _)| k);
    let by_window: BTreeMap<u64, u64> = admitted_in
        .iter()
        .filter(|((k, _), _)| Some(*k) == busiest)
        .map(|(&(_, w), &a)| (w, a))
        .collect();
    let requests = arrivals.len() as u64;
    let ops = store.operations();
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
        false_denials,
        false_denial_pct: if requests == 0 {
            0.0
        } else {
            false_denials as f64 * 100.0 / requests as f64
        },
        store_ops: ops,
        store_ops_per_s: ops as f64 / s.duration_s as f64,
        store_ops_per_request: if requests == 0 {
            0.0
        } else {
            ops as f64 / requests as f64
        },
        busiest_key_admitted: by_window.into_values().collect(),
    }
}

/// Runs every policy of the scenario on the same traffic.
pub fn run(s: &Scenario) -> Report {
    let mut keys = Vec::new();
    let arrivals = arrivals(s, &mut keys);
    let policies: Vec<String> = s
        .policies
        .clone()
        .unwrap_or_else(|| POLICIES.iter().map(|p| (*p).to_owned()).collect());
    Report {
        limit: s.rule.limit,
        window_s: s.rule.window_s,
        nodes: s.nodes.count,
        policies: policies
            .iter()
            .map(|p| simulate(p, s, &arrivals, &keys))
            .collect(),
    }
}

impl Report {
    /// The report as a table.
    pub fn table(&self) -> String {
        let mut out = format!(
            "limit {} per {} s, {} nodes\n{:<20} {:>9} {:>9} {:>8} {:>8} {:>8} {:>9} {:>10} {:>10}\n",
            self.limit,
            self.window_s,
            self.nodes,
            "policy",
            "requests",
            "admitted",
            "over max",
            "mean",
            "p99",
            "false den",
            "ops/s",
            "ops/req"
        );
        for p in &self.policies {
            out.push_str(&format!(
                "{:<20} {:>9} {:>9} {:>7.1}% {:>7.2}% {:>7.1}% {:>8.3}% {:>10.2} {:>10.4}\n",
                p.policy,
                p.requests,
                p.admitted,
                p.over_max_pct,
                p.over_mean_pct,
                p.over_p99_pct,
                p.false_denial_pct,
                p.store_ops_per_s,
                p.store_ops_per_request
            ));
        }
        out
    }
}
