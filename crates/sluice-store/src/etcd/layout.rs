//! Where the etcd store keeps a key's counts: one prefix per (key, window), under it one
//! counter per store instance (`c/<instance>`, its count in the window) and one entry per
//! engine node (`e/<node>`, the predictive policy's `count:at_ms:rate`). The window's total is
//! the sum of its counters: each instance only ever writes its own, so no two instances
//! contend for a key and an increment is a compare-and-set that never has to wait.

use crate::{FlushItem, NodeEntry};

/// The most keys one window's prefix may hold when read back (counters and entries of every
/// instance). A reply with more is refused as a bad reply rather than summed in part.
pub(crate) const MAX_KEYS_PER_WINDOW: i64 = 1024;

/// The most entries one flush writes for one key (a group's operations must fit one
/// transaction).
const MAX_ENTRIES_PER_GROUP: usize = 100;

/// The most instances a fleet read counts.
pub(crate) const MAX_FLEET: i64 = 100_000;

/// The prefix of the live-instance list: `<prefix><node>` = last announcement in ms.
pub(crate) const FLEET_PREFIX: &str = "sluice:v1:fleet/";

/// `sluice:v1:e:<len>:<key>/<window>/`: the key's length comes first, so no key's window can
/// be mistaken for another key's, whatever bytes the key holds.
pub(crate) fn window_prefix(key: &str, window: u64) -> Vec<u8> {
    format!("sluice:v1:e:{}:{key}/{window}/", key.len()).into_bytes()
}

/// The end of the range of keys starting with `prefix` (etcd's `range_end`).
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte 0xff: to the end of the keyspace.
    vec![0]
}

pub(crate) fn counter_key(prefix: &[u8], instance: &str) -> Vec<u8> {
    [prefix, b"c/", instance.as_bytes()].concat()
}

pub(crate) fn counters_prefix(prefix: &[u8]) -> Vec<u8> {
    [prefix, b"c/"].concat()
}

pub(crate) fn entry_key(prefix: &[u8], node: &str) -> Vec<u8> {
    [prefix, b"e/", node.as_bytes()].concat()
}

pub(crate) fn encode_entry(entry: &NodeEntry) -> Vec<u8> {
    let mut out = String::new();
    entry.encode_into(&mut out);
    out.into_bytes()
}

/// The items of one flush that name the same (key, window), merged: each instance writes its
/// counter once per transaction (etcd refuses a transaction that writes a key twice).
#[derive(Debug)]
pub(crate) struct Group {
    /// Positions of the items in the flush.
    pub items: Vec<usize>,
    pub key: std::sync::Arc<str>,
    pub window: u64,
    pub delta: u64,
    pub ttl: std::time::Duration,
    pub want_previous: bool,
    /// Entries to write, one per node (the last item's wins).
    pub entries: Vec<NodeEntry>,
    pub prefix: Vec<u8>,
}

/// Groups `items` by (key, window), in order of first appearance.
pub(crate) fn group(items: &[FlushItem]) -> Vec<Group> {
    let mut at: std::collections::HashMap<(&str, u64), usize> = std::collections::HashMap::new();
    let mut groups: Vec<Group> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let g = *at.entry((&item.key, item.window)).or_insert_with(|| {
            groups.push(Group {
                items: Vec::new(),
                key: item.key.clone(),
                window: item.window,
                delta: 0,
                ttl: item.ttl,
                want_previous: false,
                entries: Vec::new(),
                prefix: window_prefix(&item.key, item.window),
            });
            groups.len() - 1
        });
        let group = &mut groups[g];
        group.items.push(i);
        group.delta = group.delta.saturating_add(item.delta);
        group.ttl = group.ttl.max(item.ttl);
        group.want_previous |= item.want_previous;
        if let Some(entry) = &item.entry {
            group.entries.retain(|e| e.node != entry.node);
            // One transaction must hold a group: an engine sends one entry per key, so more
            // than this many nodes' entries for one key in one flush are dropped.
            if group.entries.len() < MAX_ENTRIES_PER_GROUP {
                group.entries.push(entry.clone());
            }
        }
    }
    groups
}

/// The most operations one transaction carries: etcd's default `--max-txn-ops` is 128, and
/// the receipt's marker takes one.
pub(crate) const MAX_OPS_PER_TXN: usize = 127;

/// `groups` cut into transactions of at most `per_txn` groups and [`MAX_OPS_PER_TXN`]
/// operations: each group costs its counter's put, its entries, the window's read and the
/// previous window's read when asked. The same groups always cut the same way, so a receipt's
/// transactions can be found again.
pub(crate) fn transactions(groups: &[Group], per_txn: usize) -> Vec<&[Group]> {
    let mut out = Vec::new();
    let (mut start, mut ops) = (0, 0);
    for (i, g) in groups.iter().enumerate() {
        let cost = 2 + g.entries.len() + usize::from(g.want_previous);
        if i > start && (i - start == per_txn || ops + cost > MAX_OPS_PER_TXN) {
            out.push(&groups[start..i]);
            (start, ops) = (i, 0);
        }
        ops += cost;
    }
    if start < groups.len() {
        out.push(&groups[start..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_key_window_prefix_is_inside_another_keys() {
        let a = window_prefix("k", 1);
        let b = window_prefix("k/1", 5);
        assert!(!b.starts_with(&a));
        assert_eq!(prefix_end(b"ab/"), b"ab0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
    }

    #[test]
    fn transactions_stay_under_etcds_operation_limit() {
        let entry = |n: &str| NodeEntry {
            node: n.into(),
            count: 1,
            at_ms: 1,
            rate_milli: 1,
        };
        let items: Vec<FlushItem> = (0..100)
            .map(|i| FlushItem {
                key: format!("k{i}").into(),
                window: 1,
                delta: 1,
                ttl: std::time::Duration::from_secs(1),
                entry: Some(entry(if i % 2 == 0 { "a" } else { "b" })),
                want_previous: true,
                first_write: true,
            })
            .chain((0..40).map(|i| FlushItem {
                key: "k0".into(),
                window: 1,
                delta: 1,
                ttl: std::time::Duration::from_secs(1),
                entry: Some(entry(&format!("c{i}"))),
                want_previous: false,
                first_write: false,
            }))
            .collect();
        let groups = group(&items);
        let txns = transactions(&groups, 31);
        assert_eq!(txns.iter().map(|t| t.len()).sum::<usize>(), 100);
        for t in &txns {
            let ops: usize = t
                .iter()
                .map(|g| 2 + g.entries.len() + usize::from(g.want_previous))
                .sum();
            assert!(
                t.len() <= 31 && ops <= MAX_OPS_PER_TXN,
                "{} groups, {ops} ops",
                t.len()
            );
        }
        // 31 groups of 4 operations fit (124); the merged first key (41 entries, 44
        // operations) leaves room for 20 more in its transaction.
        assert_eq!(txns[0].len(), 21);
        assert_eq!(txns[1].len(), 31);
    }
}
