//! The `rlqs` policy: each simulated node is an Envoy with the `rate_limit_quota` filter
//! (envoy.rs), reporting to one of `rlqs.instances` simulated Sluice instances (node `i` to
//! instance `i % instances`), each serving its Envoys as the RLQS door does.
//!
//! Requests are decided by the node's bucket for their key, with no call to Sluice. A new
//! bucket is reported at once, then every bucket on the node's report timer
//! (`rlqs.report_interval_s`, 5 s as Envoy 1.40); a report reaches Sluice after half a round
//! trip drawn from `store.latency_ms`, and its answer reaches the Envoy after the other half.
//! Sluice is the real door's code: `record` counts the usage in a real `Engine` and reads the
//! room, the `DemandBook` gives the Envoy its share of the bucket's demand, `assign` sizes the
//! token bucket, and `answer` sends it only when it changed materially or needs renewing (the
//! Envoy keeps the last one otherwise); only the stream around them (wire types, pace, bounds)
//! is left out. One instance runs the rule in `mode: local`, which is exact for one instance;
//! several run it synced (`predictive`) on one store, flushed on their own timers as the
//! simulated fleet's nodes are (fleet.rs), so each hands its Envoys its part of the room from
//! what it has read of the others, a flush late, as `sluice serve` instances on one Redis do.
//! The store's outages are the store unreachable to the Sluice instances (one instance's
//! local rule never asks it; several keep counting on what they last read of each other, as
//! the synced policies' nodes do). `rlqs.unreachable` is Sluice unreachable to its Envoys: a
//! report that lands in it is lost with its counts, as Envoy drops what it built while its
//! stream was down.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use envoy_types::pb::envoy::service::rate_limit_quota::v3::BucketId;
use sluice_config::RuleSet;
use sluice_rls::RlsOptions;
use sluice_rls::rlqs::{Asked, Assignment, Bucket, BucketKey, DemandBook, Reporter, Sent, record};

use crate::envoy::{EnvoyBucket, Usage};
use crate::fleet::{Fleet, LatencyDraw, NS, Timers, ready};
use crate::scenario::{NodeSpec, Scenario};
use crate::traffic::{Arrival, Generated};

/// What happens next, in time order (`seq` breaks ties in the order events were made).
#[derive(Debug)]
enum Event {
    /// A node's report timer.
    Timer { node: usize },
    /// A report reaches Sluice.
    Report { node: usize, usages: Vec<Usage> },
    /// Sluice's answer reaches the node.
    Answer {
        node: usize,
        actions: Vec<(u32, Assignment)>,
    },
}

/// One simulated `sluice serve`'s RLQS door: the demand book of its streams and what it last
/// sent each of its Envoys (as the door, a report is answered only with the assignments that
/// changed materially or are due for renewal).
struct Door {
    book: DemandBook,
    sent: HashMap<(usize, u32), Sent>,
}

/// The simulated Sluice instances: real engines on manual clocks sharing one store (fleet.rs),
/// their flush timers, and one door each. Envoy `i` reports to instance `i % instances`.
struct Sluices<'f> {
    fleet: &'f Fleet,
    timers: Timers<'f>,
    doors: Vec<Door>,
    keys: Vec<Option<BucketKey>>,
    reports: u64,
}

impl<'f> Sluices<'f> {
    fn new(fleet: &'f Fleet, s: &Scenario, keys: usize) -> Self {
        let doors = (0..fleet.engines.len())
            .map(|_| Door {
                book: DemandBook::new(200_000),
                sent: HashMap::new(),
            })
            .collect();
        Self {
            fleet,
            timers: Timers::new(fleet, s, (0, "")),
            doors,
            keys: vec![None; keys],
            reports: 0,
        }
    }

    /// The instance Envoy `node` reports to.
    fn of(&self, node: usize) -> usize {
        node % self.doors.len()
    }

    fn bucket_key(&mut self, key: u32, name: &str) -> BucketKey {
        self.keys[key as usize]
            .get_or_insert_with(|| {
                let id = BucketId {
                    bucket: [("key".to_owned(), name.to_owned())].into(),
                };
                Bucket::read(&id, &RlsOptions::default())
                    .expect("a simulated key is a valid bucket id")
                    .key
            })
            .clone()
    }

