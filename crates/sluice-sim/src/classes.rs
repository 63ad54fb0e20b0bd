//! Accuracy per class of user: a mix of traffic shapes on one fleet is judged class by class
//! (a heavy user, a bursty one, users far under their limit...), since one class's figures
//! hide another's. A key's class is its name without the trailing `-<n>` the generators give
//! it (`heavy-0` and `heavy-1` are both `heavy`), so a scenario names its classes with each
//! generator's `prefix`.
//!
//! The same tally serves the simulator and real processes replaying the same requests
//! (`examples/fleet_vs_sim.rs`), so the two are compared figure by figure.

use std::collections::BTreeMap;

use serde::Serialize;

/// A key's requests in one window, in cost units.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowCount {
    /// Asked for (admitted or not).
    pub offered: u64,
    /// Admitted.
    pub admitted: u64,
}

/// A window is busy when its demand is at least this many times the limit: a policy should
/// then admit (nearly) the whole limit.
pub const BUSY_DEMAND: f64 = 1.2;
/// A busy window is under-admitted below this share of the limit.
pub const UNDER_ADMITTED: f64 = 0.95;

/// One class's figures.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct ClassReport {
    /// The class: the keys' common prefix.
    pub class: String,
    /// Its keys.
    pub keys: u64,
    /// Key-windows with traffic.
    pub windows: u64,
    /// Requests (cost units) offered.
    pub offered: u64,
    /// Requests (cost units) admitted.
    pub admitted: u64,
    /// Over-admission per key-window in % of the limit: the largest.
    pub over_max_pct: f64,
    /// Over-admission per key-window: the 99th percentile.
    pub over_p99_pct: f64,
    /// Key-windows whose demand was at least [`BUSY_DEMAND`] times the limit.
    pub busy_windows: u64,
    /// Busy windows that admitted under [`UNDER_ADMITTED`] of the limit.
    pub under_admitted: u64,
    /// The least any busy window admitted, % of the limit (100 without busy windows).
    pub busy_min_pct: f64,
    /// Denials in key-windows whose demand never exceeded the limit: nothing had to be refused.
    pub false_denials: u64,
    /// False denials in % of the class's requests.
    pub false_denial_pct: f64,
}

/// A key's class: its name without a trailing `-<digits>`.
pub fn class_of(key: &str) -> &str {
    match key.rsplit_once('-') {
        Some((class, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => class,
        _ => key,
    }
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// The figures of each class, in name order, from every key-window's counts (`key`, its
/// counts) under a limit of `limit` per window.
pub fn by_class<'a>(
    windows: impl IntoIterator<Item = (&'a str, WindowCount)>,
    limit: u64,
) -> Vec<ClassReport> {
    #[derive(Default)]
    struct Acc<'a> {
        report: ClassReport,
        keys: std::collections::BTreeSet<&'a str>,
        over: Vec<f64>,
    }
    let limit = limit.max(1);
    let mut classes: BTreeMap<&str, Acc<'_>> = BTreeMap::new();
    for (key, c) in windows {
        if c.offered == 0 {
            continue;
        }
        let acc = classes.entry(class_of(key)).or_default();
        acc.keys.insert(key);
        let r = &mut acc.report;
        r.windows += 1;
        r.offered += c.offered;
        r.admitted += c.admitted;
        acc.over
            .push(c.admitted.saturating_sub(limit) as f64 * 100.0 / limit as f64);
        if c.offered as f64 >= BUSY_DEMAND * limit as f64 {
            r.busy_windows += 1;
            let pct = c.admitted as f64 * 100.0 / limit as f64;
            if r.busy_windows == 1 || pct < r.busy_min_pct {
                r.busy_min_pct = pct;
            }
            if (c.admitted as f64) < UNDER_ADMITTED * limit as f64 {
                r.under_admitted += 1;
            }
        }
        if c.offered <= limit {
            r.false_denials += c.offered - c.admitted.min(c.offered);
        }
    }
    classes
        .into_iter()
        .map(|(class, mut acc)| {
            acc.over.sort_by(f64::total_cmp);
            let mut r = acc.report;
            r.class = class.to_owned();
            r.keys = acc.keys.len() as u64;
            r.over_max_pct = acc.over.last().copied().unwrap_or(0.0);
            r.over_p99_pct = percentile(&acc.over, 0.99);
            if r.busy_windows == 0 {
                r.busy_min_pct = 100.0;
            }
            r.false_denial_pct = if r.offered == 0 {
                0.0
            } else {
                r.false_denials as f64 * 100.0 / r.offered as f64
            };
            r
        })
        .collect()
}

/// The classes as a Markdown table.
pub fn markdown(classes: &[ClassReport]) -> String {
    let mut out = String::from(
        "| class | keys | requests | admitted | worst window over | p99 over | busy windows | under-admitted | least admitted (busy) | false denials |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for c in classes {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {:.1}% | {:.1}% | {} | {} | {:.0}% | {} ({:.2}%) |\n",
            c.class,
            c.keys,
            c.offered,
            c.admitted,
            c.over_max_pct,
            c.over_p99_pct,
            c.busy_windows,
            c.under_admitted,
            c.busy_min_pct,
            c.false_denials,
            c.false_denial_pct
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_class_is_the_name_without_its_number() {
        assert_eq!(class_of("heavy-0"), "heavy");
        assert_eq!(class_of("key-12"), "key");
        assert_eq!(class_of("a-b-3"), "a-b");
        assert_eq!(class_of("alice"), "alice");
        assert_eq!(class_of("x-"), "x-");
        assert_eq!(class_of("x-1a"), "x-1a");
    }

    #[test]
    fn figures_per_class() {
        let count = |offered, admitted| WindowCount { offered, admitted };
        let windows = [
            ("heavy-0", count(300, 110)),
            ("heavy-0", count(300, 95)),
            ("calm-0", count(50, 48)),
            ("calm-1", count(60, 60)),
            ("burst-0", count(130, 80)),
        ];
        let r = by_class(windows, 100);
        let names: Vec<&str> = r.iter().map(|c| c.class.as_str()).collect();
        assert_eq!(names, ["burst", "calm", "heavy"]);
        let (burst, calm, heavy) = (&r[0], &r[1], &r[2]);
        assert_eq!((heavy.keys, heavy.windows), (1, 2));
        assert_eq!(heavy.over_max_pct, 10.0);
        assert_eq!((heavy.busy_windows, heavy.under_admitted), (2, 0));
        assert_eq!(heavy.busy_min_pct, 95.0);
        assert_eq!((calm.keys, calm.false_denials), (2, 2));
        assert!((calm.false_denial_pct - 2.0 / 110.0 * 100.0).abs() < 1e-9);
        assert_eq!(calm.busy_min_pct, 100.0);
        assert_eq!((burst.busy_windows, burst.under_admitted), (1, 1));
        assert_eq!(burst.false_denials, 0, "its demand was over the limit");
        assert!(markdown(&r).contains("| heavy | 1 | 600 | 205 | 10.0% |"));
    }
}
