//! The rule table: every domain's rules, each with its limiter, built from a validated
//! [`RuleSet`] (keeping the limiters of unchanged rules across a reload).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use metrics::counter;
use sluice_config::RuleSettings;
use sluice_config::{AlgorithmKind, Domain, Limit, Mode, Policy, ResolvedLimit, Rule, RuleSet};
use sluice_core::Clock;

use crate::EngineOptions;
use crate::exact::decisions::ExactRule;
use crate::lineage::Lineage;
use crate::local::limiter::LocalLimiter;
use crate::rule::{RuleEngine, RuleKind, runs_as};
use crate::synced::{SyncedParams, SyncedRule};

/// One domain: its matcher and its rules, in the domain's rule order.
pub(crate) struct DomainTable {
    pub domain: Domain,
    pub rules: Vec<RuleEngine>,
}

/// Every domain's rules.
pub(crate) struct RuleTable {
    domains: HashMap<String, DomainTable, foldhash::fast::RandomState>,
    /// The shortest span among synced rules; zero when there are none.
    min_span_ns: u64,
    has_exact: bool,
}

impl RuleTable {
    /// Builds the table; rules of `previous` whose id and resolved settings are unchanged
    /// keep their limiter (and so their counters).
    pub(crate) fn build(
        rules: &RuleSet,
        defaults: &RuleSettings,
        clock: &Arc<dyn Clock>,
        options: &EngineOptions,
        previous: Option<&RuleTable>,
    ) -> Self {
        let mut domains = HashMap::default();
        let now = clock.now();
        for domain in rules.domains() {
            let engines = domain
                .rules()
                .iter()
                .map(|rule| {
                    let settings = match &rule.limit {
                        Limit::Unlimited | Limit::Blocked(_) => None,
                        Limit::Limited(spec) => Some(spec.resolve(defaults)),
                    };
                    let before = previous.and_then(|p| p.rules().find(|r| *r.id == *rule.id));
                    rule_engine(domain, rule, settings, before, clock, (options, now))
                })
                .collect();
            let table = DomainTable {
                domain: domain.clone(),
                rules: engines,
            };
            domains.insert(domain.name().to_owned(), table);
        }
        let mut table = Self {
            domains,
            min_span_ns: 0,
            has_exact: false,
        };
        let synced = table.rules().filter_map(|r| match &*r.kind {
            RuleKind::Synced(s) => Some(s.params.span_ns),
            _ => None,
        });
        let min_span_ns = synced.min().unwrap_or(0);
        table.min_span_ns = min_span_ns;
        let has_exact = table.rules().any(|r| matches!(*r.kind, RuleKind::Exact(_)));
        table.has_exact = has_exact;
        table
    }

    pub(crate) fn rules(&self) -> impl Iterator<Item = &RuleEngine> {
        self.domains.values().flat_map(|t| t.rules.iter())
    }

    /// Every domain, by name.
    pub(crate) fn domains_sorted(&self) -> Vec<(&str, &DomainTable)> {
        let mut domains: Vec<(&str, &DomainTable)> =
            self.domains.iter().map(|(n, t)| (n.as_str(), t)).collect();
        domains.sort_unstable_by_key(|(n, _)| *n);
        domains
    }

    pub(crate) fn domain(&self, name: &str) -> Option<&DomainTable> {
        self.domains.get(name)
    }

    /// The shortest span among synced rules; zero when there are none.
    pub(crate) fn min_span_ns(&self) -> u64 {
        self.min_span_ns
    }

    pub(crate) fn has_synced(&self) -> bool {
        self.min_span_ns > 0
    }

    /// Whether the instance announces itself to the store (its fleet's size matters): a
    /// synced rule shares its limit among the fleet, and an exact rule's room is the fleet's,
    /// which RLQS assignments divide among the instances.
    pub(crate) fn announces(&self) -> bool {
        self.has_synced() || self.has_exact
    }

    /// Whether a rule asks the store for decisions with the fleet and store as `store` says:
    /// an exact rule, or a synced one whose limit is too small to share.
    pub(crate) fn decides_at_store(&self, store: crate::health::StoreView) -> bool {
        self.has_exact
            || self.rules().any(|r| match &*r.kind {
                RuleKind::Synced(s) => s.decides_at_store(store),
                _ => false,
            })
    }
}

/// [`runs_as`], saying so when a synced rule's algorithm makes it run locally.
fn effective_mode(rule: &Rule, r: &ResolvedLimit, options: &EngineOptions) -> Mode {
    let mode = runs_as(r, options);
    if r.mode == Mode::Synced && mode == Mode::Local && options.shared_store {
        tracing::warn!(rule = %rule.id, algorithm = r.algorithm.name(), "synced mode counts windows; this algorithm runs locally on each instance");
    }
    mode
}

