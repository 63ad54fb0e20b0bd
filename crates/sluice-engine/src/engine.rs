//! The engine: the rule table and the check path. The store side is the [`StoreLink`]'s
//! (the store's clock, health, the fleet, exact mode's breaker), which the check path and the
//! [`Flusher`] (flushes, receipts, spill and replay) share.

use std::sync::Arc;
use std::time::Duration;

use metrics::counter;
use sluice_config::{RuleSet, RuleSettings};
use sluice_core::{Clock, Decision, MAX_COST, Nanos};
use sluice_store::CounterStore;
use smallvec::SmallVec;

use crate::EngineOptions;
use crate::descriptor_key::with_key;
use crate::exact::breaker::BreakerState;
use crate::flusher::{Due, FlushReport, Flusher, Retired, Spill, StateDir};
use crate::link::StoreLink;
use crate::rule::{RuleEngine, RuleKind};
use crate::table::RuleTable;
use crate::verdict::{KeyInfo, Outcome, Reason, RuleStatus, Verdict};

/// Why the engine could not decide.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// No rule file defines this domain.
    #[error("unknown domain `{0}`")]
    UnknownDomain(String),
    /// `exact` rules count in the store with a script per request; they take no refills.
    #[error("rule `{0}` is in exact mode, which does not take refills")]
    RefillUnsupported(String),
    /// A cost (or refill amount) above [`sluice_core::MAX_COST`]: refused before any rule
    /// is counted, so no sum of costs can overflow a counter.
    #[error("descriptors[{descriptor}] costs {cost}; at most {max} is allowed", max = sluice_core::MAX_COST)]
    CostTooLarge {
        /// The descriptor's index in the request.
        descriptor: usize,
        /// The cost asked for.
        cost: u64,
    },
}

/// The rate-limit engine. Cheap to share (`Arc<Engine>`); every method takes `&self`.
pub struct Engine {
    clock: Arc<dyn Clock>,
    table: RuleTable,
    /// Shared with the engines reloads build from this one, as is the flusher.
    link: Arc<StoreLink>,
    flusher: Arc<Flusher>,
    pub(crate) options: EngineOptions,
}

fn default_node_id(clock: &dyn Clock) -> String {
    format!("{}-{:x}", std::process::id(), clock.now() & 0xffff_ffff)
}

impl Engine {
    /// Builds the engine for `rules`, with `defaults` for unset settings.
    pub fn new(
        rules: &RuleSet,
        defaults: &RuleSettings,
        store: Arc<dyn CounterStore>,
        clock: Arc<dyn Clock>,
        options: EngineOptions,
    ) -> Self {
        let node: Arc<str> = match &options.node_id {
            Some(id) => id.as_str().into(),
            None => default_node_id(&*clock).into(),
        };
        let options = EngineOptions {
            node_id: Some(node.to_string()),
            max_keys_per_rule: options.max_keys_per_rule.max(1),
            ..options
        };
        let link = Arc::new(StoreLink::new(
            store,
            clock.clone(),
            node,
            options.follow_store_clock,
            &options.exact_calls,
            options.exact_budget_timer,
        ));
        let flusher = Flusher::new(link.clone(), options.flush_chunk_items);
        Self {
            table: RuleTable::build(rules, defaults, &clock, &options, None),
            clock,
            link,
            flusher: Arc::new(flusher),
            options,
        }
    }

    /// An engine for new rules that keeps this one's store, clock, node id, clock offset and
    /// options (its store link and flusher), and the counters of every rule whose id and resolved settings
    /// did not change.
    pub fn reload(&self, rules: &RuleSet, defaults: &RuleSettings) -> Self {
        let table = RuleTable::build(
            rules,
            defaults,
            &self.clock,
            &self.options,
            Some(&self.table),
        );
        // Requests that took this engine before the swap may still count into the synced
        // rules the new table drops: the flusher keeps sweeping them until they are done.
        let dropped = self
            .table
            .rules()
            .filter(|old| !table.rules().any(|new| Arc::ptr_eq(&old.kind, &new.kind)));
        for rule in dropped {
            if let Some(retired) = Retired::new(rule.id.clone(), &rule.kind) {
                self.flusher.retire(retired);
            }
        }
        Self {
            clock: self.clock.clone(),
            table,
            link: self.link.clone(),
            flusher: self.flusher.clone(),
            options: self.options.clone(),
        }
    }

