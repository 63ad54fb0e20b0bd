//! Per-value decision counts for rules with `detailed_metric: true` (Envoy ratelimit's flag):
//! `sluice_detailed_decisions_total{domain, rule, value, outcome}`, one series per descriptor
//! value, bounded: the first [`DETAILED_VALUES`] values a rule sees get their own series, the
//! rest share `value="_other"`, and a value is cut to [`DETAILED_VALUE_BYTES`] bytes. A key
//! spray cannot grow the metrics.

use std::collections::HashMap;
use std::sync::Arc;

use ecow::EcoString;
use parking_lot::Mutex;

use crate::observe::heavy::display_key;

/// Values of one rule with series of their own.
pub const DETAILED_VALUES: usize = 100;
/// The longest value label, in bytes (cut at a character boundary).
pub const DETAILED_VALUE_BYTES: usize = 128;

/// The label of every value past the first [`DETAILED_VALUES`].
const OTHER: &str = "_other";

struct Series {
    allowed: metrics::Counter,
    denied: metrics::Counter,
    shadow_denied: metrics::Counter,
}

/// A rule's per-value counters.
pub(crate) struct DetailedStats {
    domain: Arc<str>,
    rule: Arc<str>,
    values: Mutex<HashMap<EcoString, Arc<Series>>>,
    other: Arc<Series>,
}

fn label(value: &str) -> String {
    let shown = display_key(value);
    if shown.len() <= DETAILED_VALUE_BYTES {
        return shown;
    }
    let mut end = DETAILED_VALUE_BYTES;
    while !shown.is_char_boundary(end) {
        end -= 1;
    }
    shown[..end].to_owned()
}

impl DetailedStats {
    pub(crate) fn new(domain: &str, rule: &str) -> Self {
        let (domain, rule): (Arc<str>, Arc<str>) = (domain.into(), rule.into());
        let other = Arc::new(Self::series(&domain, &rule, OTHER.to_owned()));
        Self {
            domain,
            rule,
            values: Mutex::new(HashMap::new()),
            other,
        }
    }

    fn series(domain: &Arc<str>, rule: &Arc<str>, value: String) -> Series {
        let counter = |outcome: &'static str| {
            metrics::counter!(
                "sluice_detailed_decisions_total",
                "domain" => domain.to_string(),
                "rule" => rule.to_string(),
                "value" => value.clone(),
                "outcome" => outcome
            )
        };
        Series {
            allowed: counter("allowed"),
            denied: counter("denied"),
            shadow_denied: counter("shadow_denied"),
        }
    }

    /// Counts one decision for `key` (the rule's descriptor values).
    pub(crate) fn count(&self, key: &str, denied: bool, shadow: bool) {
        let series = {
            let mut values = self.values.lock();
            match values.get(key) {
                Some(s) => s.clone(),
                None if values.len() < DETAILED_VALUES => {
                    let s = Arc::new(Self::series(&self.domain, &self.rule, label(key)));
                    values.insert(key.into(), s.clone());
                    s
                }
                None => self.other.clone(),
            }
        };
        let counter = match (denied, shadow) {
            (false, _) => &series.allowed,
            (true, true) => &series.shadow_denied,
            (true, false) => &series.denied,
        };
        counter.increment(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_util::debugging::DebuggingRecorder;

    #[test]
    fn a_spray_of_values_stays_within_the_bound() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            let stats = DetailedStats::new("edge", "edge/user");
            stats.count(&format!("300:{}", "é".repeat(150)), false, false);
            for i in 0..1000 {
                stats.count(
                    &format!("{}:u{i}", format!("u{i}").len()),
                    i % 2 == 0,
                    false,
                );
            }
        });
        let snapshot = snapshotter.snapshot().into_vec();
        let values: std::collections::BTreeSet<String> = snapshot
            .iter()
            .filter_map(|(key, ..)| {
                key.key()
                    .labels()
                    .find(|l| l.key() == "value")
                    .map(|l| l.value().to_owned())
            })
            .collect();
        assert_eq!(values.len(), DETAILED_VALUES + 1, "100 values and _other");
        assert!(values.contains("u0") && values.contains(OTHER));
        assert!(values.iter().all(|v| v.len() <= DETAILED_VALUE_BYTES));
        assert!(
            values.contains(&"é".repeat(64)),
            "cut at a character boundary"
        );
    }
}
