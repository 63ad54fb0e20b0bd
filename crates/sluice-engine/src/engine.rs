//! The engine: rules of every domain, one limiter per rule, the flush.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use metrics::{counter, gauge, histogram};
use sluice_config::{AlgorithmKind, Domain, Limit, Mode, Policy, RuleSet, RuleSettings};
use sluice_core::{Clock, Decision, MAX_COST, Nanos};
use sluice_store::{CounterKey, CounterStore, FlushItem, FlushReceipt, FlushReply, StoreError};
use smallvec::SmallVec;

use crate::descriptor_key::with_key;
use crate::exact::ExactRule;
use crate::local::LocalLimiter;
use crate::sketch::OverflowSketch;
use crate::synced::{PendingFlush, SyncedParams, SyncedRule};
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

/// Settings that are not in the rule files.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// This instance's id in the store's per-node entries; unique per process by default.
    pub node_id: Option<String>,
    /// Whether the store is shared with other instances. With an unshared (memory) store,
    /// `synced` rules behave as `local` ones.
    pub shared_store: bool,
    /// Tracked keys per rule before new keys go to the fixed-size sketch.
    pub max_keys_per_rule: usize,
    /// Instances assumed by `exact` rules' `on_store_error: local` (MAX / instances each).
    pub expected_instances: u64,
    /// Correct this instance's clock by the store's `TIME` (read in every flush), so that
    /// instances with skewed clocks agree on window numbers. Tests that drive the engine with a
    /// manual clock against a real Redis turn it off.
    pub follow_store_clock: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            node_id: None,
            shared_store: true,
            max_keys_per_rule: 1_000_000,
            expected_instances: 1,
            follow_store_clock: true,
        }
    }
}

enum RuleKind {
    Unlimited,
    Local(LocalLimiter),
    Synced(SyncedRule),
    Exact(ExactRule),
}

struct RuleEngine {
    id: Arc<str>,
    name: Option<Arc<str>>,
    shadow: bool,
    limit: Option<(u64, Duration)>,
    /// The largest cost the rule admits at once; a larger one is `CostExceedsLimit`, decided
    /// before any counter is touched.
    capacity: u64,
    policy: &'static str,
    /// Shared with the engine a reload builds, when the rule did not change: its counters
    /// survive the reload.
    kind: Arc<RuleKind>,
    /// The rule's resolved settings; a reload keeps `kind` only when these are equal.
    signature: String,
    /// Allocated on first overflow (256 KiB), never for rules that stay under the cap.
    overflow: std::sync::OnceLock<OverflowSketch>,
    /// Last span number flushed (synced rules).
    flushed_span: AtomicU64,
    allowed: metrics::Counter,
}

struct DomainTable {
    domain: Domain,
    rules: Vec<RuleEngine>,
}

/// What one flush did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlushReport {
    /// Keys (items) sent.
    pub items: usize,
    /// Round trips to the store.
    pub round_trips: usize,
    /// Items whose counts did not reach the store (kept for the next flush).
    pub failed: usize,
    /// Keys forgotten because they were idle.
    pub evicted: usize,
    /// The error, if the store failed as a whole.
    pub error: Option<String>,
}

/// The rate-limit engine. Cheap to share (`Arc<Engine>`); every method takes `&self`.
pub struct Engine {
    clock: Arc<dyn Clock>,
    store: Arc<dyn CounterStore>,
    domains: HashMap<String, DomainTable, foldhash::fast::RandomState>,
    node: Arc<str>,
    offset_ns: AtomicI64,
    store_ok: AtomicBool,
    store_reached: AtomicBool,
    /// Held for a whole flush (one at a time, shared with the engines that reloads make).
    flushing: Arc<tokio::sync::Mutex<Delivery>>,
    max_keys: usize,
    min_span_ns: u64,
    follow_store_clock: bool,
    options: EngineOptions,
    /// Whether any rule is in exact mode (they need the clock offset without flushing).
    has_exact: bool,
    /// When the store's clock was last probed (raw local time).
    last_probe: AtomicU64,
}