    /// What the reload that built this engine did to each rule's counters.
    pub fn reload_summary(&self) -> crate::ReloadSummary {
        let mut summary = crate::ReloadSummary {
            domains: self.table.domains_sorted().len(),
            ..Default::default()
        };
        for (_, domain) in self.table.domains_sorted() {
            for rule in &domain.rules {
                // Rule ids name their domain (`edge/user`).
                let id = || rule.id.to_string();
                match rule.lineage {
                    crate::Lineage::New => summary.new += 1,
                    crate::Lineage::Kept => summary.kept += 1,
                    crate::Lineage::Carried => summary.carried.push(id()),
                    crate::Lineage::StartedOver(why) => summary.started_over.push((id(), why)),
                }
            }
        }
        summary
    }

    /// Takes this instance off the store's list of live instances (at shutdown, after the
    /// final flush), so that the fleet's size drops at the others' next announcement.
    pub async fn leave_fleet(&self) {
        self.link.leave_fleet().await;
    }

    /// How many rules of `other` share their counters with this engine (kept by a reload).
    pub fn shared_rules(&self, other: &Engine) -> usize {
        self.table
            .rules()
            .filter(|r| other.table.rules().any(|o| Arc::ptr_eq(&r.kind, &o.kind)))
            .count()
    }

    /// This instance's node id.
    pub fn node_id(&self) -> &str {
        self.link.node()
    }

    /// The current time corrected by the offset to the store's clock.
    pub fn now(&self) -> Nanos {
        self.link.now()
    }

    /// Store time minus local time, as last measured (nanoseconds).
    pub fn clock_offset_ns(&self) -> i64 {
        self.link.offset_ns()
    }

    /// Whether the last flush (or probe) reached the store.
    pub fn store_ok(&self) -> bool {
        self.link.health().answering()
    }

    /// Where exact mode's circuit breaker is.
    pub fn exact_breaker(&self) -> BreakerState {
        self.link.breaker_state()
    }

    pub(crate) fn flusher(&self) -> &Flusher {
        &self.flusher
    }

    pub(crate) fn link(&self) -> &StoreLink {
        &self.link
    }

    pub(crate) fn table(&self) -> &RuleTable {
        &self.table
    }

    /// Whether the store has ever answered a flush or probe.
    pub fn store_reached(&self) -> bool {
        self.link.reached()
    }

    /// The shortest span among synced rules (`None` when there are none): how often to flush.
    pub fn flush_interval(&self) -> Option<Duration> {
        self.table
            .has_synced()
            .then(|| Duration::from_nanos(self.table.min_span_ns()))
    }

