//! Turns a scenario's traffic generators into one time-ordered list of requests.

use std::collections::HashMap;

use crate::scenario::{NodeSpec, Scenario, Traffic};

const NS: u64 = 1_000_000_000;

/// xorshift64*: small, fast, and the same everywhere.
pub(crate) struct Rng(pub u64);

impl Rng {
    /// A generator for one stream of one seed: every (seed, stream) pair starts from its own
    /// state (both mixed through splitmix64, so seeds 2k and 2k+1 differ as much as any two).
    pub fn seeded(seed: u64, stream: u64) -> Self {
        let state = splitmix64(seed ^ splitmix64(stream.wrapping_add(1)));
        // xorshift's one fixed point: an all-zero state would stay zero.
        Rng(if state == 0 {
            0x9e37_79b9_7f4a_7c15
        } else {
            state
        })
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u = 1.0 - self.unit();
        let v = self.unit();
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    /// Time to the next Poisson arrival at `rate` per second, in nanoseconds.
    pub fn exp_ns(&mut self, rate: f64) -> u64 {
        ((-(1.0 - self.unit()).ln() / rate) * 1e9).min(1e18) as u64
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// splitmix64's finalizer: spreads every bit of `x` over the whole word.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Arrival {
    /// Time since the start, nanoseconds.
    pub t: u64,
    /// Node that receives it.
    pub node: u32,
    /// Key index (into [`Traffic::keys`]).
    pub key: u32,
    /// Cost.
    pub cost: u32,
    /// The tenant key it also counts against (an index into [`Generated::keys`]), if any.
    pub tenant: Option<u32>,
}

/// All requests of a scenario, and what the report needs to know about them.
pub(crate) struct Generated {
    pub arrivals: Vec<Arrival>,
    pub keys: Vec<String>,
    /// Attacks: (key, start in ns since the start).
    pub attacks: Vec<(u32, u64)>,
}

/// Which nodes are live when: the list changes only at join and leave times.
struct Live {
    changes: Vec<(u64, Vec<usize>)>,
}

impl Live {
    fn new(nodes: &NodeSpec) -> Self {
        let mut times: Vec<u64> = vec![0];
        for i in 0..nodes.count {
            times.push(nodes.join_ns(i));
            times.extend(nodes.leave_ns(i));
            times.extend(nodes.crash_ns(i));
        }
        times.sort_unstable();
        times.dedup();
        let changes = times
            .into_iter()
            .map(|t| {
                (
                    t,
                    (0..nodes.count).filter(|&i| nodes.active(i, t)).collect(),
                )
            })
            .collect();
        Live { changes }
    }

    fn at(&self, t: u64) -> &[usize] {
        let i = self.changes.partition_point(|(c, _)| *c <= t);
        &self.changes[i.saturating_sub(1)].1
    }
}

fn pick(rng: &mut Rng, live: &[usize], weights: &[f64]) -> Option<usize> {
    if live.is_empty() {
        return None;
    }
    if weights.is_empty() {
        return Some(live[rng.below(live.len() as u64) as usize]);
    }
    let total: f64 = live.iter().map(|&i| weights[i]).sum();
    if total <= 0.0 {
        return None;
    }
    let mut x = rng.unit() * total;
    for &i in live {
        if x < weights[i] {
            return Some(i);
        }
        x -= weights[i];
    }
    live.last().copied()
}

fn mix(a: u64, b: u64) -> u64 {
    let mut z = a.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ b.wrapping_add(0x6a09_e667_f3bc_c909);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

struct Keys {
    names: Vec<String>,
    index: HashMap<String, u32>,
}

impl Keys {
    fn intern(&mut self, name: &str) -> u32 {
        if let Some(&i) = self.index.get(name) {
            return i;
        }
        self.names.push(name.to_owned());
        let i = (self.names.len() - 1) as u32;
        self.index.insert(name.to_owned(), i);
        i
    }

    fn range(&mut self, prefix: Option<&str>, n: u64) -> Vec<u32> {
        let prefix = prefix.unwrap_or("key");
        (0..n)
            .map(|k| self.intern(&format!("{prefix}-{k}")))
            .collect()
    }
}

/// Poisson arrivals at `rate` per second in `[from, to)` (ns): calls `each` with each time.
fn poisson(rng: &mut Rng, rate: f64, from: u64, to: u64, mut each: impl FnMut(&mut Rng, u64)) {
    let mut t = from;
    loop {
        t = t.saturating_add(rng.exp_ns(rate));
        if t >= to {
            return;
        }
        each(rng, t);
    }
}

/// One request of a scenario's traffic, as [`requests`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Time since the start (a window boundary), nanoseconds.
    pub t_ns: u64,
    /// The node that receives it.
    pub node: usize,
    /// The value of the rule's descriptor `key`.
    pub key: String,
    /// Its cost.
    pub cost: u32,
    /// The value of the rule's second descriptor, `tenant`, when the request carries it.
    pub tenant: Option<String>,
}

/// The scenario's requests in time order, exactly those [`crate::run`] simulates (the same
/// file and seed give the same list): for replaying the traffic against real processes.
pub fn requests(s: &Scenario) -> Vec<Request> {
    let traffic = generate(s);
    traffic
        .arrivals
        .iter()
        .map(|a| Request {
            t_ns: a.t,
            node: a.node as usize,
            key: traffic.keys[a.key as usize].clone(),
            cost: a.cost,
            tenant: a.tenant.map(|t| traffic.keys[t as usize].clone()),
        })
        .collect()
}

/// Generates the requests; the same scenario gives the same list. Each generator draws from
/// its own random stream, so one generator's requests do not depend on the others'.
// Over 80 lines on purpose: one arm per kind of generator, each only unpacking its fields
// for the `Sink` method that generates it.
pub(crate) fn generate(s: &Scenario) -> Generated {
    let duration = s.duration_s * NS;
    let mut sink = Sink {
        duration,
        live: Live::new(&s.nodes),
        keys: Keys {
            names: Vec::new(),
            index: HashMap::new(),
        },
        out: Vec::new(),
        attacks: Vec::new(),
        tenant: None,
    };
    let mut traces = s.traces.iter();
    for (g, traffic) in s.traffic.iter().enumerate() {
        let rng = &mut Rng::seeded(s.seed, g as u64);
        sink.tenant = traffic.tenant().map(|t| sink.keys.intern(t));
        match traffic {
            Traffic::Steady {
                rate,
                keys: n,
                weights,
                start_s,
                end_s,
                prefix,
                paced,
                ..
            } if *rate > 0.0 => {
                let ids = sink.keys.range(prefix.as_deref(), *n);
                let span = sink.window(*start_s, *end_s);
                if *paced {
                    sink.paced(rng, (*rate, span), &ids, (s.nodes.count, weights));
                } else {
                    sink.spread(rng, (*rate, span), &ids, weights);
                }
            }
            Traffic::Bursts {
                rate,
                every_s,
                length_s,
                keys: n,
                weights,
                start_s,
                end_s,
                prefix,
                ..
            } if *rate > 0.0 => {
                let ids = sink.keys.range(prefix.as_deref(), *n);
                let span = sink.window(*start_s, *end_s);
                let (every, length) = ((every_s * 1e9) as u64, (length_s * 1e9) as u64);
                sink.bursts(rng, (*rate, span), (every, length), (&ids, weights));
            }
            Traffic::Attacker {
                rate,
                node,
                key,
                start_s,
                end_s,
            } if *rate > 0.0 => {
                let span = sink.window(*start_s, Some(*end_s));
                let active = |t| s.nodes.active(*node, t);
                sink.attacker(rng, (*rate, span), (*node, active), key);
            }
            Traffic::KeyAffinity {
                rate,
                keys: n,
                affinity,
                start_s,
                end_s,
                prefix,
                ..
            } if *rate > 0.0 => {
                let ids = sink.keys.range(prefix.as_deref(), *n);
                let span = sink.window(*start_s, *end_s);
                sink.key_affinity(rng, (*rate, span), &ids, *affinity);
            }
            Traffic::Diurnal {
                min_rate,
                max_rate,
                period_s,
                keys: n,
                weights,
                prefix,
            } if *max_rate > 0.0 => {
                let ids = sink.keys.range(prefix.as_deref(), *n);
                sink.diurnal(rng, (*min_rate, *max_rate, *period_s), &ids, weights);
            }
            Traffic::Churn {
                users_per_s,
                rate,
                lifetime_s,
                weights,
                start_s,
                end_s,
                prefix,
                ..
            } if *users_per_s > 0.0 && *rate > 0.0 => {
                let span = sink.window(*start_s, *end_s);
                let users = (
                    prefix.as_deref().unwrap_or("user"),
                    *users_per_s,
                    *lifetime_s,
                );
                sink.churn(rng, (*rate, span), users, weights);
            }
            Traffic::Trace { .. } => {
                sink.trace(traces.next().map(Vec::as_slice).unwrap_or_default())
            }
            _ => {}
        }
    }
    sink.out.sort_unstable();
    Generated {
        arrivals: sink.out,
        keys: sink.keys.names,
        attacks: sink.attacks,
    }
}

/// Where the generators put what they make: the keys named so far, the requests, the attacks.
struct Sink {
    duration: u64,
    live: Live,
    keys: Keys,
    out: Vec<Arrival>,
    attacks: Vec<(u32, u64)>,
    /// The tenant of the generator at work, if it has one.
    tenant: Option<u32>,
}

/// A generator's rate (per second) and the span it runs in (`[from, to)`, ns).
type Rated = (f64, (u64, u64));

impl Sink {
    /// `[start, end)` in seconds as nanoseconds within the run (no end: the run's).
    fn window(&self, start: u64, end: Option<u64>) -> (u64, u64) {
        let duration = self.duration;
        (start * NS, end.map_or(duration, |e| (e * NS).min(duration)))
    }

    /// A request of cost 1 at `t` to `node`, when there is one (no node is live: none), also
    /// counted against `tenant`.
    fn push(out: &mut Vec<Arrival>, tenant: Option<u32>, t: u64, node: Option<usize>, key: u32) {
        if let Some(node) = node {
            out.push(Arrival {
                t,
                node: node as u32,
                key,
                cost: 1,
                tenant,
            });
        }
    }

    /// Poisson arrivals over `ids`, each to a live node picked by `weights`.
    fn spread(&mut self, rng: &mut Rng, (rate, (from, to)): Rated, ids: &[u32], weights: &[f64]) {
        let n = ids.len() as u64;
        poisson(rng, rate, from, to, |rng, t| {
            let node = pick(rng, self.live.at(t), weights);
            Self::push(
                &mut self.out,
                self.tenant,
                t,
                node,
                ids[rng.below(n) as usize],
            );
        });
    }

    /// Evenly spaced arrivals over `ids`: each node its part of `rate` by `weights` (evenly
    /// without), from a moment drawn within its first gap, while it is live.
    fn paced(
        &mut self,
        rng: &mut Rng,
        (rate, (from, to)): Rated,
        ids: &[u32],
        (nodes, weights): (usize, &[f64]),
    ) {
        let n = ids.len() as u64;
        let weight = |node: usize| match weights {
            [] => 1.0,
            w => w.get(node).copied().unwrap_or(0.0),
        };
        let total: f64 = (0..nodes).map(weight).sum();
        for node in 0..nodes {
            let node_rate = rate * weight(node) / total.max(f64::MIN_POSITIVE);
            if node_rate <= 0.0 {
                continue;
            }
            let gap = 1e9 / node_rate;
            let mut t = from as f64 + rng.unit() * gap;
            while t < to as f64 {
                let at = t as u64;
                let live = self.live.at(at).contains(&node).then_some(node);
                Self::push(
                    &mut self.out,
                    self.tenant,
                    at,
                    live,
                    ids[rng.below(n) as usize],
                );
                t += gap;
            }
        }
    }

    /// [`Sink::spread`] in bursts of `length` every `every` nanoseconds.
    fn bursts(
        &mut self,
        rng: &mut Rng,
        (rate, (start, end)): Rated,
        (every, length): (u64, u64),
        (ids, weights): (&[u32], &[f64]),
    ) {
        let mut burst = start;
        while burst < end {
            let stop = (burst + length).min(end);
            self.spread(rng, (rate, (burst, stop)), ids, weights);
            burst += every.max(1);
        }
    }

    /// One key from one node (while that node is live), recorded as an attack.
    fn attacker(
        &mut self,
        rng: &mut Rng,
        (rate, (start, end)): Rated,
        (node, active): (usize, impl Fn(u64) -> bool),
        key: &str,
    ) {
        let id = self.keys.intern(key);
        self.attacks.push((id, start));
        poisson(rng, rate, start, end, |_, t| {
            Self::push(&mut self.out, self.tenant, t, active(t).then_some(node), id);
        });
    }

    /// Each key mostly to its home node (rendezvous hashing over the live nodes: the home
    /// stays put while others come and go), otherwise to any live node.
    fn key_affinity(
        &mut self,
        rng: &mut Rng,
        (rate, (from, to)): Rated,
        ids: &[u32],
        affinity: f64,
    ) {
        let n = ids.len() as u64;
        poisson(rng, rate, from, to, |rng, t| {
            let k = rng.below(n);
            let nodes = self.live.at(t);
            let home = nodes
                .iter()
                .copied()
                .max_by_key(|&node| mix(k, node as u64));
            let node = if rng.unit() < affinity {
                home
            } else {
                pick(rng, nodes, &[])
            };
            Self::push(&mut self.out, self.tenant, t, node, ids[k as usize]);
        });
    }

    /// A rate going from `min_rate` up to `max_rate` and back every `period_s`, over the run.
    fn diurnal(
        &mut self,
        rng: &mut Rng,
        (min_rate, max_rate, period_s): (f64, f64, f64),
        ids: &[u32],
        weights: &[f64],
    ) {
        let n = ids.len() as u64;
        // Thinning: candidates at the peak rate, each kept with rate(t) / peak.
        poisson(rng, max_rate, 0, self.duration, |rng, t| {
            let phase = (t as f64 / 1e9) / period_s * std::f64::consts::TAU;
            let rate = min_rate + (max_rate - min_rate) * (1.0 - phase.cos()) / 2.0;
            if rng.unit() * max_rate < rate {
                let node = pick(rng, self.live.at(t), weights);
                Self::push(
                    &mut self.out,
                    self.tenant,
                    t,
                    node,
                    ids[rng.below(n) as usize],
                );
            }
        });
    }

    /// Users arriving at `users_per_s`, each sending at `rate` for `lifetime_s` under its own
    /// key (`{prefix}-{n}`).
    fn churn(
        &mut self,
        rng: &mut Rng,
        (rate, (start, end)): Rated,
        (prefix, users_per_s, lifetime_s): (&str, f64, f64),
        weights: &[f64],
    ) {
        let lifetime = (lifetime_s * 1e9) as u64;
        let mut arrivals = Vec::new();
        poisson(rng, users_per_s, start, end, |_, t| arrivals.push(t));
        for (n, arrived) in arrivals.into_iter().enumerate() {
            let id = self.keys.intern(&format!("{prefix}-{n}"));
            let stop = arrived.saturating_add(lifetime).min(self.duration);
            poisson(rng, rate, arrived, stop, |rng, t| {
                let node = pick(rng, self.live.at(t), weights);
                Self::push(&mut self.out, self.tenant, t, node, id);
            });
        }
    }

    /// A trace's requests, as recorded, within the run.
    fn trace(&mut self, events: &[crate::scenario::TraceEvent]) {
        for e in events {
            let t = e.t_ms.saturating_mul(1_000_000);
            if t < self.duration {
                let key = self.keys.intern(&e.key);
                self.out.push(Arrival {
                    t,
                    node: e.node as u32,
                    key,
                    cost: e.cost as u32,
                    tenant: None,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    fn first(seed: u64, stream: u64) -> [u64; 4] {
        let mut rng = Rng::seeded(seed, stream);
        std::array::from_fn(|_| rng.next())
    }

    #[test]
    fn every_seed_and_stream_has_its_own_sequence() {
        let mut seen = std::collections::HashSet::new();
        for seed in 0..64 {
            for stream in 0..8 {
                assert!(
                    seen.insert(first(seed, stream)),
                    "seed {seed} stream {stream}"
                );
            }
        }
    }
}