    /// Answers a node's report at `x` as the RLQS door of its instance does (`stream.rs`):
    /// each usage counted, its share of the bucket's demand, its assignment.
    fn answer(
        &mut self,
        (node, streams, x): (usize, usize, u64),
        usages: &[Usage],
        names: &[String],
    ) -> Vec<(u32, Assignment)> {
        let i = self.of(node);
        let fleet = self.fleet;
        fleet.set_store(x);
        fleet.set_clock(i, x);
        let engine = &fleet.engines[i];
        self.reports += 1;
        let mut actions = Vec::with_capacity(usages.len());
        for u in usages {
            let name = names[u.key as usize].as_str();
            let entries = [("key".to_owned(), name.to_owned())];
            let recorded =
                ready(record(engine, "sim", &entries, u.allowed)).expect("the sim domain exists");
            let Some(room) = recorded.room else {
                actions.push((u.key, Assignment::AllowAll));
                continue;
            };
            // As `QuotaStream::share`: rates over the whole seconds Envoy reports.
            let elapsed = u.elapsed_s.unwrap_or(0) as f64;
            let asked = Asked::per_second(u.allowed, u.denied, elapsed, room);
            let key = self.bucket_key(u.key, name);
            let stream = node as u64 + 1;
            let now = engine.now();
            let door = &mut self.doors[i];
            let previous = door.sent.get(&(node, u.key)).copied();
            let reporter = Reporter {
                stream,
                keep: true,
                holds: previous,
            };
            let answer = door
                .book
                .assignment(("sim", &key), reporter, (asked, room), now, streams);
            if let Some(assignment) = answer.send {
                door.sent.insert(
                    (node, u.key),
                    Sent {
                        assignment,
                        at: now,
                    },
                );
                actions.push((u.key, assignment));
            }
        }
        if engine.early_sync_wanted() {
            self.timers.ask_early(i, x);
        }
        actions
    }
}

/// The nodes (Envoys) and the events between them and Sluice.
struct Envoys<'a> {
    s: &'a Scenario,
    t0: u64,
    buckets: Vec<HashMap<u32, EnvoyBucket>>,
    started: Vec<bool>,
    gone: Vec<bool>,
    events: BinaryHeap<Reverse<(u64, u64)>>,
    pending: HashMap<u64, Event>,
    seq: u64,
    latency: LatencyDraw,
    interval_ns: u64,
}

impl<'a> Envoys<'a> {
    fn push(&mut self, at: u64, event: Event) {
        self.seq += 1;
        self.events.push(Reverse((at, self.seq)));
        self.pending.insert(self.seq, event);
    }

    fn half_trip(&mut self) -> u64 {
        self.latency.sample().as_nanos() as u64 / 2
    }

    fn sluice_down(&self, t: u64) -> bool {
        let secs = t / NS;
        self.s
            .rlqs
            .unreachable
            .iter()
            .any(|&(a, b)| (a..b).contains(&secs))
    }

    fn leaves(&self, node: usize, t: u64) -> bool {
        // A crashed Envoy's stream ends as a stopped one's does (Envoy 1.40 sends no last
        // report either way).
        let nodes = &self.s.nodes;
        nodes
            .leave_ns(node)
            .into_iter()
            .chain(nodes.crash_ns(node))
            .any(|at| t >= at)
    }

    /// The streams open to the instance that Envoy `node` reports to.
    fn open_streams(&self, node: usize, sluices: &Sluices<'_>) -> usize {
        (0..self.started.len())
            .filter(|&i| sluices.of(i) == sluices.of(node))
            .filter(|&i| self.started[i] && !self.gone[i])
            .count()
    }

    /// Sends a report built at `t`.
    fn send(&mut self, node: usize, t: u64, usages: Vec<Usage>) {
        let at = t + self.half_trip();
        self.push(at, Event::Report { node, usages });
    }

    /// Runs every event due up to `until`.
    /// Runs every event due up to `until`, the instances' flush timers in time order with them.
    fn advance(&mut self, until: u64, sluices: &mut Sluices<'_>, names: &[String]) {
        while let Some(&Reverse((at, seq))) = self.events.peek() {
            if at > until {
                break;
            }
            sluices.timers.advance(at);
            self.events.pop();
            let event = self.pending.remove(&seq).expect("every event is pending");
            match event {
                Event::Timer { node } => self.timer(node, at, sluices),
                Event::Report { node, usages } => {
                    if self.sluice_down(at) || self.gone[node] {
                        continue;
                    }
                    let streams = self.open_streams(node, sluices);
                    let actions = sluices.answer((node, streams, at), &usages, names);
                    let back = at + self.half_trip();
                    self.push(back, Event::Answer { node, actions });
                }
                Event::Answer { node, actions } => {
                    for (key, a) in actions {
                        if let Some(b) = self.buckets[node].get_mut(&key) {
                            b.assign(a, at);
                        }
                    }
                }
            }
        }
        sluices.timers.advance(until);
    }