    /// Whether `domain` has rules.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.table.domain(domain).is_some()
    }

    /// Checks one request: every descriptor, every matched rule (minus those `replaces`
    /// removes). Rules are counted in order and counting stops at the first enforcing denial,
    /// so a denied request does not use up the quota of the rules after it; those rules are
    /// still reported (queried at cost 0). Local and synced rules never wait on I/O.
    pub async fn check<D, K, V>(
        &self,
        domain: &str,
        descriptors: &[D],
        cost: u64,
    ) -> Result<Verdict<'_>, EngineError>
    where
        D: AsRef<[(K, V)]>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        self.check_each(domain, descriptors, std::slice::from_ref(&cost))
            .await
    }

    /// Like [`Engine::check`] with a cost per descriptor (Envoy's per-descriptor
    /// `hits_addend`); descriptors beyond `costs` use its last value.
    ///
    /// A cost of 0 is a look: it counts nothing, and a rule with no room for one more request
    /// (over its limit, at it, or `requests_per_unit: 0`) answers it `Denied` with
    /// [`Reason::NoRoom`], so that no cost lets a key over its limit through.
    pub async fn check_each<D, K, V>(
        &self,
        domain: &str,
        descriptors: &[D],
        costs: &[u64],
    ) -> Result<Verdict<'_>, EngineError>
    where
        D: AsRef<[(K, V)]>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let cost_of = |i: usize| costs.get(i).or(costs.last()).copied().unwrap_or(1);
        if let Some(descriptor) = (0..descriptors.len()).find(|&i| cost_of(i) > MAX_COST) {
            let cost = cost_of(descriptor);
            return Err(EngineError::CostTooLarge { descriptor, cost });
        }
        let table = self
            .table
            .domain(domain)
            .ok_or_else(|| EngineError::UnknownDomain(domain.to_owned()))?;
        let timer = crate::observe::telemetry::DecisionTimer::start();
        let now = self.now();
        let mut verdict = Verdict {
            allowed: true,
            statuses: SmallVec::new(),
        };
        let (mut quota_rules, mut quota_over) = (0usize, 0usize);
        for m in table.domain.match_request(descriptors) {
            let rule = &table.rules[m.rule.index];
            let cost = if verdict.allowed || rule.shadow {
                cost_of(m.descriptor)
            } else {
                0
            };
            let entries = descriptors[m.descriptor].as_ref();
            let max_keys = self.options.max_keys_per_rule;
            let (decision, reason) = rule.check(&self.link, max_keys, entries, now, cost).await;
            let (decision, reason) = match cost_of(m.descriptor) {
                0 => look(rule, decision, reason),
                _ => (decision, reason),
            };
            let mut outcome = outcome_of(rule, &decision);
            if rule.quota && !rule.shadow {
                quota_rules += 1;
                if matches!(outcome, Outcome::Denied | Outcome::CostExceedsLimit) {
                    // Over a soft limit: decided once every quota-mode rule is seen.
                    outcome = Outcome::QuotaExceeded;
                    quota_over += 1;
                }
            }
            // A rule only queried (at cost 0, after an enforcing denial) did not decide.
            if verdict.allowed || rule.shadow {
                count_decision(domain, rule, outcome, reason);
            }
            if matches!(outcome, Outcome::Denied | Outcome::CostExceedsLimit) {
                verdict.allowed = false;
            }
            let status = (outcome, reason);
            verdict
                .statuses
                .push(status_of(m.descriptor, rule, status, &decision));
        }
        // Quota mode (Envoy's soft limits): over only when every quota-mode rule is over.
        if quota_rules > 0 && quota_over == quota_rules {
            verdict.allowed = false;
            for s in verdict.statuses.iter_mut() {
                if s.outcome == Outcome::QuotaExceeded {
                    s.outcome = Outcome::Denied;
                }
            }
        }
        timer.finish();
        Ok(verdict)
    }

    /// Gives back `amount` units that a client acquired but did not use, to every rule that
    /// matches the descriptor (never above a rule's capacity). Returns how many rules took it.
    pub fn refill<K: AsRef<str>, V: AsRef<str>>(
        &self,
        domain: &str,
        entries: &[(K, V)],
        amount: u64,
    ) -> Result<usize, EngineError> {
        if amount > MAX_COST {
            return Err(EngineError::CostTooLarge {
                descriptor: 0,
                cost: amount,
            });
        }
        let table = self
            .table
            .domain(domain)
            .ok_or_else(|| EngineError::UnknownDomain(domain.to_owned()))?;
        let now = self.now();
        let mut refilled = 0;
        for rule in table.domain.match_descriptor(entries) {
            let rule = &table.rules[rule.index];
            let took = with_key(rule.key_values(entries), |key| match &*rule.kind {
                RuleKind::Local(local) => Ok(local.refill(key, now, amount)),
                RuleKind::Synced(synced) => Ok(synced.refill(key, amount)),
                RuleKind::Exact(_) => Err(EngineError::RefillUnsupported(rule.id.to_string())),
                RuleKind::Unlimited | RuleKind::Blocked => Ok(false),
            })?;
            refilled += usize::from(took);
        }
        Ok(refilled)
    }

    /// What this instance knows about one descriptor's keys under each matching synced rule
    /// (for the admin endpoint and tests).
    pub fn key_info<K: AsRef<str>, V: AsRef<str>>(
        &self,
        domain: &str,
        entries: &[(K, V)],
    ) -> Vec<KeyInfo> {
        let Some(table) = self.table.domain(domain) else {
            return Vec::new();
        };
        let now = self.now();
        table
            .domain
            .match_descriptor(entries)
            .filter_map(|rule| {
                let rule = &table.rules[rule.index];
                let RuleKind::Synced(synced) = &*rule.kind else {
                    return None;
                };
                let info = with_key(rule.key_values(entries), |key| {
                    synced.key_info(key, now, self.link.view())
                })?;
                let rule_id = rule.id.clone();
                Some(KeyInfo { rule_id, ..info })
            })
            .collect()
    }

    /// Flushes every synced rule now (tests and shutdown call this; the flush loop calls
    /// [`Engine::flush_due`]).
    pub async fn flush(&self) -> FlushReport {
        self.flusher.flush(&self.table, Due::All).await
    }

    /// Flushes the synced rules whose span ended since their last flush.
    pub async fn flush_due(&self) -> FlushReport {
        self.flusher.flush(&self.table, Due::SpanEnded).await
    }

    /// Flushes only the keys that asked for an early sync: a key whose span's safe share is
    /// spent (its budget, or before its first reply its cold share) asks once a span. The
    /// flush loop calls this a few milliseconds after [`Engine::early_sync_asked`] resolves,
    /// so that keys asking at about the same time share one round trip.
    pub async fn flush_early(&self) -> FlushReport {
        self.flusher.flush(&self.table, Due::Early).await
    }

    /// Announces this instance to the store now and learns how many use it
    /// ([`Engine::fleet_size`]); the flush loop does this at its start, then every second until
    /// the count is steady, then every 30 s. An instance counts as live for 90 s after its last
    /// announcement.
    pub async fn announce(&self) {
        if self.table.announces() {
            self.link.announce().await;
        }
    }

    /// Whether keys wait for an early sync ([`Engine::flush_early`]).
    pub fn early_sync_wanted(&self) -> bool {
        self.link.early.wanted()
    }

    /// The time on [`Engine::now`]'s clock before which the early sync asked for should not
    /// leave (0: none; it leaves [`crate::EARLY_SYNC_DELAY`] after the ask at the soonest): a
    /// key read ahead of the other instances' flushes of a span boundary and reads again once
    /// they have landed.
    pub fn early_sync_not_before(&self) -> Nanos {
        self.link.early.not_before()
    }

    /// Resolves once keys ask for an early sync.
    pub async fn early_sync_asked(&self) {
        self.link.early.asked().await;
    }

    /// Instances live on the store, this one included, as this instance's last announcement
    /// found them (0 before the first answer, or with a store that keeps no such list).
    pub fn fleet_size(&self) -> u64 {
        self.link.fleet()
    }

    /// Every count this instance could not deliver to the store, for its state directory at
    /// shutdown ([`StateDir::save`]); empty when everything arrived. Takes the keys' counts:
    /// call it once, after the final flush.
    pub async fn spill(&self) -> Spill {
        self.flusher.spill(&self.table).await
    }

    /// Delivers an earlier run's spill with the next flushes (the engines reloads build from
    /// this one too), exactly once: what is in doubt is settled by its receipt first, and the
    /// file in `state` is rewritten before every send and removed once all is delivered.
    pub fn replay(&self, spill: Spill, state: Arc<StateDir>) {
        self.flusher.replay(spill, state);
    }

    /// Counts of an earlier run's spill not delivered yet.
    pub fn replay_pending(&self) -> u64 {
        self.flusher.replay_pending()
    }
}

