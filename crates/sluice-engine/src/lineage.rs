//! What a reload did to each rule's counters, and the reload's summary in words.

use std::fmt;

/// What a reload did to a rule's counters (see `rule::carry`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lineage {
    /// A rule the running config did not have.
    New,
    /// Its settings did not change: the same limiter, every count kept.
    Kept,
    /// Its limit (or burst, cooldown, spans, policy) changed: each key keeps what it used in
    /// its current window, in this instance's memory or (synced, exact) in the store.
    Carried,
    /// Its window, algorithm or mode changed: every key starts over (why).
    StartedOver(&'static str),
}

/// What a reload did to the rules, for its answer and log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReloadSummary {
    /// Domains loaded.
    pub domains: usize,
    /// Rules the running config did not have.
    pub new: usize,
    /// Rules unchanged: every count kept.
    pub kept: usize,
    /// Rules with a new limit (or burst, cooldown, ...): `domain/id`, each key keeping what
    /// it used.
    pub carried: Vec<String>,
    /// Rules whose window, algorithm or mode changed: `domain/id` and why; their keys start
    /// over.
    pub started_over: Vec<(String, &'static str)>,
}

/// `n` and the noun, singular for one.
pub(crate) fn count(n: usize, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

impl fmt::Display for ReloadSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "reloaded {}", count(self.domains, "domain", "domains"))?;
        let mut parts = Vec::new();
        if self.kept > 0 {
            parts.push(format!(
                "{} unchanged, counts kept",
                count(self.kept, "rule", "rules")
            ));
        }
        if !self.carried.is_empty() {
            parts.push(format!(
                "{} with new settings, each key keeping what it used ({})",
                count(self.carried.len(), "rule", "rules"),
                self.carried.join(", ")
            ));
        }
        if !self.started_over.is_empty() {
            let named: Vec<String> = self
                .started_over
                .iter()
                .map(|(rule, why)| format!("{rule}: {why}"))
                .collect();
            parts.push(format!(
                "{} started over ({})",
                count(self.started_over.len(), "rule", "rules"),
                named.join(", ")
            ));
        }
        if self.new > 0 {
            parts.push(count(self.new, "new rule", "new rules"));
        }
        if !parts.is_empty() {
            write!(f, ": {}", parts.join("; "))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_names_what_started_over_and_counts_in_words() {
        let summary = ReloadSummary {
            domains: 1,
            new: 0,
            kept: 1,
            carried: vec!["edge/user".into()],
            started_over: vec![("edge/ip".into(), "window changed")],
        };
        assert_eq!(
            summary.to_string(),
            "reloaded 1 domain: 1 rule unchanged, counts kept; 1 rule with new settings, each key keeping what it used (edge/user); 1 rule started over (edge/ip: window changed)"
        );
        let two = ReloadSummary {
            domains: 2,
            kept: 3,
            ..ReloadSummary::default()
        };
        assert_eq!(
            two.to_string(),
            "reloaded 2 domains: 3 rules unchanged, counts kept"
        );
    }
}
