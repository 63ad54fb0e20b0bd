//! For a front door that hands a rule's room on to clients enforcing it themselves (RLQS:
//! Envoys admit requests on their assignments and report them afterwards): this instance's
//! part of each rule's room, and usage those clients already admitted, recorded without a
//! decision. No wire types here: the door reads parts and counts.

use std::sync::Arc;

use sluice_core::MAX_COST;

use crate::descriptor_key::with_key;
use crate::engine::{Engine, EngineError};
use crate::rule::RuleKind;

/// This instance's part of one matched rule's room, for one descriptor.
#[derive(Clone, Debug, PartialEq)]
pub struct FleetPart {
    /// The rule.
    pub rule_id: Arc<str>,
    /// The part of the rule's room this instance may hand out, 0..=1 (1: the room is this
    /// instance's own, or it is alone on the key). Across the instances that read the same
    /// store state, the parts add up to at most one.
    pub part: f64,
    /// A synced key's room left in the window for the whole fleet, by the estimate of its
    /// global count: what a look reads, without this instance's budget (which a look that
    /// finds it spent answers as no room at all). `None` for other rules.
    pub room: Option<u64>,
    /// Whether other instances hand out the same room (a synced or exact rule on a store that
    /// counts more than this instance, or that expects more): each reads the others'
    /// admissions late, even while this one's part is whole.
    pub shared: bool,
}

impl Engine {
    /// This instance's part of the room of every rule `entries` (one descriptor of `domain`)
    /// matches. Local rules: 1 (each instance has its own room). Exact rules: an even part of
    /// the fleet the store counts (their room is the fleet's, read at the store). Synced
    /// rules (predictive): a floor of [`crate::FLEET_PART_FLOOR`] split evenly among the
    /// instances counting the key, the rest by how the key's admissions over about the last
    /// window split among them, as the store's counts tell it;
    /// a limit too small to share (decided at the store) and the reactive policy: an even
    /// part. Reads state, decides nothing, counts nothing.
    pub fn fleet_parts<K: AsRef<str>, V: AsRef<str>>(
        &self,
        domain: &str,
        entries: &[(K, V)],
    ) -> Vec<FleetPart> {
        let Some(table) = self.table().domain(domain) else {
            return Vec::new();
        };
        let link = self.link();
        let (now, store) = (self.now(), link.view());
        table
            .domain
            .match_request(&[entries])
            .into_iter()
            .map(|m| {
                let rule = &table.rules[m.rule.index];
                let (part, room, shared) = match &*rule.kind {
                    RuleKind::Synced(synced) => {
                        let p =
                            with_key(rule.key_values(entries), |key| synced.part(key, now, store));
                        let parties = store.fleet.max(synced.params.expected_instances);
                        (p.part, p.room, parties > 1)
                    }
                    RuleKind::Exact(_) => (1.0 / store.fleet.max(1) as f64, None, store.fleet > 1),
                    RuleKind::Local(_) | RuleKind::Unlimited | RuleKind::Blocked => {
                        (1.0, None, false)
                    }
                };
                FleetPart {
                    rule_id: rule.id.clone(),
                    part,
                    room,
                    shared,
                }
            })
            .collect()
    }

    /// Records `count` requests of one descriptor that a client already admitted (on an
    /// assignment it enforces itself), without deciding: each matched synced rule counts
    /// them in the key's window and flushes them like admissions, whatever its room, so the
    /// fleet's counters hold what was let through. Local rules (each instance's own room) and
    /// exact ones (decided request by request at the store) take none. A key the rule does
    /// not track while it holds its most keys is left alone (memory stays bounded). Returns
    /// how many rules counted them; a `count` above [`MAX_COST`] is refused before any rule
    /// counts.
    pub fn record<K: AsRef<str>, V: AsRef<str>>(
        &self,
        domain: &str,
        entries: &[(K, V)],
        count: u64,
    ) -> Result<usize, EngineError> {
        if count > MAX_COST {
            return Err(EngineError::CostTooLarge {
                descriptor: 0,
                cost: count,
            });
        }
        let table = self
            .table()
            .domain(domain)
            .ok_or_else(|| EngineError::UnknownDomain(domain.to_owned()))?;
        if count == 0 {
            return Ok(0);
        }
        let now = self.now();
        let max_keys = self.options.max_keys_per_rule;
        let mut recorded = 0;
        for m in table.domain.match_request(&[entries]) {
            let rule = &table.rules[m.rule.index];
            let RuleKind::Synced(synced) = &*rule.kind else {
                continue;
            };
            recorded += with_key(rule.key_values(entries), |key| {
                if synced.keys.len() >= max_keys && !synced.keys.pin().contains_key(key) {
                    return 0;
                }
                synced.record(key, now, count);
                1
            });
        }
        Ok(recorded)
    }
}