/// What the engine knows about counts whose arrival in the store is uncertain. A flush that
/// times out, or whose connection breaks after sending, may have been applied: its counts go
/// back to their keys (nothing is lost), and before they are sent again the flush's receipt
/// tells whether they arrived (nothing is counted twice).
#[derive(Default)]
struct Delivery {
    /// Flushes whose outcome is not (entirely) known.
    doubt: Vec<Doubt>,
    /// Counts the store is known to hold while their keys still have them as unsent (a flush in
    /// doubt that did arrive), per store key and window: taken off the next flush's deltas.
    landed: HashMap<(Arc<str>, u64), u64>,
    /// The next flush's receipt token.
    next_token: u64,
}

/// A flush whose outcome is unknown for some of its items.
struct Doubt {
    receipt: FlushReceipt,
    /// The items exactly as sent (entries left out): the store finds each pipeline's marker
    /// from them.
    sent: Vec<FlushItem>,
    /// Per item of `sent`: whether its outcome is still unknown.
    unknown: Vec<bool>,
}

impl Delivery {
    fn new() -> Self {
        // Tokens stay unique across restarts of an instance with the same id: they start at a
        // random number (std's hasher keys come from the OS).
        use std::hash::BuildHasher as _;
        Self {
            next_token: std::collections::hash_map::RandomState::new().hash_one(0u8),
            ..Self::default()
        }
    }

    /// The store keys and windows whose counts are in an unsettled flush.
    fn held(&self) -> std::collections::HashSet<(Arc<str>, u64)> {
        self.doubt
            .iter()
            .flat_map(|d| d.sent.iter().zip(&d.unknown))
            .filter(|(_, unknown)| **unknown)
            .map(|(item, _)| (item.key.clone(), item.window))
            .collect()
    }

    /// Takes the counts known to have arrived off `items`; returns what each item lost.
    fn take_landed(&self, items: &mut [FlushItem]) -> Vec<u64> {
        if self.landed.is_empty() {
            return Vec::new();
        }
        items
            .iter_mut()
            .map(|item| {
                let known = self
                    .landed
                    .get(&(item.key.clone(), item.window))
                    .map_or(0, |&n| n.min(item.delta));
                item.delta -= known;
                known
            })
            .collect()
    }

    /// After a flush: the counts taken off items that failed (`failed(i)`) are still known to
    /// have arrived (their keys have them back as unsent); the rest is forgotten (sent, or
    /// dropped by their keys).
    fn keep_landed(&mut self, items: &[FlushItem], taken: &[u64], failed: impl Fn(usize) -> bool) {
        if taken.is_empty() {
            self.landed.clear();
            return;
        }
        let mut landed = HashMap::new();
        for (i, item) in items.iter().enumerate() {
            if let Some(&known) = taken.get(i).filter(|&&n| n > 0 && failed(i)) {
                landed.insert((item.key.clone(), item.window), known);
            }
        }
        self.landed = landed;
    }
}

fn default_node_id(clock: &dyn Clock) -> String {
    format!("{}-{:x}", std::process::id(), clock.now() & 0xffff_ffff)
}

