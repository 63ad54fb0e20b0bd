//! Scenario files: what to simulate.

use std::path::Path;

use serde::Deserialize;
use serde_saphyr::Spanned;

mod checks;

use checks::{
    nodes_problem, policies_problem, rule_problem, tenant_policies_problem, traffic_problem,
};

/// A simulation: one rule, some nodes, traffic, store behaviour.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Simulated time, seconds.
    pub duration_s: u64,
    /// Random seed: the same file and seed give the same result.
    pub seed: u64,
    /// The rule.
    pub rule: RuleSpec,
    /// Nodes.
    pub nodes: NodeSpec,
    /// Traffic generators.
    pub traffic: Vec<Traffic>,
    /// Store behaviour.
    pub store: StoreSpec,
    /// Policies to compare (default: all five).
    pub policies: Option<Vec<String>>,
    /// How the `rlqs` policy's Envoys report.
    pub rlqs: RlqsSpec,
    /// Requests read from trace files (one list per `trace` generator, in order).
    pub(crate) traces: Vec<Vec<TraceEvent>>,
}

/// The rule under test.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// Requests per window (global).
    pub limit: u64,
    /// Window, seconds.
    pub window_s: u64,
    /// Spans per window (synced policies).
    #[serde(default = "default_spans")]
    pub spans: u32,
    /// Cooldown after a key is found over its limit, seconds (synced policies; 0: none).
    #[serde(default)]
    pub cooldown_s: f64,
}

fn default_spans() -> u32 {
    6
}

/// Nodes.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    /// How many (at most; see `join_s` and `leave_s`).
    pub count: usize,
    /// Clock skew per node, milliseconds (missing entries: 0).
    #[serde(default)]
    pub skew_ms: Vec<i64>,
    /// When each node starts taking traffic, seconds (missing entries: 0).
    #[serde(default)]
    pub join_s: Vec<u64>,
    /// When each node stops (after a final flush), seconds (missing entries or `~`: never).
    #[serde(default)]
    pub leave_s: Vec<Option<u64>>,
    /// When each node crashes, seconds (missing entries or `~`: never): it stops at once, as
    /// `SIGKILL` stops `sluice serve`, with no last flush and without taking itself off the
    /// fleet's list (the others count it until its announcement ages out).
    #[serde(default)]
    pub crash_s: Vec<Option<u64>>,
    /// The instance count the engines are configured with (`expected_instances`; the seed's
    /// `N`, a floor: the engines learn the fleet's size from the store); default 1.
    #[serde(default)]
    pub expected: Option<u64>,
}

impl NodeSpec {
    /// Whether node `i` takes traffic at `t_ns` after the start.
    pub fn active(&self, i: usize, t_ns: u64) -> bool {
        let gone = self.leave_ns(i).into_iter().chain(self.crash_ns(i)).min();
        (self.join_ns(i)..gone.unwrap_or(u64::MAX)).contains(&t_ns)
    }

    /// When node `i` joins (ns since the start; 0: with the start).
    pub fn join_ns(&self, i: usize) -> u64 {
        self.join_s.get(i).copied().unwrap_or(0).saturating_mul(NS)
    }

    /// When node `i` leaves (ns since the start), if it does.
    pub fn leave_ns(&self, i: usize) -> Option<u64> {
        at_ns(&self.leave_s, i)
    }

    /// When node `i` crashes (ns since the start), if it does.
    pub fn crash_ns(&self, i: usize) -> Option<u64> {
        at_ns(&self.crash_s, i)
    }
}

/// Node `i`'s entry of a per-node list of seconds, in ns.
fn at_ns(list: &[Option<u64>], i: usize) -> Option<u64> {
    list.get(i).copied().flatten().map(|s| s.saturating_mul(NS))
}

/// A second.
const NS: u64 = 1_000_000_000;

