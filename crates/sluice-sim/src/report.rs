//! A simulation's report: per policy, how far over the limit the busiest windows went, false
//! denials, reaction time, store load, and what one node estimated over time; as Markdown.

use serde::Serialize;

use crate::classes::ClassReport;

/// What one node knew about the busiest key at one moment.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct EstimateSample {
    /// Seconds since the start.
    pub t_s: f64,
    /// The predictive estimate of the global count in the window.
    pub estimate: f64,
    /// The other nodes' counts in the window total read at the last flush.
    pub others_read: u64,
    /// The seed's node estimate.
    pub node_estimate: u64,
    /// Instances with a live entry for the key.
    pub live_instances: usize,
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
    /// Over-admission per key-window in % of the limit: the largest.
    pub over_max_pct: f64,
    /// Mean over-admission, % of the limit.
    pub over_mean_pct: f64,
    /// 99th percentile over-admission, % of the limit.
    pub over_p99_pct: f64,
    /// Key-windows that were their key's first (no request in the window before).
    pub first_windows: u64,
    /// Over-admission of first windows, % of the limit: the largest.
    pub first_over_max_pct: f64,
    /// Over-admission of first windows: the 99th percentile.
    pub first_over_p99_pct: f64,
    /// Over-admission of the other (warm) windows: the largest.
    pub warm_over_max_pct: f64,
    /// Over-admission of the warm windows: the 99th percentile.
    pub warm_over_p99_pct: f64,
    /// Requests denied while the true global count in the window the policy enforces (the
    /// fixed window; the sliding estimate for `predictive_sliding`) left room for them.
    pub false_denials: u64,
    /// False denials in % of requests.
    pub false_denial_pct: f64,
    /// Seconds from the first admission that put an attacker's key over the limit to its
    /// first denial (0 when it never went over first): how long the attack ran past the limit (the slowest attack; absent without
    /// attackers or when an attacker was never denied).
    pub attack_reaction_s: Option<f64>,
    /// Store round trips (flushes, time probes and exact decisions).
    pub store_ops: u64,
    /// Store round trips per simulated second.
    pub store_ops_per_s: f64,
    /// Store round trips per request.
    pub store_ops_per_request: f64,
    /// Redis commands those round trips would take, per request (`INCRBY`, `HSET`, ...).
    pub store_commands_per_request: f64,
    /// Admitted per window for the busiest key.
    pub busiest_key_admitted: Vec<u64>,
    /// Admitted per window, all keys together.
    pub admitted_by_window: Vec<u64>,
    /// The largest over-admission of any key per window, % of the limit.
    pub over_by_window_pct: Vec<f64>,
    /// What the observer node knew about the busiest key, sampled at its flush timer (synced
    /// policies).
    pub estimates: Vec<EstimateSample>,
    /// The figures per class of keys (see [`crate::classes`]).
    pub classes: Vec<ClassReport>,
}

/// All policies' results.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Report {
    /// Limit per window.
    pub limit: u64,
    /// Window, seconds.
    pub window_s: u64,
    /// Spans per window.
    pub spans: u32,
    /// Nodes.
    pub nodes: usize,
    /// Simulated seconds.
    pub duration_s: u64,
    /// The key with the most requests.
    pub busiest_key: String,
    /// The node that received most of them: the estimates are what it knew.
    pub observer_node: usize,
    /// Per policy.
    pub policies: Vec<PolicyReport>,
}

impl Report {
    /// The report as a Markdown table (for docs/ACCURACY.md).
    pub fn markdown(&self) -> String {
        let mut out = String::from(
            "| policy | requests | admitted | over max | over mean | over p99 | first windows: max | first windows: p99 | false denials | reaction s | store ops/s | ops/request | commands/request |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for p in &self.policies {
            out.push_str(&format!(
                "| {} | {} | {} | {:.1}% | {:.2}% | {:.1}% | {:.1}% | {:.1}% | {:.3}% | {} | {:.2} | {:.4} | {:.4} |\n",
                p.policy,
                p.requests,
                p.admitted,
                p.over_max_pct,
                p.over_mean_pct,
                p.over_p99_pct,
                p.first_over_max_pct,
                p.first_over_p99_pct,
                p.false_denial_pct,
                p.attack_reaction_s
                    .map_or_else(|| "-".to_owned(), |r| format!("{r:.1}")),
                p.store_ops_per_s,
                p.store_ops_per_request,
                p.store_commands_per_request
            ));
        }
        out.push_str(&self.per_class());
        out
    }

    /// Per policy, the figures per class of keys, when the traffic has more than one class.
    fn per_class(&self) -> String {
        let mut out = String::new();
        for p in self.policies.iter().filter(|p| p.classes.len() > 1) {
            out.push_str(&format!(
                "\n{}, per class (limit {} per {} s):\n\n{}",
                p.policy,
                self.limit,
                self.window_s,
                crate::classes::markdown(&p.classes)
            ));
        }
        out
    }

    /// The report as a table.
    pub fn table(&self) -> String {
        let mut out = format!(
            "limit {} per {} s, {} spans, {} nodes, {} s simulated\n{:<20} {:>9} {:>9} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9} {:>8} {:>9} {:>9} {:>9}\n",
            self.limit,
            self.window_s,
            self.spans,
            self.nodes,
            self.duration_s,
            "policy",
            "requests",
            "admitted",
            "over max",
            "mean",
            "p99",
            "1st max",
            "1st p99",
            "false den",
            "react s",
            "ops/s",
            "ops/req",
            "cmds/req"
        );
        for p in &self.policies {
            let react = p
                .attack_reaction_s
                .map_or_else(|| "-".to_owned(), |r| format!("{r:.1}"));
            out.push_str(&format!(
                "{:<20} {:>9} {:>9} {:>7.1}% {:>7.2}% {:>7.1}% {:>8.1}% {:>8.1}% {:>8.3}% {:>8} {:>9.2} {:>9.4} {:>9.4}\n",
                p.policy,
                p.requests,
                p.admitted,
                p.over_max_pct,
                p.over_mean_pct,
                p.over_p99_pct,
                p.first_over_max_pct,
                p.first_over_p99_pct,
                p.false_denial_pct,
                react,
                p.store_ops_per_s,
                p.store_ops_per_request,
                p.store_commands_per_request
            ));
        }
        out.push_str(&self.per_class());
        out
    }
}
