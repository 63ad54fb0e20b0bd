//! Redis Cluster slots: which master serves a key, read from `CLUSTER SLOTS`.

use std::collections::BTreeMap;

use redis::Value;

use crate::{FlushItem, StoreError};

/// The number of hash slots of a Redis Cluster.
const SLOTS: u16 = 16384;

/// (first slot, last slot, host, port) of each master.
pub(crate) type SlotMap = Vec<(u16, u16, String, u16)>;

/// Item indexes per master (host, port), in the items' order.
pub(super) type NodeGroups = BTreeMap<(String, u16), Vec<usize>>;

/// The cluster slot of a key: CRC16 (XMODEM) of its hash tag, mod 16384, as the Redis Cluster
/// specification defines it. redis-rs computes this too but does not export it.
pub(super) fn slot_of(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let close = bytes[open + 1..].iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &bytes[open + 1..open + 1 + close])
    });
    let mut crc: u16 = 0;
    for &b in tagged.unwrap_or(bytes) {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc & (SLOTS - 1)
}

/// Reads a `CLUSTER SLOTS` reply. Every range must be `[first, last, [host, port, ...], ...]`
/// with `first <= last < 16384` and a port in 1..=65535: a reply out of range is refused
/// whole (it would send counts to the wrong node), never truncated into range.
pub(crate) fn parse_slots(reply: &Value) -> Result<SlotMap, StoreError> {
    let bad = |detail: String| StoreError::BadReply {
        key: "CLUSTER SLOTS".into(),
        detail,
    };
    let Value::Array(ranges) = reply else {
        return Err(bad(format!(
            "expected an array of slot ranges, got {reply:?}"
        )));
    };
    let slot = |v: Option<&Value>| match v {
        Some(Value::Int(n)) => u16::try_from(*n).ok().filter(|s| *s < SLOTS),
        _ => None,
    };
    let mut map = SlotMap::with_capacity(ranges.len());
    for range in ranges {
        let Value::Array(parts) = range else {
            return Err(bad(format!("a slot range is not an array: {range:?}")));
        };
        let (Some(first), Some(last)) = (slot(parts.first()), slot(parts.get(1))) else {
            return Err(bad(format!("slot numbers out of 0..16384 in {parts:?}")));
        };
        if first > last {
            return Err(bad(format!("slot range {first}..{last} is reversed")));
        }
        let Some(Value::Array(master)) = parts.get(2) else {
            return Err(bad(format!("slot range {first}..{last} has no master")));
        };
        let host = match master.first() {
            Some(Value::BulkString(h)) => String::from_utf8_lossy(h).into_owned(),
            Some(Value::SimpleString(h)) => h.clone(),
            other => return Err(bad(format!("master host is not a string: {other:?}"))),
        };
        let port = match master.get(1) {
            Some(Value::Int(p)) => u16::try_from(*p).ok().filter(|p| *p > 0),
            _ => None,
        };
        let Some(port) = port else {
            return Err(bad(format!("master port out of range in {master:?}")));
        };
        map.push((first, last, host, port));
    }
    Ok(map)
}

/// The items' indexes per master, and the items whose slot no master serves, with the slot.
pub(super) fn group_by_node(map: &SlotMap, items: &[FlushItem]) -> (NodeGroups, Vec<(usize, u16)>) {
    let mut by_node = NodeGroups::new();
    let mut unserved = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let slot = slot_of(&item.key);
        match map.iter().find(|(a, b, _, _)| (*a..=*b).contains(&slot)) {
            Some((_, _, host, port)) => by_node.entry((host.clone(), *port)).or_default().push(i),
            None => unserved.push((i, slot)),
        }
    }
    (by_node, unserved)
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::{parse_slots, slot_of};

    #[test]
    fn slots_match_the_cluster_specification() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(slot_of("123456789"), 0x31c3 & 0x3fff);
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(slot_of("{user1000}.following"), slot_of("user1000"));
        // Redis's own examples: an empty tag hashes the whole key; only the first `{...}`
        // counts, whatever it holds (slots computed with CRC16/XMODEM, as Redis does).
        assert_eq!(slot_of("foo{}{bar}"), 8363);
        assert_eq!(slot_of("foo{{bar}}zap"), 4015);
        assert_eq!(slot_of("{bar"), 4015);
        assert_eq!(slot_of("foo{bar}{zap}"), 5061);
        assert_eq!(slot_of("bar"), 5061);
    }

    fn range(first: i64, last: i64, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(first),
            Value::Int(last),
            Value::Array(vec![
                Value::BulkString(b"10.0.0.1".to_vec()),
                Value::Int(port),
            ]),
        ])
    }

    #[test]
    fn slot_replies_out_of_range_are_refused_not_truncated() {
        let good = Value::Array(vec![range(0, 8191, 7000), range(8192, 16383, 7001)]);
        assert_eq!(
            parse_slots(&good).unwrap(),
            vec![
                (0, 8191, "10.0.0.1".to_owned(), 7000),
                (8192, 16383, "10.0.0.1".to_owned(), 7001)
            ]
        );
        // 65536 + 5 would have become slot 5 and port 70000 port 4464 with `as u16`.
        for bad in [
            range(0, 65541, 7000),
            range(-1, 10, 7000),
            range(10, 5, 7000),
            range(0, 100, 70000),
            range(0, 100, 0),
            Value::Int(3),
        ] {
            let reply = match bad {
                Value::Int(_) => bad,
                r => Value::Array(vec![r]),
            };
            let error = parse_slots(&reply).unwrap_err().to_string();
            assert!(error.contains("CLUSTER SLOTS"), "{error}");
        }
    }
}