/// A traffic generator. Keys are named `{prefix}-{n}` (prefix `key` unless set), so several
/// generators can share keys.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Traffic {
    /// Poisson arrivals at `rate` per second over `keys` keys, spread over the live nodes by
    /// `weights` (even when absent); or, `paced`, evenly spaced arrivals on each node at its
    /// part of `rate` by `weights` (a node not live meanwhile loses its part: it is not spread
    /// over the others).
    Steady {
        /// Requests per second, all nodes together.
        rate: f64,
        /// Distinct keys.
        #[serde(default = "one")]
        keys: u64,
        /// Share of each node (uneven load balancing).
        #[serde(default)]
        weights: Vec<f64>,
        /// From, seconds.
        #[serde(default)]
        start_s: u64,
        /// Until, seconds (default: the end).
        #[serde(default)]
        end_s: Option<u64>,
        /// Key name prefix.
        #[serde(default)]
        prefix: Option<String>,
        /// A tenant over these users: each request also carries the rule's second
        /// descriptor, `tenant` with this value, counted against the same limit.
        #[serde(default)]
        tenant: Option<String>,
        /// Evenly spaced arrivals on each node (its part of `rate` by `weights`), as a load
        /// generator paces them, instead of Poisson arrivals; a node's part while it is not
        /// live is dropped.
        #[serde(default)]
        paced: bool,
    },
    /// Poisson bursts: `rate` per second for `length_s` seconds every `every_s` seconds,
    /// nothing in between.
    Bursts {
        /// Requests per second during a burst.
        rate: f64,
        /// Seconds from one burst's start to the next.
        every_s: f64,
        /// Length of a burst, seconds.
        length_s: f64,
        /// Distinct keys.
        #[serde(default = "one")]
        keys: u64,
        /// Share of each node.
        #[serde(default)]
        weights: Vec<f64>,
        /// From, seconds.
        #[serde(default)]
        start_s: u64,
        /// Until, seconds.
        #[serde(default)]
        end_s: Option<u64>,
        /// Key name prefix.
        #[serde(default)]
        prefix: Option<String>,
        /// A tenant over these users: each request also carries the rule's second
        /// descriptor, `tenant` with this value, counted against the same limit.
        #[serde(default)]
        tenant: Option<String>,
    },
    /// One client hammering one node with one key between `start_s` and `end_s`.
    Attacker {
        /// Requests per second.
        rate: f64,
        /// The node it hits.
        node: usize,
        /// Its key.
        key: String,
        /// From, seconds.
        #[serde(default)]
        start_s: u64,
        /// Until, seconds.
        end_s: u64,
    },
    /// Key-affinity balancing (sticky sessions, consistent hashing): each key has a home node
    /// among the live ones and goes there with probability `affinity`, elsewhere otherwise.
    KeyAffinity {
        /// Requests per second, all nodes together.
        rate: f64,
        /// Distinct keys.
        #[serde(default = "one")]
        keys: u64,
        /// Probability that a request goes to its key's home node.
        #[serde(default = "default_affinity")]
        affinity: f64,
        /// From, seconds.
        #[serde(default)]
        start_s: u64,
        /// Until, seconds.
        #[serde(default)]
        end_s: Option<u64>,
        /// Key name prefix.
        #[serde(default)]
        prefix: Option<String>,
    },
    /// A daily-style ramp: the rate follows a cosine between `min_rate` (at the start) and
    /// `max_rate` (half a period later).
    Diurnal {
        /// Lowest rate, requests per second.
        min_rate: f64,
        /// Highest rate, requests per second.
        max_rate: f64,
        /// Period, seconds.
        period_s: f64,
        /// Distinct keys.
        #[serde(default = "one")]
        keys: u64,
        /// Share of each node.
        #[serde(default)]
        weights: Vec<f64>,
        /// Key name prefix.
        #[serde(default)]
        prefix: Option<String>,
    },
    /// Users that come and go (per-user limits with user churn): new users arrive at
    /// `users_per_s` (Poisson), each sends `rate` requests per second for `lifetime_s`, spread
    /// over the live nodes by `weights`. Each user is a key of its own (`{prefix}-{n}`), so
    /// every user starts cold.
    Churn {
        /// New users per second.
        users_per_s: f64,
        /// Requests per second of one user.
        rate: f64,
        /// How long a user sends, seconds.
        lifetime_s: f64,
        /// Share of each node.
        #[serde(default)]
        weights: Vec<f64>,
        /// From, seconds.
        #[serde(default)]
        start_s: u64,
        /// Until, seconds (no user arrives after; default: the end).
        #[serde(default)]
        end_s: Option<u64>,
        /// Key name prefix.
        #[serde(default)]
        prefix: Option<String>,
        /// A tenant over these users: each request also carries the rule's second
        /// descriptor, `tenant` with this value, counted against the same limit.
        #[serde(default)]
        tenant: Option<String>,
    },
    /// Replays a JSON-lines file of requests, one object per line:
    /// `{"t_ms": <int>, "node": <int>, "key": "<string>", "cost": <int, optional>}`.
    /// The path is relative to the scenario file.
    Trace {
        /// The trace file.
        file: String,
    },
}