    /// A node's report timer at `t`: every bucket reported; a node that left ends its stream.
    fn timer(&mut self, node: usize, t: u64, sluices: &mut Sluices<'_>) {
        if self.leaves(node, t) {
            self.gone[node] = true;
            let keys: Vec<BucketKey> = self.buckets[node]
                .keys()
                .filter_map(|&k| sluices.keys[k as usize].clone())
                .collect();
            // Its stream ends: its Envoy's admissions since its last report go with it.
            let i = sluices.of(node);
            sluices.doors[i]
                .book
                .ended("sim", node as u64 + 1, keys.into_iter(), self.t0 + t);
            return;
        }
        let usages: Vec<Usage> = self.buckets[node]
            .iter_mut()
            .map(|(&key, b)| b.report(key, t))
            .collect();
        self.send(node, t, usages);
        self.push(t + self.interval_ns, Event::Timer { node });
    }

    /// A request at node `node`: decided by its bucket, or by `no_assignment_behavior` for a
    /// new bucket (reported at once; the node's report timer starts with its first bucket).
    fn decide(&mut self, a: &Arrival) -> bool {
        let (node, cost) = (a.node as usize, u64::from(a.cost));
        if let Some(b) = self.buckets[node].get_mut(&a.key) {
            return b.decide(cost, a.t);
        }
        let (bucket, usage) = EnvoyBucket::new(a.key, cost, a.t);
        self.buckets[node].insert(a.key, bucket);
        if !self.started[node] {
            self.started[node] = true;
            self.push(a.t + self.interval_ns, Event::Timer { node });
        }
        self.send(node, a.t, vec![usage]);
        true
    }
}

/// What the `rlqs` policy admitted: each request's decision in arrival order, and the reports
/// Sluice answered (its RPCs).
pub(crate) struct RlqsRun {
    pub(crate) decisions: Vec<bool>,
    pub(crate) reports: u64,
}

/// Runs the `rlqs` policy over `traffic` with Sluice's `rules` (`run::rule_file`), the true
/// clock at `t0` at the start.
pub(crate) fn simulate_rlqs(
    (s, rules): (&Scenario, &RuleSet),
    traffic: &Generated,
    t0: u64,
    progress: &mut dyn FnMut(u64),
) -> RlqsRun {
    let instances = sluice_fleet(s);
    let fleet = Fleet::new(rules, &instances, t0);
    let mut sluices = Sluices::new(&fleet, &instances, traffic.keys.len());
    let nodes = s.nodes.count;
    let mut envoys = Envoys {
        s,
        t0,
        buckets: vec![HashMap::new(); nodes],
        started: vec![false; nodes],
        gone: vec![false; nodes],
        events: BinaryHeap::new(),
        pending: HashMap::new(),
        seq: 0,
        latency: LatencyDraw::new(s.seed, 0x71c5, s.store.latency_ms),
        interval_ns: (s.rlqs.report_interval_s * NS as f64).round().max(1.0) as u64,
    };
    let mut decisions = Vec::with_capacity(traffic.arrivals.len());
    for (n, a) in traffic.arrivals.iter().enumerate() {
        if n % 4096 == 4095 {
            progress(4096);
        }
        envoys.advance(a.t, &mut sluices, &traffic.keys);
        decisions.push(envoys.decide(a));
    }
    progress(traffic.arrivals.len() as u64 % 4096);
    RlqsRun {
        decisions,
        reports: sluices.reports,
    }
}

/// The Sluice instances of `s` as a fleet of their own: `rlqs.instances` nodes, up for the
/// whole run and on true clocks, sharing a store with the scenario's outages (the scenario's
/// nodes are its Envoys; `rlqs.unreachable` cuts them off Sluice: `Envoys::sluice_down`).
fn sluice_fleet(s: &Scenario) -> Scenario {
    let mut fleet = s.clone();
    fleet.nodes = NodeSpec {
        count: s.rlqs.instances.max(1),
        skew_ms: Vec::new(),
        join_s: Vec::new(),
        leave_s: Vec::new(),
        crash_s: Vec::new(),
        expected: None,
    };
    fleet
}