fn store_error_kind(e: &StoreError) -> &'static str {
    match e {
        StoreError::Unavailable(_) => "unavailable",
        StoreError::Timeout(_) => "timeout",
        StoreError::BadReply { .. } => "bad_reply",
        _ => "refused",
    }
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
        Self::build(rules, defaults, store, clock, options, None)
    }

    /// An engine for new rules that keeps this one's store, clock, node id, clock offset and
    /// options, and the counters of every rule whose id and resolved settings did not change.
    pub fn reload(&self, rules: &RuleSet, defaults: &RuleSettings) -> Self {
        let options = EngineOptions {
            node_id: Some(self.node.to_string()),
            shared_store: self.options.shared_store,
            max_keys_per_rule: self.max_keys,
            expected_instances: self.options.expected_instances,
            follow_store_clock: self.follow_store_clock,
        };
        let engine = Self::build(
            rules,
            defaults,
            self.store.clone(),
            self.clock.clone(),
            options,
            Some(self),
        );
        engine
            .offset_ns
            .store(self.offset_ns.load(Ordering::Relaxed), Ordering::Relaxed);
        engine.store_ok.store(self.store_ok(), Ordering::Relaxed);
        engine
            .store_reached
            .store(self.store_reached(), Ordering::Relaxed);
        engine
    }

    /// How many rules of `other` share their counters with this engine (kept by a reload).
    pub fn shared_rules(&self, other: &Engine) -> usize {
        self.rules()
            .filter(|r| other.rules().any(|o| Arc::ptr_eq(&r.kind, &o.kind)))
            .count()
    }

    fn rules(&self) -> impl Iterator<Item = &RuleEngine> {
        self.domains.values().flat_map(|t| t.rules.iter())
    }

    fn build(
        rules: &RuleSet,
        defaults: &RuleSettings,
        store: Arc<dyn CounterStore>,
        clock: Arc<dyn Clock>,
        options: EngineOptions,
        previous: Option<&Engine>,
    ) -> Self {
        let node: Arc<str> = options
            .node_id
            .clone()
            .unwrap_or_else(|| default_node_id(&*clock))
            .into();
        let mut min_span_ns = u64::MAX;
        let mut domains = HashMap::default();
        for domain in rules.domains() {
            let mut engines = Vec::with_capacity(domain.rules().len());
            for rule in domain.rules() {
                let id: Arc<str> = rule.id.as_str().into();
                let (kind, policy, limit) = match &rule.limit {
                    Limit::Unlimited => (RuleKind::Unlimited, "unlimited", None),
                    Limit::Limited(spec) => {
                        let r = spec.resolve(defaults);
                        let window_algorithm = matches!(
                            r.algorithm,
                            AlgorithmKind::FixedWindow | AlgorithmKind::SlidingWindow
                        );
                        let mode = match r.mode {
                            Mode::Synced if !options.shared_store => Mode::Local,
                            Mode::Synced if !window_algorithm => {
                                tracing::warn!(rule = %rule.id, algorithm = r.algorithm.name(), "synced mode counts windows; this algorithm runs locally on each instance");
                                Mode::Local
                            }
                            m => m,
                        };
                        let limit = Some((r.rate.limit(), r.rate.window()));
                        match mode {
                            Mode::Synced => {
                                let span_ns = (r.rate.window_ns() / u64::from(r.spans)).max(1);
                                min_span_ns = min_span_ns.min(span_ns);
                                let params = SyncedParams {
                                    limit: r.rate.limit(),
                                    window_ns: r.rate.window_ns(),
                                    spans: u64::from(r.spans),
                                    span_ns,
                                    cooldown_ns: sluice_core::duration_to_nanos(r.cooldown),
                                    policy: r.policy,
                                    sliding: r.algorithm == AlgorithmKind::SlidingWindow,
                                    budgets: true,
                                    expected_instances: options.expected_instances.max(1),
                                };
                                let policy = if r.policy == Policy::Reactive {
                                    "reactive"
                                } else {
                                    "predictive"
                                };
                                (
                                    RuleKind::Synced(SyncedRule::new(params, id.clone())),
                                    policy,
                                    limit,
                                )
                            }
                            Mode::Exact => (
                                RuleKind::Exact(ExactRule::new(
                                    &r,
                                    options.expected_instances,
                                    clock.clone(),
                                )),
                                "exact",
                                limit,
                            ),
                            _ => (
                                RuleKind::Local(LocalLimiter::new(&r, r.rate, clock.clone())),
                                "local",
                                limit,
                            ),
                        }
                    }
                };
                let allowed = counter!("sluice_decisions_total", "domain" => domain.name().to_owned(), "rule" => rule.id.clone(), "outcome" => "allowed", "reason" => "");
                let signature = match &rule.limit {
                    Limit::Unlimited => "unlimited".to_owned(),
                    Limit::Limited(spec) => format!("{:?} {policy}", spec.resolve(defaults)),
                };
                let kept = previous.and_then(|p| {
                    p.rules()
                        .find(|r| *r.id == *rule.id && r.signature == signature)
                        .map(|r| Arc::clone(&r.kind))
                });
                engines.push(RuleEngine {
                    id,
                    name: rule.name.as_deref().map(Arc::from),
                    shadow: rule.shadow_mode,
                    limit,
                    capacity: match &rule.limit {
                        Limit::Unlimited => u64::MAX,
                        Limit::Limited(spec) => crate::local::capacity_of(&spec.resolve(defaults)),
                    },
                    policy,
                    kind: kept.unwrap_or_else(|| Arc::new(kind)),
                    signature,
                    overflow: std::sync::OnceLock::new(),
                    flushed_span: AtomicU64::new(0),
                    allowed,
                });
            }
            domains.insert(
                domain.name().to_owned(),
                DomainTable {
                    domain: domain.clone(),
                    rules: engines,
                },
            );
        }
        let has_exact = domains.values().any(|t: &DomainTable| {
            t.rules
                .iter()
                .any(|r| matches!(*r.kind, RuleKind::Exact(_)))
        });
        Self {
            clock,
            store,
            domains,
            node,
            offset_ns: AtomicI64::new(0),
            store_ok: AtomicBool::new(true),
            store_reached: AtomicBool::new(false),
            flushing: previous.map_or_else(
                || Arc::new(tokio::sync::Mutex::new(Delivery::new())),
                |p| p.flushing.clone(),
            ),
            max_keys: options.max_keys_per_rule.max(1),
            min_span_ns: if min_span_ns == u64::MAX {
                0
            } else {
                min_span_ns
            },
            follow_store_clock: options.follow_store_clock,
            has_exact,
            last_probe: AtomicU64::new(0),
            options,
        }
    }

    /// This instance's node id.
    pub fn node_id(&self) -> &str {
        &self.node
    }

    /// The current time corrected by the offset to the store's clock.
    pub fn now(&self) -> Nanos {
        let raw = self.clock.now() as i128 + i128::from(self.offset_ns.load(Ordering::Relaxed));
        raw.clamp(0, i128::from(u64::MAX)) as u64
    }

    /// Store time minus local time, as last measured (nanoseconds).
    pub fn clock_offset_ns(&self) -> i64 {
        self.offset_ns.load(Ordering::Relaxed)
    }

    /// Whether the last flush reached the store.
    pub fn store_ok(&self) -> bool {
        self.store_ok.load(Ordering::Relaxed)
    }

    /// Whether the store has ever answered a flush.
    pub fn store_reached(&self) -> bool {
        self.store_reached.load(Ordering::Relaxed)
    }

    /// The shortest span among synced rules (zero when there are none): how often to flush.
    pub fn flush_interval(&self) -> Option<Duration> {
        (self.min_span_ns > 0).then(|| Duration::from_nanos(self.min_span_ns))
    }

    /// Whether `domain` has rules.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
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
            return Err(EngineError::CostTooLarge {
                descriptor,
                cost: cost_of(descriptor),
            });
        }
        let table = self
            .domains
            .get(domain)
            .ok_or_else(|| EngineError::UnknownDomain(domain.to_owned()))?;
        let mut matched: SmallVec<[(usize, &sluice_config::Rule); 8]> = SmallVec::new();
        for (i, d) in descriptors.iter().enumerate() {
            for rule in table.domain.match_descriptor(d.as_ref()) {
                matched.push((i, rule));
            }
        }
        if matched.iter().any(|(_, r)| !r.replaces.is_empty()) {
            let replaced: SmallVec<[&str; 8]> = matched
                .iter()
                .flat_map(|(_, r)| r.replaces.iter().map(String::as_str))
                .collect();
            matched.retain(|(_, r)| r.name.as_deref().is_none_or(|n| !replaced.contains(&n)));
        }
        let now = self.now();
        let mut verdict = Verdict {
            allowed: true,
            statuses: SmallVec::new(),
        };
        for (di, rule) in matched {
            let engine = &table.rules[rule.index];
            let entries = descriptors[di].as_ref();
            let rule_cost = if verdict.allowed || engine.shadow {
                cost_of(di)
            } else {
                0
            };
            let (decision, reason) = self.check_rule(engine, entries, now, rule_cost).await;
            let outcome = match (&*engine.kind, decision) {
                (RuleKind::Unlimited, _) => Outcome::Unlimited,
                (_, Decision::Allowed(_)) => Outcome::Allowed,
                (_, Decision::InsufficientCapacity(_)) if engine.shadow => Outcome::ShadowDenied,
                (_, Decision::InsufficientCapacity(_)) => Outcome::CostExceedsLimit,
                (_, _) if engine.shadow => Outcome::ShadowDenied,
                (_, _) => Outcome::Denied,
            };
            match outcome {
                Outcome::Allowed | Outcome::Unlimited => engine.allowed.increment(1),
                _ => counter!(
                    "sluice_decisions_total",
                    "domain" => domain.to_owned(),
                    "rule" => engine.id.to_string(),
                    "outcome" => if outcome == Outcome::ShadowDenied { "shadow_denied" } else { "denied" },
                    "reason" => reason.map_or("cost_exceeds_limit", Reason::as_str)
                )
                .increment(1),
            }
            if matches!(outcome, Outcome::Denied | Outcome::CostExceedsLimit) {
                verdict.allowed = false;
            }
            verdict.statuses.push(RuleStatus {
                descriptor: di,
                rule_id: &engine.id,
                name: engine.name.as_deref(),
                limit: engine.limit,
                outcome,
                reason,
                remaining: decision.remaining(),
                reset_after: decision.reset_after(),
                retry_after: decision.retry_after(),
                policy: engine.policy,
            });
        }
        Ok(verdict)
    }

    async fn check_rule<K: AsRef<str>, V: AsRef<str>>(
        &self,
        engine: &RuleEngine,
        entries: &[(K, V)],
        now: Nanos,
        cost: u64,
    ) -> (Decision, Option<Reason>) {
        let values = || entries.iter().map(|(_, v)| v.as_ref());
        let store_key = || -> Arc<str> {
            let values: SmallVec<[&str; 4]> = values().collect();
            CounterKey::new(&engine.id, &values).as_str().into()
        };
        match &*engine.kind {
            RuleKind::Unlimited => (
                Decision::Allowed(sluice_core::Allowed {
                    remaining: u64::MAX,
                    reset_after: Duration::ZERO,
                    delay: Duration::ZERO,
                }),
                None,
            ),
            _ if cost > engine.capacity => (
                Decision::InsufficientCapacity(sluice_core::InsufficientCapacity {
                    cost,
                    capacity: engine.capacity,
                }),
                None,
            ),
            RuleKind::Local(local) => with_key(values(), |key| {
                if local.len() >= self.max_keys && !local.contains(key) {
                    return self.overflow(engine, key, now, cost, 1);
                }
                let d = local.check(key, now, cost);
                let reason = matches!(d, Decision::Denied(_)).then_some(Reason::LocalBudget);
                (d, reason)
            }),
            RuleKind::Synced(synced) => {
                let store_ok = self.store_ok.load(Ordering::Relaxed);
                with_key(values(), |key| {
                    if synced.keys.len() >= self.max_keys && !synced.keys.pin().contains_key(key) {
                        // Untracked keys are never synced: each instance keeps to its share.
                        let instances = synced.params.expected_instances;
                        return self.overflow(engine, key, now, cost, instances);
                    }
                    synced.check(key, now, cost, store_ok)
                })
            }
            RuleKind::Exact(exact) => {
                let key = with_key(values(), str::to_owned);
                let (d, reason, error) = exact
                    .check(&*self.store, &key, store_key(), now, cost, self.max_keys)
                    .await;
                if let Some(e) = error {
                    counter!("sluice_store_errors_total", "kind" => store_error_kind(&e))
                        .increment(1);
                    tracing::debug!(rule = %engine.id, error = %e, "exact-mode store call failed");
                }
                (d, reason)
            }
        }
    }

    /// Decides a key beyond the rule's cap with the rule's fixed-size sketch, locally. For a
    /// synced rule each of the `instances` expected keeps to its share of the limit (rounded
    /// up), since these counts never reach the store.
    fn overflow(
        &self,
        engine: &RuleEngine,
        key: &str,
        now: Nanos,
        cost: u64,
        instances: u64,
    ) -> (Decision, Option<Reason>) {
        counter!("sluice_overflow_checks_total", "rule" => engine.id.to_string()).increment(1);
        let (limit, window) = engine.limit.unwrap_or((u64::MAX, Duration::from_secs(1)));
        let limit = limit.div_ceil(instances.max(1));
        let window_ns = sluice_core::duration_to_nanos(window).max(1);
        let reset = Duration::from_nanos(window_ns - now % window_ns);
        if engine
            .overflow
            .get_or_init(OverflowSketch::new)
            .check(key, now, window_ns, limit, cost)
        {
            (
                Decision::Allowed(sluice_core::Allowed {
                    remaining: 0,
                    reset_after: reset,
                    delay: Duration::ZERO,
                }),
                None,
            )
        } else {
            (
                Decision::Denied(sluice_core::Denied {
                    retry_after: reset,
                    reset_after: reset,
                }),
                Some(Reason::LocalBudget),
            )
        }
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
            .domains
            .get(domain)
            .ok_or_else(|| EngineError::UnknownDomain(domain.to_owned()))?;
        let now = self.now();
        let mut refilled = 0;
        for rule in table.domain.match_descriptor(entries) {
            let engine = &table.rules[rule.index];
            let took = with_key(
                entries.iter().map(|(_, v)| v.as_ref()),
                |key| match &*engine.kind {
                    RuleKind::Local(local) => Ok(local.refill(key, now, amount)),
                    RuleKind::Synced(synced) => Ok(synced.refill(key, amount)),
                    RuleKind::Exact(_) => {
                        Err(EngineError::RefillUnsupported(engine.id.to_string()))
                    }
                    RuleKind::Unlimited => Ok(false),
                },
            )?;
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
        let Some(table) = self.domains.get(domain) else {
            return Vec::new();
        };
        let now = self.now();
        table
            .domain
            .match_descriptor(entries)
            .filter_map(|rule| {
                let engine = &table.rules[rule.index];
                let RuleKind::Synced(synced) = &*engine.kind else {
                    return None;
                };
                with_key(entries.iter().map(|(_, v)| v.as_ref()), |key| {
                    synced.key_info(key, now)
                })
                .map(|info| KeyInfo {
                    rule_id: engine.id.clone(),
                    ..info
                })
            })
            .collect()
    }

    /// Flushes every synced rule now (tests and shutdown call this; `sluice serve` calls
    /// [`Engine::flush_due`] from a timer).
    pub async fn flush(&self) -> FlushReport {
        self.flush_rules(true).await
    }

    /// Settles the flushes whose outcome was unknown: counts that arrived are remembered (and
    /// taken off the next items of their key and window), lost ones are sent again by their
    /// keys. What cannot be settled (the store did not answer) stays in doubt. Returns the
    /// first error.
    async fn settle_doubts(&self, delivery: &mut Delivery) -> Option<StoreError> {
        let mut error: Option<StoreError> = None;
        for doubt in &mut delivery.doubt {
            // After one failure the store is not asked again in this flush.
            if error.is_some() {
                break;
            }
            let arrived = match self.store.landed(&doubt.sent, &doubt.receipt).await {
                Ok(arrived) => arrived,
                Err(e) => {
                    error = Some(e);
                    continue;
                }
            };
            for (i, item) in doubt.sent.iter().enumerate() {
                let known = arrived.get(i).copied().flatten();
                let Some(arrived) = known.filter(|_| doubt.unknown[i]) else {
                    continue;
                };
                doubt.unknown[i] = false;
                if arrived {
                    *delivery
                        .landed
                        .entry((item.key.clone(), item.window))
                        .or_default() += item.delta;
                }
                let outcome = if arrived { "landed" } else { "lost" };
                counter!("sluice_flush_doubts_settled_total", "outcome" => outcome).increment(1);
            }
        }
        delivery.doubt.retain(|d| d.unknown.contains(&true));
        error
    }

    /// Sends `items` with a new receipt, after settling the flushes whose outcome was unknown.
    /// The reply's results line up with `items`. An item whose key and window are still in
    /// doubt is not sent: it fails, so its key keeps the count, until its doubt is settled.
    async fn send_flush(
        &self,
        delivery: &mut Delivery,
        items: &mut [FlushItem],
    ) -> Result<FlushReply, StoreError> {
        let settle_error = self.settle_doubts(delivery).await;
        let held = delivery.held();
        let is_held =
            |item: &FlushItem| !held.is_empty() && held.contains(&(item.key.clone(), item.window));
        let taken = delivery.take_landed(items);
        let receipt = FlushReceipt {
            owner: self.node.clone(),
            token: delivery.next_token,
        };
        delivery.next_token = delivery.next_token.wrapping_add(1);
        let not_settled = || {
            settle_error.clone().unwrap_or_else(|| {
                StoreError::Unavailable("an earlier flush of this key is not settled".into())
            })
        };
        // What is sent: every item, or those not held.
        let filtered: Vec<FlushItem>;
        let sent: &[FlushItem] = if held.is_empty() {
            items
        } else {
            filtered = items.iter().filter(|i| !is_held(i)).cloned().collect();
            &filtered
        };
        // A store that could not be asked about the doubts (every node failed) is not sent
        // anything either: that would only wait for a second timeout.
        let attempted = settle_error.is_none() && !sent.is_empty();
        let result = if attempted {
            self.store.flush(sent, Some(&receipt)).await
        } else {
            Err(not_settled())
        };
        // Items whose outcome is unknown start a new doubt.
        let in_doubt = |i: usize| match &result {
            Ok(reply) => reply
                .results
                .get(i)
                .is_some_and(|r| r.as_ref().is_err_and(StoreError::is_unavailable)),
            Err(e) => attempted && e.is_unavailable(),
        };
        let all_ok = matches!(&result, Ok(r) if r.results.iter().all(Result::is_ok));
        let unknown: Vec<bool> = match all_ok {
            true => Vec::new(),
            false => (0..sent.len())
                .map(|i| sent[i].delta > 0 && in_doubt(i))
                .collect(),
        };
        if unknown.contains(&true) {
            delivery.doubt.push(Doubt {
                receipt,
                sent: sent
                    .iter()
                    .map(|i| FlushItem {
                        entry: None,
                        ..i.clone()
                    })
                    .collect(),
                unknown,
            });
        }
        // The reply, lined up with `items`.
        let result = result.map(|mut reply| {
            if !held.is_empty() {
                let mut answers = std::mem::take(&mut reply.results).into_iter();
                reply.results = items
                    .iter()
                    .map(|item| match is_held(item) {
                        true => Err(not_settled()),
                        false => answers.next().unwrap_or_else(|| Err(not_settled())),
                    })
                    .collect();
            }
            reply
        });
        delivery.keep_landed(items, &taken, |i| match &result {
            Ok(reply) => !matches!(reply.results.get(i), Some(Ok(_))),
            Err(_) => true,
        });
        result
    }

    /// Flushes the synced rules whose span ended since their last flush.
    pub async fn flush_due(&self) -> FlushReport {
        self.flush_rules(false).await
    }

    async fn flush_rules(&self, all: bool) -> FlushReport {
        let mut delivery = self.flushing.lock().await;
        let now = self.now();
        let mut items: Vec<FlushItem> = Vec::new();
        let mut pending: Vec<(&RuleEngine, PendingFlush)> = Vec::new();
        let mut report = FlushReport::default();
        for table in self.domains.values() {
            for engine in &table.rules {
                match &*engine.kind {
                    RuleKind::Synced(synced) => {
                        let span = now / synced.params.span_ns;
                        if !all && engine.flushed_span.load(Ordering::Relaxed) == span {
                            continue;
                        }
                        engine.flushed_span.store(span, Ordering::Relaxed);
                        let mut mine = Vec::new();
                        let sweep = synced.prepare_flush(now, &self.node, &mut items, &mut mine);
                        report.evicted += sweep.evicted;
                        if sweep.evicted > 0 {
                            counter!("sluice_evicted_keys_total", "rule" => engine.id.to_string())
                                .increment(sweep.evicted as u64);
                        }
                        gauge!("sluice_tracked_keys", "rule" => engine.id.to_string())
                            .set(synced.keys.len() as f64);
                        gauge!("sluice_live_instances", "rule" => engine.id.to_string())
                            .set(sweep.live_instances as f64);
                        gauge!("sluice_blocked_keys", "rule" => engine.id.to_string())
                            .set(sweep.blocked as f64);
                        gauge!("sluice_node_estimate", "rule" => engine.id.to_string())
                            .set(sweep.node_estimate as f64);
                        pending.extend(mine.into_iter().map(|p| (engine, p)));
                    }
                    RuleKind::Local(local) => {
                        let evicted = local.evict_idle(now);
                        report.evicted += evicted;
                        gauge!("sluice_tracked_keys", "rule" => engine.id.to_string())
                            .set(local.len() as f64);
                    }
                    RuleKind::Exact(exact) => {
                        report.evicted += exact.evict(now);
                        gauge!("sluice_blocked_keys", "rule" => engine.id.to_string())
                            .set(exact.blocked() as f64);
                    }
                    RuleKind::Unlimited => {}
                }
            }
        }
        if items.is_empty() {
            // Nothing to send: still find out whether the store answers (readiness, and the
            // fallback decision), and keep the clock offset fresh for exact rules (they pass
            // their corrected time to the store's scripts), with the cheapest call, at most
            // once a second.
            let raw_now = self.clock.now();
            let probe_due =
                raw_now.saturating_sub(self.last_probe.load(Ordering::Relaxed)) >= 1_000_000_000;
            if probe_due
                && ((!self.store_reached() && self.min_span_ns > 0)
                    || (self.has_exact && self.follow_store_clock))
            {
                self.last_probe.store(raw_now, Ordering::Relaxed);
                let sent = self.clock.now();
                match self.store.time().await {
                    Ok(store_time) => {
                        if self.follow_store_clock {
                            let received = self.clock.now();
                            let offset = store_time as i128 - (sent / 2 + received / 2) as i128;
                            self.offset_ns.store(
                                offset.clamp(i64::MIN.into(), i64::MAX.into()) as i64,
                                Ordering::Relaxed,
                            );
                        }
                        self.store_ok.store(true, Ordering::Relaxed);
                        self.store_reached.store(true, Ordering::Relaxed);
                    }
                    Err(e) => {
                        self.store_ok.store(false, Ordering::Relaxed);
                        report.error = Some(e.to_string());
                    }
                }
            }
            return report;
        }
        report.items = items.len();
        let sent = self.clock.now();
        let result = self.send_flush(&mut delivery, &mut items).await;
        let received = self.clock.now();
        histogram!("sluice_flush_duration_seconds")
            .record(received.saturating_sub(sent) as f64 / 1e9);
        counter!("sluice_flush_items_total").increment(items.len() as u64);
        match result {
            Ok(reply) => {
                self.store_ok.store(true, Ordering::Relaxed);
                self.store_reached.store(true, Ordering::Relaxed);
                report.round_trips = reply.round_trips;
                if let Some(store_time) = reply.store_time.filter(|_| self.follow_store_clock) {
                    let midpoint = sent / 2 + received / 2;
                    let offset = store_time as i128 - midpoint as i128;
                    self.offset_ns.store(
                        offset.clamp(i64::MIN.into(), i64::MAX.into()) as i64,
                        Ordering::Relaxed,
                    );
                    gauge!("sluice_clock_offset_seconds").set(offset as f64 / 1e9);
                }
                for result in &reply.results {
                    if let Err(e) = result {
                        counter!("sluice_store_errors_total", "kind" => store_error_kind(e))
                            .increment(1);
                        tracing::warn!(error = %e, "flush of one key failed; its count is kept for the next flush");
                    }
                }
                let now = self.now();
                for (engine, p) in &pending {
                    if let RuleKind::Synced(synced) = &*engine.kind
                        && !synced.apply(p, Some(&reply.results), &self.node, now)
                    {
                        report.failed += 1;
                    }
                }
                counter!("sluice_flushes_total", "result" => "ok").increment(1);
            }
            Err(e) => {
                self.store_ok.store(false, Ordering::Relaxed);
                counter!("sluice_store_errors_total", "kind" => store_error_kind(&e)).increment(1);
                counter!("sluice_flushes_total", "result" => "error").increment(1);
                tracing::warn!(store = %self.store.describe(), error = %e, "flush failed; counts are kept and local fallback limits apply");
                for (engine, p) in &pending {
                    if let RuleKind::Synced(synced) = &*engine.kind {
                        synced.apply(p, None, &self.node, now);
                    }
                }
                report.failed = report.items;
                report.error = Some(e.to_string());
            }
        }
        report
    }

    /// Runs [`Engine::flush_due`] at every span boundary until `shutdown` resolves, then flushes
    /// everything once more.
    pub async fn run_flusher(self: Arc<Self>, shutdown: impl std::future::Future<Output = ()>) {
        let Some(interval) = self.flush_interval() else {
            shutdown.await;
            return;
        };
        let tick = interval.min(Duration::from_secs(1));
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let wait = tick.as_nanos() as u64 - self.now() % tick.as_nanos() as u64;
            tokio::select! {
                _ = &mut shutdown => break,
                _ = tokio::time::sleep(Duration::from_nanos(wait)) => {
                    self.flush_due().await;
                }
            }
        }
        self.flush().await;
    }
}