impl Traffic {
    /// The tenant its requests also count against, if any.
    pub fn tenant(&self) -> Option<&str> {
        match self {
            Traffic::Steady { tenant, .. }
            | Traffic::Bursts { tenant, .. }
            | Traffic::Churn { tenant, .. } => tenant.as_deref(),
            _ => None,
        }
    }
}

fn one() -> u64 {
    1
}

fn default_affinity() -> f64 {
    0.9
}

/// Store behaviour.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSpec {
    /// Intervals `[start_s, end_s)` when the store is unreachable.
    #[serde(default)]
    pub outages: Vec<(u64, u64)>,
    /// Round-trip latency of a flush (log-normal through the median and the 99th percentile;
    /// fixed when `p99` is absent).
    #[serde(default)]
    pub latency_ms: Option<Latency>,
    /// Whether the nodes follow the store's clock (Redis's `TIME`; the default). `false`: each
    /// node keeps its own clock, `nodes.skew_ms` and all, as instances on a store without a
    /// clock whose hosts' clocks differ by what NTP leaves.
    #[serde(default = "yes")]
    pub clock: bool,
}

fn yes() -> bool {
    true
}

impl Default for StoreSpec {
    fn default() -> Self {
        Self {
            outages: Vec::new(),
            latency_ms: None,
            clock: true,
        }
    }
}

/// The `rlqs` policy: each node is an Envoy with the `rate_limit_quota` filter.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RlqsSpec {
    /// Seconds between an Envoy's usage reports (Envoy 1.40 reports every 5 s whatever its
    /// `reporting_interval` says; Sluice sizes its assignments for 5 s).
    #[serde(default = "default_report_interval")]
    pub report_interval_s: f64,
    /// The `sluice serve` instances the Envoys report to (node `i` to instance `i % instances`),
    /// sharing one store as instances on one Redis do: with one, its rule is local (its count
    /// exact); with several, synced (`predictive`), each handing its Envoys its part of the
    /// room. Default 1.
    #[serde(default = "one_instance")]
    pub instances: usize,
    /// `[start_s, end_s)` spans in which the Envoys cannot reach Sluice (a partition, a
    /// restarting balancer): a report sent then is lost with its counts, as Envoy 1.40 drops
    /// what it built while its stream was down, and each Envoy keeps its last assignment.
    /// (`store.outages` are the store unreachable to the Sluice instances, as for the other
    /// policies.)
    #[serde(default)]
    pub unreachable: Vec<(u64, u64)>,
}

fn one_instance() -> usize {
    1
}

fn default_report_interval() -> f64 {
    5.0
}

