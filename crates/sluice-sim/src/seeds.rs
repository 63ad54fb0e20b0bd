//! One scenario over many seeds. A seed is one draw of the scenario's traffic (arrival times,
//! routing, which instance a request lands on), and one draw is one story: a bound that holds
//! for one seed has failed for the next. [`over_seeds`] runs a scenario once per seed and
//! gives, per policy and class of keys, the spread of what each run measured.

use std::ops::RangeInclusive;

use serde::Serialize;

use crate::classes::ClassReport;
use crate::{Scenario, run};

/// One class's figures under one policy over every seed.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct SeedSpread {
    /// The policy.
    pub policy: String,
    /// The class of keys (see [`crate::classes`]).
    pub class: String,
    /// The runs (one per seed).
    pub runs: u64,
    /// The worst window over the limit, % of the limit: the least over the runs.
    pub over_least_pct: f64,
    /// The median run's worst window.
    pub over_median_pct: f64,
    /// The worst run's worst window.
    pub over_most_pct: f64,
    /// The seed of the worst run (the first such).
    pub over_most_seed: u64,
    /// The 99th percentile window over the limit: the most over the runs.
    pub p99_most_pct: f64,
    /// Busy windows (demand at least 1.2x the limit) over every run.
    pub busy_windows: u64,
    /// Busy windows that admitted under 95% of the limit, over every run.
    pub under_admitted: u64,
    /// Runs with at least one such window.
    pub runs_under_admitted: u64,
    /// The least a busy window admitted in any run, % of the limit.
    pub busy_least_pct: f64,
    /// False denials in % of the class's requests: the most over the runs.
    pub false_denials_most_pct: f64,
}

/// Runs `scenario` once per seed in `seeds` (its own `seed` replaced) and gives the spread per
/// policy and class, in the report's order.
pub fn over_seeds(scenario: &Scenario, seeds: RangeInclusive<u64>) -> Vec<SeedSpread> {
    let mut runs: Vec<(u64, Vec<(String, ClassReport)>)> = Vec::new();
    for seed in seeds {
        let mut s = scenario.clone();
        s.seed = seed;
        let report = run(&s);
        let classes = report
            .policies
            .into_iter()
            .flat_map(|p| {
                let policy = p.policy;
                p.classes.into_iter().map(move |c| (policy.clone(), c))
            })
            .collect();
        runs.push((seed, classes));
    }
    let Some((_, first)) = runs.first() else {
        return Vec::new();
    };
    first
        .iter()
        .map(|(policy, class)| {
            let same: Vec<(u64, &ClassReport)> = runs
                .iter()
                .filter_map(|(seed, cs)| {
                    cs.iter()
                        .find(|(p, c)| p == policy && c.class == class.class)
                        .map(|(_, c)| (*seed, c))
                })
                .collect();
            spread(policy, &class.class, &same)
        })
        .collect()
}

fn spread(policy: &str, class: &str, runs: &[(u64, &ClassReport)]) -> SeedSpread {
    let mut over: Vec<f64> = runs.iter().map(|(_, c)| c.over_max_pct).collect();
    over.sort_by(f64::total_cmp);
    let (most_seed, most) = runs
        .iter()
        .map(|(seed, c)| (*seed, c.over_max_pct))
        .fold((0, f64::MIN), |a, b| if b.1 > a.1 { b } else { a });
    let max = |f: fn(&ClassReport) -> f64| runs.iter().map(|(_, c)| f(c)).fold(0.0, f64::max);
    SeedSpread {
        policy: policy.to_owned(),
        class: class.to_owned(),
        runs: runs.len() as u64,
        over_least_pct: over.first().copied().unwrap_or(0.0),
        over_median_pct: over.get(over.len() / 2).copied().unwrap_or(0.0),
        over_most_pct: most.max(0.0),
        over_most_seed: most_seed,
        p99_most_pct: max(|c| c.over_p99_pct),
        busy_windows: runs.iter().map(|(_, c)| c.busy_windows).sum(),
        under_admitted: runs.iter().map(|(_, c)| c.under_admitted).sum(),
        runs_under_admitted: runs.iter().filter(|(_, c)| c.under_admitted > 0).count() as u64,
        busy_least_pct: runs
            .iter()
            .map(|(_, c)| c.busy_min_pct)
            .fold(100.0, f64::min),
        false_denials_most_pct: max(|c| c.false_denial_pct),
    }
}

/// The spread as a Markdown table.
pub fn markdown(spreads: &[SeedSpread]) -> String {
    let mut out = String::from(
        "| policy | class | worst window over: least / median / most (seed) | p99 over: most | busy windows under 95% | runs with one | least busy window | false denials: most |\n\
         |---|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for s in spreads {
        out.push_str(&format!(
            "| {} | {} | {:.1} / {:.1} / {:.1}% ({}) | {:.1}% | {} of {} | {} of {} | {:.0}% | {:.2}% |\n",
            s.policy,
            s.class,
            s.over_least_pct,
            s.over_median_pct,
            s.over_most_pct,
            s.over_most_seed,
            s.p99_most_pct,
            s.under_admitted,
            s.busy_windows,
            s.runs_under_admitted,
            s.runs,
            s.busy_least_pct,
            s.false_denials_most_pct,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spread_is_taken_over_every_seed() {
        let s = Scenario::parse(
            "s.yaml",
            "duration_s: 120\nseed: 1\nrule: { limit: 50, window_s: 30 }\nnodes: { count: 3 }\ntraffic:\n  - steady: { rate: 4, prefix: busy }\n  - steady: { rate: 0.5, keys: 3, prefix: calm }\npolicies: [reactive, exact]\n",
        )
        .unwrap();
        let spreads = over_seeds(&s, 1..=4);
        let classes: Vec<(&str, &str)> = spreads
            .iter()
            .map(|s| (s.policy.as_str(), s.class.as_str()))
            .collect();
        assert_eq!(
            classes,
            [
                ("reactive", "busy"),
                ("reactive", "calm"),
                ("exact", "busy"),
                ("exact", "calm")
            ]
        );
        // The figures are those of the four runs, taken one by one.
        let mut worst = Vec::new();
        for seed in 1..=4 {
            let mut one = s.clone();
            one.seed = seed;
            let r = run(&one);
            let busy = r.policies[0].classes.iter().find(|c| c.class == "busy");
            worst.push((seed, busy.unwrap().over_max_pct));
        }
        let busy = &spreads[0];
        assert_eq!(busy.runs, 4);
        let most = worst.iter().map(|w| w.1).fold(f64::MIN, f64::max);
        assert_eq!(busy.over_most_pct, most);
        assert_eq!(
            busy.over_most_seed,
            worst.iter().find(|w| w.1 == most).unwrap().0
        );
        assert!(busy.over_least_pct <= busy.over_median_pct);
        assert!(busy.over_median_pct <= busy.over_most_pct);
        assert!(
            busy.busy_windows > 0,
            "4/s on a limit of 50 per 30 s is busy"
        );
        assert_eq!(spreads[2].over_most_pct, 0.0, "exact never over-admits");
        let table = markdown(&spreads);
        assert_eq!(table.lines().count(), 2 + 4);
        assert!(
            table.contains("| exact | calm | 0.0 / 0.0 / 0.0%"),
            "{table}"
        );
    }
}
