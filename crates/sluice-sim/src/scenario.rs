//! Scenario files.

use serde::Deserialize;

/// A simulation: one rule, some nodes, traffic, store behaviour.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
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
    #[serde(default)]
    pub store: StoreSpec,
    /// Policies to compare (default: all five).
    #[serde(default)]
    pub policies: Option<Vec<String>>,
}

/// The rule under test.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// Requests per window (global).
    pub limit: u64,
    /// Window, seconds.
    pub window_s: u64,
    /// Spans per window.
    #[serde(default = "default_spans")]
    pub spans: u32,
}

fn default_spans() -> u32 {
    6
}

/// Nodes.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    /// How many.
    pub count: usize,
    /// Clock skew per node, milliseconds (missing entries: 0).
    #[serde(default)]
    pub skew_ms: Vec<i64>,
}

/// A traffic generator.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Traffic {
    /// Poisson arrivals at `rate` per second over `keys` keys, spread over the nodes by
    /// `weights` (even when absent).
    Steady {
        /// Requests per second, all nodes together.
        rate: f64,
        /// Distinct keys (`key-0` ..).
        #[serde(default = "one")]
        keys: u64,
        /// Share of each node.
        #[serde(default)]
        weights: Vec<f64>,
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
}

fn one() -> u64 {
    1
}

/// Store behaviour.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSpec {
    /// Intervals `[start_s, end_s)` when the store is unreachable.
    #[serde(default)]
    pub outages: Vec<(u64, u64)>,
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

impl Scenario {
    /// Parses and checks a scenario; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<Self, ScenarioError> {
        let err = |line, column, message: String| ScenarioError {
            file: file.to_owned(),
            line,
            column,
            message,
        };
        let scenario: Scenario = serde_saphyr::from_str(text).map_err(|e| {
            let (l, c) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
            err(
                l,
                c,
                e.without_snippet()
                    .to_string()
                    .lines()
                    .next()
                    .unwrap_or("invalid scenario")
                    .to_owned(),
            )
        })?;
        let fail = |m: &str| Err(err(0, 0, m.to_owned()));
        if scenario.rule.limit == 0 || scenario.rule.window_s == 0 {
            return fail("rule.limit and rule.window_s must be at least 1");
        }
        if scenario.rule.spans < 2 {
            return fail("rule.spans must be at least 2");
        }
        if scenario.nodes.count == 0 || scenario.nodes.count > 1000 {
            return fail("nodes.count must be between 1 and 1000");
        }
        if scenario.duration_s == 0 || scenario.duration_s > 7 * 86_400 {
            return fail("duration_s must be between 1 and 604800");
        }
        for t in &scenario.traffic {
            match t {
                Traffic::Steady { rate, weights, .. }
                    if *rate < 0.0
                        || (!weights.is_empty() && weights.len() != scenario.nodes.count) =>
                {
                    return fail(
                        "steady traffic needs a rate >= 0 and, if given, one weight per node",
                    );
                }
                Traffic::Attacker { node, .. } if *node >= scenario.nodes.count => {
                    return fail(
                        "attacker.node is not one of the nodes (they are numbered from 0)",
                    );
                }
                _ => {}
            }
        }
        Ok(scenario)
    }
}
