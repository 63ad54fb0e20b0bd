//! Reading the store's replies: a flush item's outcome, the instances' entries, `TIME`, the
//! exact scripts' decisions. Every reply is checked; a bad one is an error naming the key,
//! never a panic.

use std::time::Duration;

use redis::Value;
use sluice_core::{Allowed, Decision, Denied, InsufficientCapacity, Nanos};

use super::pipeline::ItemPlan;
use crate::node_entry::NodeNames;
use crate::{FlushItem, FlushOutcome, NodeEntry, Presence, StoreError};

fn as_u64(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) => u64::try_from(*i).ok(),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

fn as_str(v: &Value) -> Option<&str> {
    match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

fn parse_entries(v: &Value, names: &mut NodeNames) -> Option<Vec<NodeEntry>> {
    // Every field and value must be text, or the reply is not entries at all. An entry
    // someone else wrote in another shape is skipped, not fatal; past `MAX_ENTRIES` the rest
    // are not kept (their counts are in the total all the same, and the engine takes counts
    // no entry accounts for as one group).
    let mut entries = Vec::new();
    let mut take = |n: &Value, e: &Value| {
        let (n, e) = (as_str(n)?, as_str(e)?);
        if entries.len() < MAX_ENTRIES
            && let Some(entry) = NodeEntry::decode(n, e, names)
        {
            entries.push(entry);
        }
        Some(())
    };
    match v {
        Value::Array(flat) => {
            for pair in flat.chunks(2) {
                let [n, e] = pair else { return None };
                take(n, e)?;
            }
        }
        Value::Map(pairs) => {
            for (n, e) in pairs {
                take(n, e)?;
            }
        }
        _ => return None,
    }
    Some(entries)
}

/// The most instance entries kept from one key's reply: far more than a fleet has, so that a
/// hash someone filled with fields cannot make each flush keep millions of entries.
pub(crate) const MAX_ENTRIES: usize = 256;

/// One item's outcome from the pipeline's replies. Only a failed `INCRBY` fails the item
/// (nothing was added); a bad previous total or bad entries make the answer poorer, never
/// the item failed, so no count is ever sent twice.
pub(crate) fn read_item(
    item: &FlushItem,
    plan: &ItemPlan,
    replies: &[Result<Value, StoreError>],
    names: &mut NodeNames,
) -> Result<FlushOutcome, StoreError> {
    let bad = |detail: String| StoreError::BadReply {
        key: item.key.to_string(),
        detail,
    };
    let total = match replies.get(plan.incr) {
        Some(Ok(v)) => {
            as_u64(v).ok_or_else(|| bad(format!("window total is not a count: {v:?}")))?
        }
        // A moved slot or a demoted master is told as such (the caller looks the store up
        // again); any other refusal of the `INCRBY` is this key's bad data.
        Some(Err(e)) if e.is_topology_change() || e.is_unavailable() => return Err(e.clone()),
        Some(Err(e)) => return Err(bad(e.to_string())),
        None => return Err(bad("no reply".into())),
    };
    let previous_total = plan.previous.and_then(|i| match replies.get(i) {
        Some(Ok(Value::Nil)) => Some(0),
        Some(Ok(v)) => as_u64(v),
        _ => None,
    });
    let entries = plan
        .entries
        .and_then(|i| match replies.get(i) {
            Some(Ok(v)) => parse_entries(v, names),
            _ => None,
        })
        .unwrap_or_default();
    Ok(FlushOutcome {
        total,
        previous_total,
        entries,
    })
}

pub(crate) fn parse_time(v: &Value) -> Option<Nanos> {
    let Value::Array(parts) = v else { return None };
    let secs = as_u64(parts.first()?)?;
    let micros = as_u64(parts.get(1)?)?;
    secs.checked_mul(1_000_000_000)?
        .checked_add(micros.checked_mul(1000)?)
}

/// The announce script's reply: `{live, seconds, microseconds}`. The live count is taken as
/// at most [`MAX_FLEET`] whatever the store says.
pub(crate) fn parse_presence(v: &Value) -> Option<Presence> {
    let Value::Array(parts) = v else { return None };
    let [live, secs, micros] = parts.as_slice() else {
        return None;
    };
    let live = as_u64(live)?.min(MAX_FLEET);
    let time = Value::Array(vec![secs.clone(), micros.clone()]);
    Some(Presence {
        live,
        store_time: parse_time(&time)?,
    })
}

/// The most instances a fleet is taken to have (a reply claiming more is capped).
pub(crate) const MAX_FLEET: u64 = 10_000;

pub(crate) fn parse_exact(key: &str, v: &Value, cost: u64) -> Result<Decision, StoreError> {
    let bad = |detail: String| StoreError::BadReply {
        key: key.to_owned(),
        detail,
    };
    let Value::Array(parts) = v else {
        return Err(bad(format!(
            "expected an array from the exact script, got {v:?}"
        )));
    };
    let nums: Vec<u64> = parts
        .iter()
        .map(as_u64)
        .collect::<Option<_>>()
        .ok_or_else(|| bad(format!("non-numeric reply {parts:?}")))?;
    let [code, remaining, reset_us, retry_us] = nums.as_slice() else {
        return Err(bad(format!("expected 4 numbers, got {}", nums.len())));
    };
    Ok(match code {
        0 => Decision::Allowed(Allowed {
            remaining: *remaining,
            reset_after: Duration::from_micros(*reset_us),
            delay: Duration::ZERO,
        }),
        1 => Decision::Denied(Denied {
            retry_after: Duration::from_micros(*retry_us),
            reset_after: Duration::from_micros(*reset_us),
        }),
        2 => Decision::InsufficientCapacity(InsufficientCapacity {
            cost,
            capacity: *remaining,
        }),
        other => return Err(bad(format!("unknown decision code {other}"))),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_presence_reply_is_read_capped_and_anything_else_refused() {
        let reply = |live: i64| {
            Value::Array(vec![
                Value::Int(live),
                Value::BulkString(b"1700000000".to_vec()),
                Value::BulkString(b"250000".to_vec()),
            ])
        };
        let p = parse_presence(&reply(3)).unwrap();
        assert_eq!(p.live, 3);
        assert_eq!(p.store_time, 1_700_000_000_250_000_000);
        assert_eq!(parse_presence(&reply(1 << 40)).unwrap().live, MAX_FLEET);
        assert!(parse_presence(&reply(-1)).is_none());
        assert!(parse_presence(&Value::Array(vec![Value::Int(3)])).is_none());
        assert!(parse_presence(&Value::Int(3)).is_none());
    }

    #[test]
    fn entries_share_the_instance_names_of_one_flush_and_odd_ones_are_skipped() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let reply = |others: &str| {
            Value::Array(vec![
                bulk("node-a"),
                bulk("3:1000:250"),
                bulk("node-b"),
                bulk(others),
            ])
        };
        let mut names = NodeNames::default();
        let first = parse_entries(&reply("5:1001:0"), &mut names).unwrap();
        let second = parse_entries(&reply("not:an:entry:at:all"), &mut names).unwrap();
        assert_eq!(
            first,
            vec![
                NodeEntry {
                    node: "node-a".into(),
                    count: 3,
                    at_ms: 1000,
                    rate_milli: 250
                },
                NodeEntry {
                    node: "node-b".into(),
                    count: 5,
                    at_ms: 1001,
                    rate_milli: 0
                },
            ]
        );
        // The second key's `node-a` is the same allocation; its odd entry is left out.
        assert_eq!(second.len(), 1);
        assert!(Arc::ptr_eq(&first[0].node, &second[0].node));
        // A hash filled with fields: the first MAX_ENTRIES are kept.
        let many: Vec<Value> = (0..MAX_ENTRIES + 100)
            .flat_map(|i| {
                [
                    Value::BulkString(format!("n{i}").into_bytes()),
                    Value::BulkString(b"1:1000:0".to_vec()),
                ]
            })
            .collect();
        let kept = parse_entries(&Value::Array(many), &mut names).unwrap();
        assert_eq!(kept.len(), MAX_ENTRIES);
        // A reply that is not a list of pairs is no entries at all.
        assert_eq!(parse_entries(&Value::Int(3), &mut names), None);
        let mut encoded = String::new();
        first[1].encode_into(&mut encoded);
        assert_eq!(encoded, "5:1001:0");
    }
}
