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
    /// The runs in which the class had traffic.
    pub runs: u64,
    /// Each run's worst window over the limit, % of the limit: the smallest of them.
    pub worst_over_min_pct: f64,
    /// The median of the runs' worst windows (the mean of the middle two for an even count).
    pub worst_over_median_pct: f64,
    /// The largest of the runs' worst windows.
    pub worst_over_max_pct: f64,
    /// The seed of the run with the largest worst window (the first such).
    pub worst_over_max_seed: u64,
    /// The 99th percentile window over the limit: the largest over the runs.
    pub p99_over_max_pct: f64,
    /// Busy windows (demand at least 1.2x the limit), all runs together.
    pub busy_windows_total: u64,
    /// Busy windows that admitted under 95% of the limit, all runs together.
    pub under_admitted_total: u64,
    /// Runs with at least one such window.
    pub runs_under_admitted: u64,
    /// The least a busy window admitted in any run, % of the limit (100 without busy windows).
    pub busy_least_pct: f64,
    /// False denials in % of the class's requests: the largest over the runs.
    pub false_denials_max_pct: f64,
}

/// A scenario's spread over a range of seeds, as `sluice simulate --seeds` writes it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct SeedsReport {
    /// The first and the last seed run.
    pub seeds: (u64, u64),
    /// Per policy and class, in the order they first appear over the runs.
    pub spreads: Vec<SeedSpread>,
}

/// Runs `scenario` once per seed in `seeds` (its own `seed` replaced) and gives the spread per
/// policy and class, in the order they first appear over the runs (a class with no traffic in
/// one run is still reported from the others).
pub fn over_seeds(scenario: &Scenario, seeds: RangeInclusive<u64>) -> SeedsReport {
    let range = (*seeds.start(), *seeds.end());
    let mut s = scenario.clone();
    let mut runs: Vec<(u64, Vec<(String, ClassReport)>)> = Vec::new();
    for seed in seeds {
        s.seed = seed;
        let classes = run(&s)
            .policies
            .into_iter()
            .flat_map(|p| {
                let policy = p.policy;
                p.classes.into_iter().map(move |c| (policy.clone(), c))
            })
            .collect();
        runs.push((seed, classes));
    }
    let mut names: Vec<(&str, &str)> = Vec::new();
    for (policy, class) in runs.iter().flat_map(|(_, cs)| cs) {
        let name = (policy.as_str(), class.class.as_str());
        if !names.contains(&name) {
            names.push(name);
        }
    }
    let spreads = names
        .into_iter()
        .map(|(policy, class)| {
            let same: Vec<(u64, &ClassReport)> = runs
                .iter()
                .filter_map(|(seed, cs)| {
                    cs.iter()
                        .find(|(p, c)| p == policy && c.class == class)
                        .map(|(_, c)| (*seed, c))
                })
                .collect();
            spread(policy, class, &same)
        })
        .collect();
    SeedsReport {
        seeds: range,
        spreads,
    }
}

fn spread(policy: &str, class: &str, runs: &[(u64, &ClassReport)]) -> SeedSpread {
    let mut over: Vec<f64> = runs.iter().map(|(_, c)| c.over_max_pct).collect();
    over.sort_by(f64::total_cmp);
    let median = match over.len() {
        0 => 0.0,
        n if n % 2 == 1 => over[n / 2],
        n => (over[n / 2 - 1] + over[n / 2]) / 2.0,
    };
    let max = over.last().copied().unwrap_or(0.0);
    let max_seed = runs
        .iter()
        .find(|(_, c)| c.over_max_pct == max)
        .map_or(0, |(seed, _)| *seed);
    let largest = |f: fn(&ClassReport) -> f64| runs.iter().map(|(_, c)| f(c)).fold(0.0, f64::max);
    let busy_least = runs
        .iter()
        .map(|(_, c)| c.busy_min_pct)
        .fold(f64::INFINITY, f64::min);
    SeedSpread {
        policy: policy.to_owned(),
        class: class.to_owned(),
        runs: runs.len() as u64,
        worst_over_min_pct: over.first().copied().unwrap_or(0.0),
        worst_over_median_pct: median,
        worst_over_max_pct: max,
        worst_over_max_seed: max_seed,
        p99_over_max_pct: largest(|c| c.over_p99_pct),
        busy_windows_total: runs.iter().map(|(_, c)| c.busy_windows).sum(),
        under_admitted_total: runs.iter().map(|(_, c)| c.under_admitted).sum(),
        runs_under_admitted: runs.iter().filter(|(_, c)| c.under_admitted > 0).count() as u64,
        busy_least_pct: if busy_least.is_finite() {
            busy_least
        } else {
            100.0
        },
        false_denials_max_pct: largest(|c| c.false_denial_pct),
    }
}

