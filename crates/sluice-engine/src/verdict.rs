//! What the engine answers for a request.

use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

/// The decision for one matched rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// Under the limit.
    Allowed,
    /// Over the limit: the request is denied.
    Denied,
    /// Over the limit, but the rule is in shadow mode: counted, reported, not enforced.
    ShadowDenied,
    /// The rule is `unlimited`.
    Unlimited,
    /// The cost can never fit in the limit.
    CostExceedsLimit,
    /// Over a `quota_mode` limit, and the request went on: another quota-mode rule it matched
    /// still had room (when none has, every quota-mode rule over its limit reports `Denied`).
    QuotaExceeded,
}

/// Why a rule denied (or would have, in shadow mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// The local algorithm (local mode) or this instance's window count times the node estimate.
    LocalBudget,
    /// The key is blocked after the store reported the global count over the limit (cooldown).
    GlobalBlock,
    /// The store is unreachable and the seed's MAX/N-per-span fallback tripped.
    Fallback,
    /// The predictive estimate of the global count would exceed the limit.
    Estimate,
    /// The store's script denied: an exact rule, or a synced rule whose limit is too small to
    /// share.
    Exact,
    /// The store denied the key earlier and it has no room until its reset (no store call).
    CachedOverLimit,
    /// Exact mode: the store failed and `on_store_error: deny` applies.
    StoreError,
    /// A look (cost 0, e.g. Envoy's per-descriptor `hits_addend: 0`) at a key with no room
    /// for one more request: nothing was counted.
    NoRoom,
}

impl Reason {
    /// Metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::LocalBudget => "local_budget",
            Reason::GlobalBlock => "global_block",
            Reason::Fallback => "fallback",
            Reason::Estimate => "estimate",
            Reason::Exact => "exact",
            Reason::CachedOverLimit => "cached_over_limit",
            Reason::StoreError => "store_error",
            Reason::NoRoom => "no_room",
        }
    }
}

/// One matched rule's status, with what response headers need. Borrows the rule's names from
/// the engine, so building it writes no memory shared with other requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleStatus<'e> {
    /// Index of the request descriptor that matched.
    pub descriptor: usize,
    /// The rule's id.
    pub rule_id: &'e str,
    /// The rule's name, if it has one.
    pub name: Option<&'e str>,
    /// Limit and window (None for unlimited rules).
    pub limit: Option<(u64, Duration)>,
    /// Outcome.
    pub outcome: Outcome,
    /// Why it denied, when it did.
    pub reason: Option<Reason>,
    /// Quota left in the window after this request.
    pub remaining: u64,
    /// Time until the window (or bucket) resets.
    pub reset_after: Duration,
    /// When denied: how long until a retry can succeed.
    pub retry_after: Option<Duration>,
    /// Which policy decided: `local`, `predictive`, `reactive`, `exact`.
    pub policy: &'static str,
    /// The rule is in `quota_mode`.
    pub quota_mode: bool,
    /// The rule is in `shadow_mode`: counted and reported, never enforced.
    pub shadow: bool,
    /// The matched descriptor's `metadata` from the rule file.
    pub metadata: Option<&'e serde_json::Value>,
}

/// The answer for a whole request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict<'e> {
    /// Whether the request may proceed (no non-shadow rule denied).
    pub allowed: bool,
    /// Every matched rule's status, in descriptor order.
    pub statuses: SmallVec<[RuleStatus<'e>; 4]>,
}

impl<'e> Verdict<'e> {
    /// The status that limits the request most: the denying one with the longest retry, or the
    /// allowing one with the least remaining quota. What `RateLimit` headers describe.
    pub fn most_limiting(&self) -> Option<&RuleStatus<'e>> {
        let enforced = self
            .statuses
            .iter()
            .filter(|s| matches!(s.outcome, Outcome::Denied | Outcome::CostExceedsLimit));
        if let Some(worst) = enforced.max_by_key(|s| s.retry_after) {
            return Some(worst);
        }
        self.statuses
            .iter()
            .filter(|s| s.limit.is_some())
            .min_by_key(|s| s.remaining)
    }

    /// The longest `retry_after` among denying rules.
    pub fn retry_after(&self) -> Option<Duration> {
        self.statuses
            .iter()
            .filter(|s| s.outcome == Outcome::Denied)
            .filter_map(|s| s.retry_after)
            .max()
    }
}

/// A synced key as this instance sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyInfo {
    /// The rule.
    pub rule_id: Arc<str>,
    /// Window number.
    pub window: u64,
    /// Admitted here in the window.
    pub local: u64,
    /// The other instances' part of the window total read at the last flush (the total minus
    /// this instance's own count at that moment); zero until a reply arrives in the window.
    pub others_read: u64,
    /// Instances with a live entry for the key, this one included.
    pub live_instances: usize,
    /// The seed's node estimate.
    pub node_estimate: u64,
    /// The predictive estimate of the global count now.
    pub estimate: f64,
    /// Blocked (cooldown) until this time.
    pub blocked_until: u64,
    /// Counts waiting to be flushed (this window and carried).
    pub unflushed: u64,
}
