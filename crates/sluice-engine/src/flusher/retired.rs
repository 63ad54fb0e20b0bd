//! Synced rules a reload removed: requests that took the old engine before the swap may still
//! count into them, so every flush sweeps them until no engine holds them and their counts
//! are all out.

use std::sync::Arc;

use sluice_core::Nanos;

use crate::rule::RuleKind;
use crate::synced::SyncedRule;

/// One removed synced rule.
#[derive(Clone)]
pub(crate) struct Retired {
    pub id: Arc<str>,
    kind: Arc<RuleKind>,
}

impl Retired {
    /// `kind` when it is a synced rule (nothing else has counts to flush).
    pub(crate) fn new(id: Arc<str>, kind: &Arc<RuleKind>) -> Option<Self> {
        matches!(**kind, RuleKind::Synced(_)).then(|| Self {
            id,
            kind: kind.clone(),
        })
    }

    pub(crate) fn synced(&self) -> Option<&SyncedRule> {
        match &*self.kind {
            RuleKind::Synced(synced) => Some(synced),
            _ => None,
        }
    }

    /// Still held by an engine (a request in flight), or still holding counts to send.
    pub(crate) fn is_live(&self) -> bool {
        Arc::strong_count(&self.kind) > 1 || self.synced().is_some_and(SyncedRule::has_unsent)
    }
}

/// The synced rules reloads removed, swept until they are done.
#[derive(Default)]
pub(crate) struct RetiredRules(parking_lot::Mutex<Vec<Retired>>);

impl RetiredRules {
    /// Keeps flushing a synced rule a reload removed (see [`Retired`]).
    pub(crate) fn push(&self, rule: Retired) {
        self.0.lock().push(rule);
    }

    /// The removed rules still to sweep (those done are forgotten).
    pub(crate) fn live(&self) -> Vec<Retired> {
        let mut retired = self.0.lock();
        retired.retain(Retired::is_live);
        retired.clone()
    }

    /// The shortest span among the removed rules still swept (`None`: none): the flush loop
    /// ticks at their boundaries too, since the new rules' spans may be longer.
    pub(crate) fn min_span_ns(&self) -> Option<Nanos> {
        self.0
            .lock()
            .iter()
            .filter_map(|rule| rule.synced().map(|synced| synced.params.span_ns))
            .min()
    }
}