/// A rule's limiter and its policy's name.
fn limiter(
    rule: &Rule,
    r: &ResolvedLimit,
    clock: &Arc<dyn Clock>,
    options: &EngineOptions,
) -> (RuleKind, &'static str) {
    match effective_mode(rule, r, options) {
        Mode::Synced => {
            let params = SyncedParams {
                limit: r.rate.limit(),
                window_ns: r.rate.window_ns(),
                spans: u64::from(r.spans),
                span_ns: (r.rate.window_ns() / u64::from(r.spans)).max(1),
                cooldown_ns: sluice_core::duration_to_nanos(r.cooldown),
                policy: r.policy,
                sliding: r.algorithm == AlgorithmKind::SlidingWindow,
                expected_instances: options.expected_instances.max(1),
            };
            let policy = match r.policy {
                Policy::Reactive => "reactive",
                _ => "predictive",
            };
            let id: Arc<str> = rule.id.as_str().into();
            let small = (r.small_limits, options.exact_calls.small_limit_calls);
            let rule = SyncedRule::new(params, id, small);
            (RuleKind::Synced(rule), policy)
        }
        Mode::Exact => {
            let exact = ExactRule::new(r, options.expected_instances, clock.clone());
            (RuleKind::Exact(exact), "exact")
        }
        _ => {
            let local = LocalLimiter::new(r, r.rate, clock.clone());
            (RuleKind::Local(local), "local")
        }
    }
}

fn rule_engine(
    domain: &Domain,
    rule: &Rule,
    settings: Option<ResolvedLimit>,
    before: Option<&RuleEngine>,
    clock: &Arc<dyn Clock>,
    (options, now): (&EngineOptions, sluice_core::Nanos),
) -> RuleEngine {
    // A rule whose settings did not change keeps its limiter (and counters); a new or changed
    // one builds its own.
    let kept = before
        .filter(|r| r.settings == settings)
        .map(|r| (Arc::clone(&r.kind), r.policy));
    let is_kept = kept.is_some();
    let (kind, policy) = match (kept, &settings) {
        (Some(kept), _) => kept,
        (None, None) => match rule.limit {
            sluice_config::Limit::Blocked(_) => (Arc::new(RuleKind::Blocked), "blocked"),
            _ => (Arc::new(RuleKind::Unlimited), "unlimited"),
        },
        (None, Some(r)) => {
            let (kind, policy) = limiter(rule, r, clock, options);
            (Arc::new(kind), policy)
        }
    };
    let lineage = match before {
        None => Lineage::New,
        Some(_) if is_kept => Lineage::Kept,
        Some(before) => crate::rule::carry(before, (&kind, settings.as_ref()), options, now),
    };
    if settings.is_some() {
        // Every series the dashboard and the alerts query exists from the start, at 0 (a
        // reload keeps their values: nothing is reset here).
        let rule_id = rule.id.clone();
        counter!("sluice_overflow_checks_total", "rule" => rule_id.clone()).increment(0);
        metrics::gauge!("sluice_tracked_keys", "rule" => rule_id).increment(0.0);
    }
    let allowed = counter!("sluice_decisions_total", "domain" => domain.name().to_owned(), "rule" => rule.id.clone(), "outcome" => "allowed", "reason" => "");
    RuleEngine {
        id: rule.id.as_str().into(),
        name: rule.name.as_deref().map(Arc::from),
        shadow: rule.shadow_mode,
        limit: match rule.limit {
            sluice_config::Limit::Blocked(window) => Some((0, window)),
            _ => settings.as_ref().map(|r| (r.rate.limit(), r.rate.window())),
        },
        capacity: match rule.limit {
            sluice_config::Limit::Blocked(_) => 0,
            _ => settings
                .as_ref()
                .map_or(u64::MAX, crate::local::limiter::capacity_of),
        },
        policy,
        kind,
        settings,
        overflow: std::sync::OnceLock::new(),
        flushed_span: AtomicU64::new(0),
        allowed,
        // The status page's figures belong to the rule, not to its limiter: kept by every
        // reload that keeps the rule's id.
        stats: before.map_or_else(Default::default, |r| Arc::clone(&r.stats)),
        detailed: rule.detailed_metric.then(|| {
            before.and_then(|r| r.detailed.clone()).unwrap_or_else(|| {
                Arc::new(crate::observe::detailed::DetailedStats::new(
                    domain.name(),
                    &rule.id,
                ))
            })
        }),
        lineage,
        shared: rule
            .shared_values
            .iter()
            .map(|(depth, pattern)| (*depth, pattern.as_str().into()))
            .collect(),
        quota: rule.quota_mode,
        metadata: rule.metadata.clone().map(Arc::new),
    }
}