/// The spread as a Markdown table.
pub fn markdown(report: &SeedsReport) -> String {
    let mut out = String::from(
        "| policy | class | runs | worst window over: min / median / max (seed) | p99 over: max | busy windows under 95% | runs with a busy window under 95% | least busy window | false denials: max |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for s in &report.spreads {
        out.push_str(&format!(
            "| {} | {} | {} | {:.1} / {:.1} / {:.1}% ({}) | {:.1}% | {} of {} | {} | {:.1}% | {:.2}% |\n",
            s.policy,
            s.class,
            s.runs,
            s.worst_over_min_pct,
            s.worst_over_median_pct,
            s.worst_over_max_pct,
            s.worst_over_max_seed,
            s.p99_over_max_pct,
            s.under_admitted_total,
            s.busy_windows_total,
            s.runs_under_admitted,
            s.busy_least_pct,
            s.false_denials_max_pct,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each seed's `over_max_pct` of `class` under the first policy, where it had traffic.
    fn per_run(s: &Scenario, seeds: RangeInclusive<u64>, class: &str) -> Vec<(u64, f64)> {
        seeds
            .filter_map(|seed| {
                let mut one = s.clone();
                one.seed = seed;
                let r = run(&one);
                let c = r.policies[0].classes.iter().find(|c| c.class == class)?;
                Some((seed, c.over_max_pct))
            })
            .collect()
    }

    #[test]
    fn the_spread_is_taken_over_every_seed() {
        let s = Scenario::parse(
            "s.yaml",
            "duration_s: 120\nseed: 1\nrule: { limit: 50, window_s: 30 }\nnodes: { count: 3 }\ntraffic:\n  - steady: { rate: 4, prefix: busy }\n  - steady: { rate: 0.5, keys: 3, prefix: calm }\npolicies: [reactive, exact]\n",
        )
        .unwrap();
        let report = over_seeds(&s, 1..=4);
        assert_eq!(report.seeds, (1, 4));
        let classes: Vec<(&str, &str)> = report
            .spreads
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
        let worst = per_run(&s, 1..=4, "busy");
        let busy = &report.spreads[0];
        assert_eq!(busy.runs, 4);
        let mut sorted: Vec<f64> = worst.iter().map(|w| w.1).collect();
        sorted.sort_by(f64::total_cmp);
        assert_eq!(busy.worst_over_min_pct, sorted[0]);
        assert_eq!(busy.worst_over_median_pct, (sorted[1] + sorted[2]) / 2.0);
        assert_eq!(busy.worst_over_max_pct, sorted[3]);
        let seed = worst.iter().find(|w| w.1 == sorted[3]).unwrap().0;
        assert_eq!(busy.worst_over_max_seed, seed);
        assert!(sorted[3] > 0.0, "reactive over-admits at 2.4x the limit");
        assert!(busy.busy_windows_total > 0, "4/s on 50 per 30 s is busy");
        assert_eq!(report.spreads[2].worst_over_max_pct, 0.0, "exact");
        let table = markdown(&report);
        assert_eq!(table.lines().count(), 2 + 4);
        assert!(
            table.contains("| exact | calm | 4 | 0.0 / 0.0 / 0.0%"),
            "{table}"
        );
    }

    #[test]
    fn a_class_without_traffic_in_the_first_run_is_reported_from_the_others() {
        // About one request in two minutes: some seeds draw none.
        let s = Scenario::parse(
            "s.yaml",
            "duration_s: 120\nseed: 1\nrule: { limit: 50, window_s: 30 }\nnodes: { count: 2 }\ntraffic:\n  - steady: { rate: 2, prefix: busy }\n  - steady: { rate: 0.008, prefix: rare }\npolicies: [predictive]\n",
        )
        .unwrap();
        let with = per_run(&s, 1..=12, "rare");
        let first = (1..=12)
            .find(|seed| !with.iter().any(|w| w.0 == *seed))
            .expect("a seed without the rare class");
        assert!(
            with.iter().any(|w| w.0 > first),
            "a later seed with it: {with:?}"
        );
        let report = over_seeds(&s, first..=12);
        let rare = report.spreads.iter().find(|c| c.class == "rare");
        let expected = with.iter().filter(|w| w.0 >= first).count() as u64;
        assert_eq!(rare.map(|c| c.runs), Some(expected));
    }
}
