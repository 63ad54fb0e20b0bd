//! [`Engine::status`]: what the status page and `sluice status` show of one instance: per rule
//! its mode, limit, decisions and heaviest keys (each with how much of its limit is used now
//! and whether it is blocked); the store's health, the flushes, the clock offset and the
//! fleet. Bounded whatever the traffic: at most [`crate::HEAVY_SLOTS`] keys per rule.

use sluice_core::Decision;

use crate::engine::Engine;
use crate::flusher::FlushSummary;
use crate::observe::heavy::{DecisionCounts, display_key};
use crate::rule::{RuleEngine, RuleKind};

/// One instance's state.
#[derive(Clone, Debug, serde::Serialize)]
pub struct EngineStatus {
    /// This instance's id on the store.
    pub node: String,
    /// The store as this instance finds it.
    pub store: StoreStatus,
    /// Every rule, by domain and then in file order.
    pub rules: Vec<RuleReport>,
}

/// The store as one instance finds it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct StoreStatus {
    /// `answering` or `unreachable` (the last flush or probe).
    pub health: &'static str,
    /// Whether it ever answered.
    pub reached: bool,
    /// The store's clock minus this instance's, in milliseconds.
    pub clock_offset_ms: f64,
    /// Instances live on the store, this one included (0: not known).
    pub fleet_instances: u64,
    /// Counts of an earlier run's spill not delivered yet.
    pub replay_pending: u64,
    /// The exact-mode circuit breaker: `closed`, `open`, `half_open`.
    pub exact_breaker: &'static str,
    /// The flushes.
    pub flushes: FlushSummary,
}

/// One rule.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RuleReport {
    /// The domain it belongs to.
    pub domain: String,
    /// The rule's id (its descriptor path).
    pub id: String,
    /// Its `name`, when the rule file gives one.
    pub name: Option<String>,
    /// `local`, `synced`, `exact` or `unlimited`.
    pub mode: &'static str,
    /// `predictive`, `reactive`, `exact`, `local` or `unlimited`.
    pub policy: &'static str,
    /// Why the rule runs otherwise than its file says, or decides in another way than its
    /// mode's usual one (a synced rule on the embedded store runs as local; a limit too small
    /// to share is decided at the store).
    pub note: Option<&'static str>,
    /// Requests per window (`None`: unlimited).
    pub limit: Option<u64>,
    /// The window, in seconds.
    pub window_s: Option<f64>,
    /// Shadow mode: denials are counted, never enforced.
    pub shadow: bool,
    /// Decisions since the rule first loaded in this process (reloads keep them).
    pub decisions: DecisionCounts,
    /// Keys the rule tracks on this instance.
    pub tracked_keys: usize,
    /// The heaviest keys of the last minutes, heaviest first.
    pub heavy_keys: Vec<KeyReport>,
}

/// One of a rule's heaviest keys.
#[derive(Clone, Debug, serde::Serialize)]
pub struct KeyReport {
    /// The descriptor values, `/` between them.
    pub key: String,
    /// Requests seen (halves each minute; counted one by one unless `estimated`).
    pub requests: u64,
    /// Of those, denied by this rule.
    pub denied: u64,
    /// How much of the limit the key has used now (synced: the estimate of the global count;
    /// local: this instance's algorithm); `None` where the rule cannot tell without a store
    /// call (exact mode).
    pub used: Option<u64>,
    /// Whether the key is denied now.
    pub blocked: bool,
    /// Whether `requests` and `denied` are estimates (a busy rule samples one request in
    /// [`crate::HEAVY_SAMPLE`]; a key that took over another's slot carries its count).
    pub estimated: bool,
}

impl Engine {
    /// See [`RuleReport::note`].
    fn note(&self, rule: &RuleEngine) -> Option<&'static str> {
        let written = rule.settings.as_ref().map(|r| r.mode);
        match &*rule.kind {
            RuleKind::Synced(s) if s.decides_at_store(self.link().view()) => {
                Some("a limit too small to share among the fleet: decided at the store")
            }
            RuleKind::Local(_) if written == Some(sluice_config::Mode::Synced) => {
                Some(if self.options.shared_store {
                    "synced mode syncs window counts: this algorithm runs on each instance alone"
                } else {
                    "synced on the embedded memory store: runs as local (nothing to share)"
                })
            }
            _ => None,
        }
    }

    /// This instance's state, with at most `top` heavy keys per rule.
    pub fn status(&self, top: usize) -> EngineStatus {
        let flusher = self.flusher();
        let store = StoreStatus {
            health: if self.store_ok() {
                "answering"
            } else {
                "unreachable"
            },
            reached: self.store_reached(),
            clock_offset_ms: self.clock_offset_ns() as f64 / 1e6,
            fleet_instances: self.fleet_size(),
            replay_pending: self.replay_pending(),
            exact_breaker: self.exact_breaker().as_str(),
            flushes: flusher.flush_summary(),
        };
        let mut rules = Vec::new();
        for (domain, table) in self.table().domains_sorted() {
            for rule in &table.rules {
                rules.push(self.rule_report(domain, rule, top));
            }
        }
        EngineStatus {
            node: self.node_id().to_owned(),
            store,
            rules,
        }
    }

    fn rule_report(&self, domain: &str, rule: &RuleEngine, top: usize) -> RuleReport {
        let now = self.now();
        let (mode, tracked) = match &*rule.kind {
            RuleKind::Unlimited => ("unlimited", 0),
            RuleKind::Blocked => ("blocked", 0),
            RuleKind::Local(l) => ("local", l.len()),
            RuleKind::Synced(s) => ("synced", s.keys.len()),
            RuleKind::Exact(e) => ("exact", e.len()),
        };
        let limit = rule.limit.map(|(n, _)| n);
        let heavy_keys =
            rule.stats
                .heaviest(top)
                .into_iter()
                .map(|slot| {
                    let (used, blocked) = match &*rule.kind {
                        RuleKind::Local(l) => match l.peek(&slot.key, now) {
                            // A cost-0 look: nothing left means the next request is denied.
                            Some(Decision::Allowed(a)) => (
                                Some(rule.capacity.saturating_sub(a.remaining)),
                                a.remaining == 0,
                            ),
                            Some(_) => (Some(rule.capacity), true),
                            None => (Some(0), false),
                        },
                        RuleKind::Synced(s) if s.store_blocked(&slot.key, now) => (None, true),
                        RuleKind::Synced(s) => s
                            .key_info(&slot.key, now, self.link().view())
                            .map_or((Some(0), false), |info| {
                                let used = info.estimate.max(0.0).round() as u64;
                                let blocked =
                                    info.blocked_until > now || limit.is_some_and(|l| used >= l);
                                (Some(used), blocked)
                            }),
                        RuleKind::Exact(e) => (None, e.is_blocked(&slot.key, now)),
                        RuleKind::Unlimited => (None, false),
                        RuleKind::Blocked => (Some(0), true),
                    };
                    KeyReport {
                        key: display_key(&slot.key),
                        requests: slot.requests,
                        denied: slot.denied,
                        used,
                        blocked,
                        estimated: slot.estimated,
                    }
                })
                .collect();
        RuleReport {
            domain: domain.to_owned(),
            id: rule.id.to_string(),
            name: rule.name.as_deref().map(str::to_owned),
            mode,
            policy: rule.policy,
            note: self.note(rule),
            limit,
            window_s: rule.limit.map(|(_, w)| w.as_secs_f64()),
            shadow: rule.shadow,
            decisions: rule.stats.counts(),
            tracked_keys: tracked,
            heavy_keys,
        }
    }
}