impl Default for RlqsSpec {
    fn default() -> Self {
        Self {
            report_interval_s: default_report_interval(),
            instances: one_instance(),
            unreachable: Vec::new(),
        }
    }
}

/// A latency distribution.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Latency {
    /// Median, milliseconds.
    pub median: f64,
    /// 99th percentile, milliseconds (at least the median).
    #[serde(default)]
    pub p99: Option<f64>,
}

/// One request read from a trace.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TraceEvent {
    pub t_ms: u64,
    pub node: usize,
    pub key: String,
    #[serde(default = "one")]
    pub cost: u64,
}

/// A scenario file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{file}:{line}:{column}: {message}")]
pub struct ScenarioError {
    /// File.
    pub file: String,
    /// Line (0: whole file).
    pub line: u64,
    /// Column.
    pub column: u64,
    /// What is wrong.
    pub message: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    duration_s: Spanned<u64>,
    seed: u64,
    rule: Spanned<RuleSpec>,
    nodes: Spanned<NodeSpec>,
    traffic: Spanned<Vec<Spanned<Traffic>>>,
    #[serde(default)]
    store: Option<Spanned<StoreSpec>>,
    #[serde(default)]
    policies: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    rlqs: Option<Spanned<RlqsSpec>>,
}

impl Scenario {
    /// Reads a scenario file and the trace files it names.
    pub fn load(path: &Path) -> Result<Self, ScenarioError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ScenarioError {
            file: file.clone(),
            line: 0,
            column: 0,
            message: format!("cannot read the scenario: {e}"),
        })?;
        let mut scenario = Self::parse(&file, &text)?;
        let dir = path.parent().unwrap_or(Path::new("."));
        for traffic in &scenario.traffic {
            if let Traffic::Trace { file } = traffic {
                let trace = dir.join(file);
                let text = std::fs::read_to_string(&trace).map_err(|e| ScenarioError {
                    file: trace.display().to_string(),
                    line: 0,
                    column: 0,
                    message: format!("cannot read the trace named in {}: {e}", path.display()),
                })?;
                let events = parse_trace(&trace.display().to_string(), &text, &scenario.nodes)?;
                scenario.traces.push(events);
            }
        }
        Ok(scenario)
    }

    /// Parses and checks a scenario; `file` names it in errors. Trace generators read
    /// nothing here: [`Scenario::load`] reads their files, [`Scenario::with_trace`] supplies
    /// one directly.
    pub fn parse(file: &str, text: &str) -> Result<Self, ScenarioError> {
        let err = |line, column, message: String| ScenarioError {
            file: file.to_owned(),
            line,
            column,
            message,
        };
        let raw: Raw = serde_saphyr::from_str(text).map_err(|e| {
            let (l, c, message) = sluice_config::describe_yaml_error(
                &e,
                text,
                "the file is empty; a scenario starts with `duration_s:` (docs/CONFIG.md)",
            );
            err(l, c, message)
        })?;
        let at = |s: &serde_saphyr::Location, m: &str| Err(err(s.line(), s.column(), m.to_owned()));
        if raw.duration_s.value == 0 || raw.duration_s.value > 7 * 86_400 {
            return at(
                &raw.duration_s.referenced,
                "duration_s must be between 1 and 604800 (a week)",
            );
        }
        if let Some(problem) = rule_problem(&raw.rule.value) {
            return at(&raw.rule.referenced, problem);
        }
        let n = raw.nodes.value.count;
        if let Some(problem) = nodes_problem(&raw.nodes.value) {
            return at(&raw.nodes.referenced, problem);
        }
        for t in &raw.traffic.value {
            if let Some(problem) = traffic_problem(&t.value, n, raw.duration_s.value) {
                return at(&t.referenced, problem);
            }
        }
        let store = raw.store.map(|s| {
            let ok = s.value.outages.iter().all(|(a, b)| a < b)
                && s.value.latency_ms.is_none_or(|l| {
                    l.median >= 0.0
                        && l.median <= 600_000.0
                        && l.p99.is_none_or(|p| p >= l.median && p <= 600_000.0)
                });
            (s, ok)
        });
        if let Some((s, false)) = &store {
            return at(
                &s.referenced,
                "store.outages are [start_s, end_s] with start_s < end_s; latency_ms needs 0 <= median <= p99 <= 600000",
            );
        }
        if let Some(p) = &raw.policies
            && let Some(problem) = policies_problem(&p.value)
        {
            return at(&p.referenced, &problem);
        }
        let tenants = raw.traffic.value.iter().any(|t| t.value.tenant().is_some());
        if let Some(p) = &raw.policies
            && let Some(problem) = tenant_policies_problem(tenants, &p.value)
        {
            return at(&p.referenced, problem);
        }
        if let Some(r) = &raw.rlqs
            && !(0.1..=3600.0).contains(&r.value.report_interval_s)
        {
            return at(
                &r.referenced,
                "rlqs.report_interval_s must be between 0.1 and 3600",
            );
        }
        if let Some(r) = &raw.rlqs
            && !(1..=64).contains(&r.value.instances)
        {
            return at(&r.referenced, "rlqs.instances must be between 1 and 64");
        }
        if let Some(r) = &raw.rlqs
            && !r.value.unreachable.iter().all(|(a, b)| a < b)
        {
            return at(
                &r.referenced,
                "rlqs.unreachable spans are [start_s, end_s] with start_s < end_s",
            );
        }
        Ok(Scenario {
            duration_s: raw.duration_s.value,
            seed: raw.seed,
            rule: raw.rule.value,
            nodes: raw.nodes.value,
            traffic: raw.traffic.value.into_iter().map(|t| t.value).collect(),
            store: store.map(|(s, _)| s.value).unwrap_or_default(),
            policies: raw.policies.map(|p| p.value),
            rlqs: raw.rlqs.map(|r| r.value).unwrap_or_default(),
            traces: Vec::new(),
        })
    }

    /// Whether some requests also count against a tenant: the rule then has a second
    /// descriptor, `tenant`.
    pub fn has_tenants(&self) -> bool {
        self.traffic.iter().any(|t| t.tenant().is_some())
    }

    /// Why `policies` cannot run this scenario, if they cannot (policies named on a command
    /// line, checked as the file's are).
    pub fn policies_problem(&self, policies: &[String]) -> Option<&'static str> {
        tenant_policies_problem(self.has_tenants(), policies)
    }

    /// Supplies the requests of the next `trace` generator from JSON-lines text (`file` names
    /// it in errors).
    pub fn with_trace(mut self, file: &str, text: &str) -> Result<Self, ScenarioError> {
        let events = parse_trace(file, text, &self.nodes)?;
        self.traces.push(events);
        Ok(self)
    }
}

fn parse_trace(file: &str, text: &str, nodes: &NodeSpec) -> Result<Vec<TraceEvent>, ScenarioError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i as u64 + 1;
        if line.trim().is_empty() {
            continue;
        }
        let err = |column: u64, message: String| ScenarioError {
            file: file.to_owned(),
            line: line_no,
            column,
            message,
        };
        let event: TraceEvent = serde_json::from_str(line).map_err(|e| {
            err(
                e.column() as u64,
                format!(
                    "{e}; each line is {{\"t_ms\": <int>, \"node\": <int>, \"key\": \"<string>\", \"cost\": <int, optional>}}"
                ),
            )
        })?;
        if event.node >= nodes.count {
            return Err(err(
                1,
                format!(
                    "node {} is not one of the scenario's {} nodes (numbered from 0)",
                    event.node, nodes.count
                ),
            ));
        }
        if event.cost == 0 || event.cost > 1_000_000 {
            return Err(err(1, "cost must be between 1 and 1000000".to_owned()));
        }
        out.push(event);
    }
    Ok(out)
}
