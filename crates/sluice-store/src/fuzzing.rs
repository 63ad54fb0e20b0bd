//! Entry points for the fuzz targets (`fuzz/`): the Redis reply decoders run on replies a
//! hostile or broken server could send. Hidden from the docs; not a public API.

use std::sync::Arc;
use std::time::Duration;

use redis::Value;

use crate::StoreError;
use crate::redis::slots::parse_slots;
use crate::redis::{
    NodeNames, flush_pipeline, map_server_error, parse_exact, parse_presence, parse_time, read_item,
};
use crate::{FlushItem, NodeEntry};

/// Decodes `resp` (RESP2 or RESP3 bytes) as every reply Sluice reads from Redis: a flush
/// pipeline's replies (totals, previous totals, per-instance entries), an exact-mode script
/// reply, `TIME` and `CLUSTER SLOTS`. Any outcome is fine except a panic or an endless loop.
pub fn decode_replies(resp: &[u8]) {
    let Ok(reply) = redis::parse_redis_value(resp) else {
        return;
    };
    let _ = parse_time(&reply);
    let _ = parse_presence(&reply);
    let _ = parse_exact("fuzz", &reply, 3);
    let _ = parse_slots(&reply);
    // The reply as a whole pipeline's replies, read back for items with and without entries.
    let as_reply = |v: &Value| match v {
        Value::ServerError(e) => Err(map_server_error(e)),
        v => Ok(v.clone()),
    };
    let replies: Vec<Result<Value, StoreError>> = match &reply {
        Value::Array(parts) => parts.iter().map(as_reply).collect(),
        other => vec![as_reply(other)],
    };
    let entry = NodeEntry {
        node: Arc::from("fuzz-1"),
        count: 2,
        at_ms: 1_800_000_000_000,
        rate_milli: 1500,
    };
    let items = [
        item(None, false, true),
        item(Some(entry.clone()), true, false),
        item(Some(entry), true, true),
    ];
    let refs: Vec<&FlushItem> = items.iter().collect();
    let (_, plans, commands) = flush_pipeline(&refs, None, true);
    assert!(commands > 0);
    let mut names = NodeNames::default();
    for (item, plan) in items.iter().zip(&plans) {
        let _ = read_item(item, plan, &replies, &mut names);
    }
}

fn item(entry: Option<NodeEntry>, want_previous: bool, first_write: bool) -> FlushItem {
    FlushItem {
        key: Arc::from("sluice:{d/user\u{1f}alice}"),
        window: 7,
        delta: 1,
        ttl: Duration::from_secs(120),
        entry,
        want_previous,
        first_write,
    }
}

/// Decodes `bytes` as an etcd transaction reply and reads it as the etcd store does: a flush's
/// totals, previous totals and entries, a failed compare's counter, the live-instance count.
/// Any outcome is fine except a panic or an endless loop.
pub fn decode_etcd_reply(bytes: &[u8]) {
    crate::etcd::fuzz_reply(bytes);
}