/// What `rule` answered for descriptor `descriptor`, as the verdict reports it.
fn status_of<'e>(
    descriptor: usize,
    rule: &'e RuleEngine,
    (outcome, reason): (Outcome, Option<Reason>),
    decision: &Decision,
) -> RuleStatus<'e> {
    RuleStatus {
        descriptor,
        rule_id: &rule.id,
        name: rule.name.as_deref(),
        limit: rule.limit,
        outcome,
        reason,
        remaining: decision.remaining(),
        reset_after: decision.reset_after(),
        retry_after: decision.retry_after(),
        policy: rule.policy,
        quota_mode: rule.quota && !rule.shadow,
        shadow: rule.shadow,
        metadata: rule.metadata.as_deref(),
    }
}

/// A look (cost 0) at a rule: denied when the rule has no room for one request now. Cost-0
/// checks answer what would remain, so nothing left means a request of 1 would be refused.
fn look(
    rule: &RuleEngine,
    decision: Decision,
    reason: Option<Reason>,
) -> (Decision, Option<Reason>) {
    match (&*rule.kind, decision) {
        (RuleKind::Unlimited, d) => (d, reason),
        (_, Decision::Allowed(a)) if a.remaining == 0 => {
            let wait = a.reset_after.max(std::time::Duration::from_millis(1));
            let denied = sluice_core::Denied {
                retry_after: wait,
                reset_after: wait,
            };
            (Decision::Denied(denied), Some(Reason::NoRoom))
        }
        (_, d) => (d, reason),
    }
}

fn outcome_of(rule: &RuleEngine, decision: &Decision) -> Outcome {
    match (&*rule.kind, decision) {
        (RuleKind::Unlimited, _) => Outcome::Unlimited,
        (_, Decision::Allowed(_)) => Outcome::Allowed,
        (_, Decision::InsufficientCapacity(_)) if rule.shadow => Outcome::ShadowDenied,
        (_, Decision::InsufficientCapacity(_)) => Outcome::CostExceedsLimit,
        (_, _) if rule.shadow => Outcome::ShadowDenied,
        (_, _) => Outcome::Denied,
    }
}

/// `sluice_decisions_total`; the allowed counter of each rule is registered once.
fn count_decision(domain: &str, rule: &RuleEngine, outcome: Outcome, reason: Option<Reason>) {
    rule.stats.count(outcome);
    match outcome {
        Outcome::Allowed | Outcome::Unlimited => rule.allowed.increment(1),
        _ => counter!(
            "sluice_decisions_total",
            "domain" => domain.to_owned(),
            "rule" => rule.id.to_string(),
            "outcome" => match outcome {
                Outcome::ShadowDenied => "shadow_denied",
                Outcome::QuotaExceeded => "quota_exceeded",
                _ => "denied",
            },
            "reason" => reason.map_or("cost_exceeds_limit", Reason::as_str)
        )
        .increment(1),
    }
}
