//! The flush as one pipeline of plain commands per store node.

use std::time::Duration;

use crate::{FlushItem, FlushReceipt};

/// Where one item's replies are in the flush pipeline.
pub(crate) struct ItemPlan {
    pub(super) incr: usize,
    pub(super) previous: Option<usize>,
    pub(super) entries: Option<usize>,
}

/// The flush as plain pipelined commands (no script: per-key Lua calls cost Redis several
/// times more than the commands themselves). Per item: `INCRBY` the window counter; on this
/// instance's first write of the key in the window, `PEXPIRE` it (two windows); `GET` the
/// previous window's total when asked; for the predictive policy `HSET` this instance's entry
/// (with its `PEXPIRE` on first write) and `HGETALL` the entries. Then the receipt's marker
/// (`SET ... PX`, after every count), and `TIME` last, when asked. Every command names one key,
/// so a Cluster node takes any mix of its own slots.
pub(crate) fn flush_pipeline(
    items: &[&FlushItem],
    receipt: Option<&FlushReceipt>,
    with_time: bool,
) -> (redis::Pipeline, Vec<ItemPlan>, usize) {
    use std::fmt::Write as _;
    // Up to six commands per item; each command's buffers are sized once (redis-rs would
    // grow them argument by argument: several allocations per command).
    let mut pipe = redis::Pipeline::with_capacity(items.len() * 3 + 2);
    pipe.ignore_errors();
    let mut n = 0;
    let mut plans = Vec::with_capacity(items.len());
    // Key names and entries are written into these and copied into each command's own buffer:
    // no allocation per key here (the flush's cost is per key; a shared key takes 3 commands).
    let mut counter = String::with_capacity(128);
    let mut other = String::with_capacity(128);
    let mut add = |pipe: &mut redis::Pipeline, args: &[&[u8]]| {
        let bytes = args.iter().map(|a| a.len()).sum();
        let mut cmd = redis::Cmd::with_capacity(args.len(), bytes);
        for a in args {
            cmd.arg(*a);
        }
        pipe.add_command(cmd);
        n += 1;
        n - 1
    };
    let mut number = itoa::Buffer::new();
    let mut number2 = itoa::Buffer::new();
    for item in items {
        counter.clear();
        let _ = write!(counter, "{}:{}", item.key, item.window);
        let ttl_ms = number2.format(whole_ms(item.ttl)).as_bytes();
        let incr = add(
            &mut pipe,
            &[
                b"INCRBY",
                counter.as_bytes(),
                number.format(item.delta).as_bytes(),
            ],
        );
        if item.first_write {
            add(&mut pipe, &[b"PEXPIRE", counter.as_bytes(), ttl_ms]);
        }
        let previous = item.want_previous.then(|| {
            other.clear();
            let _ = write!(other, "{}:{}", item.key, item.window.saturating_sub(1));
            add(&mut pipe, &[b"GET", other.as_bytes()])
        });
        let entries = item.entry.as_ref().map(|e| {
            counter.push_str(":n");
            other.clear();
            e.encode_into(&mut other);
            let node = e.node.as_bytes();
            add(
                &mut pipe,
                &[b"HSET", counter.as_bytes(), node, other.as_bytes()],
            );
            if item.first_write {
                add(&mut pipe, &[b"PEXPIRE", counter.as_bytes(), ttl_ms]);
            }
            add(&mut pipe, &[b"HGETALL", counter.as_bytes()])
        });
        plans.push(ItemPlan {
            incr,
            previous,
            entries,
        });
    }
    if let (Some(receipt), Some(first)) = (receipt, items.first()) {
        let longest = items.iter().map(|i| i.ttl).max().unwrap_or_default();
        let marker = receipt.marker_key(first);
        add(
            &mut pipe,
            &[
                b"SET",
                marker.as_bytes(),
                number.format(receipt.token).as_bytes(),
                b"PX",
                number2.format(whole_ms(longest)).as_bytes(),
            ],
        );
    }
    if with_time {
        add(&mut pipe, &[b"TIME"]);
    }
    (pipe, plans, n)
}

/// A TTL in whole milliseconds for `PEXPIRE`/`PX`: at least 1 (0 is refused).
fn whole_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// The bytes a flush of `items` sends to a standalone server (`TIME` included), for benches:
/// written to a plain socket with the replies left unparsed, they give the floor no client can
/// flush under (the server's own time for the same commands).
#[doc(hidden)]
pub fn packed_flush(items: &[FlushItem], receipt: Option<&FlushReceipt>) -> Vec<u8> {
    let refs: Vec<&FlushItem> = items.iter().collect();
    flush_pipeline(&refs, receipt, true).0.get_packed_pipeline()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NodeEntry;

    #[test]
    fn the_pipeline_sends_what_redis_commands_counts() {
        let entry = NodeEntry {
            node: "a".into(),
            count: 3,
            at_ms: 1,
            rate_milli: 2,
        };
        for first_write in [false, true] {
            for want_previous in [false, true] {
                for entry in [None, Some(entry.clone())] {
                    let item = FlushItem {
                        key: "k".into(),
                        window: 5,
                        delta: 1,
                        ttl: Duration::from_secs(2),
                        entry,
                        want_previous,
                        first_write,
                    };
                    let (_, _, n) = flush_pipeline(&[&item], None, false);
                    assert_eq!(n as u64, item.redis_commands(), "{item:?}");
                }
            }
        }
    }
}
