//! What is wrong with a scenario's parts, if anything: each check names the first problem.

use super::{NodeSpec, RuleSpec, Traffic};

/// What is wrong with a scenario's `policies`, if anything.
pub(super) fn policies_problem(policies: &[String]) -> Option<String> {
    let all = &crate::policy::ALL_POLICIES;
    let bad = policies.iter().find(|x| !all.contains(&x.as_str()))?;
    Some(format!(
        "unknown policy `{bad}`; {}",
        sluice_config::suggestion(bad, all)
    ))
}

/// Why `policies` cannot run traffic with tenants (`tenants`), if they cannot: the `rlqs`
/// policy's Envoys put a request in one bucket, of one descriptor.
pub(crate) fn tenant_policies_problem(tenants: bool, policies: &[String]) -> Option<&'static str> {
    (tenants && policies.iter().any(|x| x == "rlqs")).then_some(
        "the rlqs policy does not run `tenant` traffic (an Envoy's bucket is one descriptor); run it without `rlqs`",
    )
}

/// What is wrong with a scenario's `rule`, if anything.
pub(super) fn rule_problem(rule: &RuleSpec) -> Option<&'static str> {
    if rule.limit == 0 || rule.window_s == 0 {
        return Some("rule.limit and rule.window_s must be at least 1");
    }
    if rule.spans < 2 || rule.spans > 1000 {
        return Some("rule.spans must be between 2 and 1000");
    }
    if !(rule.cooldown_s >= 0.0 && rule.cooldown_s <= 86_400.0) {
        return Some("rule.cooldown_s must be between 0 and 86400");
    }
    None
}

/// What is wrong with a scenario's `nodes`, if anything.
pub(super) fn nodes_problem(nodes: &NodeSpec) -> Option<&'static str> {
    let n = nodes.count;
    if n == 0 || n > 1000 {
        return Some("nodes.count must be between 1 and 1000");
    }
    if [
        nodes.skew_ms.len(),
        nodes.join_s.len(),
        nodes.leave_s.len(),
        nodes.crash_s.len(),
    ]
    .iter()
    .any(|&len| len > n)
    {
        return Some("nodes.skew_ms, join_s, leave_s and crash_s take at most one entry per node");
    }
    if nodes.skew_ms.iter().any(|s| s.abs() > 3_600_000) {
        return Some("nodes.skew_ms entries must be within an hour (3600000)");
    }
    let before_join = |at: &[Option<u64>]| {
        (0..n).any(|i| {
            let join = nodes.join_s.get(i).copied().unwrap_or(0);
            at.get(i).copied().flatten().is_some_and(|l| l <= join)
        })
    };
    if before_join(&nodes.leave_s) {
        return Some("a node must join (join_s) before it leaves (leave_s)");
    }
    if before_join(&nodes.crash_s) {
        return Some("a node must join (join_s) before it crashes (crash_s)");
    }
    if (0..n).any(|i| {
        matches!(
            (nodes.leave_s.get(i), nodes.crash_s.get(i)),
            (Some(Some(_)), Some(Some(_)))
        )
    }) {
        return Some("a node either leaves (leave_s) or crashes (crash_s), not both");
    }
    if nodes.expected == Some(0) {
        return Some("nodes.expected must be at least 1");
    }
    None
}

/// What is wrong with one generator of `traffic`, given `n` nodes and a run of `duration_s`.
// Over 80 lines on purpose: one arm per kind of generator, each a list of its checks.
pub(super) fn traffic_problem(t: &Traffic, n: usize, duration_s: u64) -> Option<&'static str> {
    let weights_ok = |w: &Vec<f64>| {
        w.is_empty() || (w.len() == n && w.iter().all(|x| *x >= 0.0) && w.iter().sum::<f64>() > 0.0)
    };
    let rate_ok = |r: f64| (0.0..=10_000_000.0).contains(&r);
    let keys_ok = |k: u64| (1..=100_000_000).contains(&k);
    if t.tenant().is_some_and(|x| x.is_empty() || x.len() > 256) {
        return Some("tenant must be 1 to 256 characters");
    }
    let (ok, problem) = match t {
        Traffic::Steady {
            rate,
            keys,
            weights,
            ..
        } => (
            rate_ok(*rate) && keys_ok(*keys) && weights_ok(weights),
            "steady needs 0 <= rate <= 1e7, 1 <= keys <= 1e8 and, if given, one weight >= 0 per node",
        ),
        Traffic::Bursts {
            rate,
            every_s,
            length_s,
            keys,
            weights,
            ..
        } => (
            rate_ok(*rate)
                && keys_ok(*keys)
                && weights_ok(weights)
                && *length_s > 0.0
                && length_s <= every_s,
            "bursts needs 0 <= rate <= 1e7, 0 < length_s <= every_s, 1 <= keys <= 1e8 and, if given, one weight per node",
        ),
        Traffic::Attacker { node, .. } if *node >= n => (
            false,
            "attacker.node is not one of the nodes (they are numbered from 0)",
        ),
        Traffic::Attacker { rate, .. } => {
            (rate_ok(*rate), "attacker.rate must be between 0 and 1e7")
        }
        Traffic::KeyAffinity {
            rate,
            keys,
            affinity,
            ..
        } => (
            rate_ok(*rate) && keys_ok(*keys) && (0.0..=1.0).contains(affinity),
            "key_affinity needs 0 <= rate <= 1e7, 1 <= keys <= 1e8 and 0 <= affinity <= 1",
        ),
        Traffic::Diurnal {
            min_rate,
            max_rate,
            period_s,
            keys,
            weights,
            ..
        } => (
            rate_ok(*min_rate)
                && rate_ok(*max_rate)
                && min_rate <= max_rate
                && *period_s > 0.0
                && keys_ok(*keys)
                && weights_ok(weights),
            "diurnal needs 0 <= min_rate <= max_rate <= 1e7, period_s > 0, 1 <= keys <= 1e8 and, if given, one weight per node",
        ),
        Traffic::Churn {
            users_per_s,
            rate,
            lifetime_s,
            weights,
            ..
        } => (
            rate_ok(*rate)
                && (0.0..=1e4).contains(users_per_s)
                && users_per_s * duration_s as f64 <= 1e6
                && (0.0..=86_400.0).contains(lifetime_s)
                && *lifetime_s > 0.0
                && weights_ok(weights),
            "churn needs 0 <= rate <= 1e7, 0 <= users_per_s <= 1e4 with at most 1e6 users in the run, 0 < lifetime_s <= 86400 and, if given, one weight per node",
        ),
        Traffic::Trace { file } => (!file.is_empty(), "trace.file must name a JSON-lines file"),
    };
    (!ok).then_some(problem)
}
