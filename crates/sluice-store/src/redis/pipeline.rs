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
    let mut cmds = Commands::with_capacity(items.len() * 3 + 2);
    let mut scratch = Scratch::default();
    let plans = items
        .iter()
        .map(|item| push_item(&mut cmds, &mut scratch, item))
        .collect();
    if let (Some(receipt), Some(first)) = (receipt, items.first()) {
        let longest = items.iter().map(|i| i.ttl).max().unwrap_or_default();
        let marker = receipt.marker_key(first);
        cmds.add(&[
            b"SET",
            marker.as_bytes(),
            scratch.number.format(receipt.token).as_bytes(),
            b"PX",
            scratch.number2.format(whole_ms(longest)).as_bytes(),
        ]);
    }
    if with_time {
        cmds.add(&[b"TIME"]);
    }
    (cmds.pipe, plans, cmds.n)
}

/// The pipeline being built and how many commands it holds.
struct Commands {
    pipe: redis::Pipeline,
    n: usize,
}

impl Commands {
    fn with_capacity(capacity: usize) -> Self {
        let mut pipe = redis::Pipeline::with_capacity(capacity);
        pipe.ignore_errors();
        Self { pipe, n: 0 }
    }

    /// Adds one command and returns its place. Each command's buffers are sized once
    /// (redis-rs would grow them argument by argument: several allocations per command).
    fn add(&mut self, args: &[&[u8]]) -> usize {
        let bytes = args.iter().map(|a| a.len()).sum();
        let mut cmd = redis::Cmd::with_capacity(args.len(), bytes);
        for a in args {
            cmd.arg(*a);
        }
        self.pipe.add_command(cmd);
        self.n += 1;
        self.n - 1
    }
}

/// Key names, entries and numbers are written into these and copied into each command's own
/// buffer: no allocation per key here (the flush's cost is per key; a shared key takes 3
/// commands).
struct Scratch {
    counter: String,
    other: String,
    number: itoa::Buffer,
    number2: itoa::Buffer,
}

impl Default for Scratch {
    fn default() -> Self {
        Self {
            counter: String::with_capacity(128),
            other: String::with_capacity(128),
            number: itoa::Buffer::new(),
            number2: itoa::Buffer::new(),
        }
    }
}

/// One item's commands (up to six), in the order [`flush_pipeline`] describes.
fn push_item(cmds: &mut Commands, s: &mut Scratch, item: &FlushItem) -> ItemPlan {
    use std::fmt::Write as _;
    s.counter.clear();
    let _ = write!(s.counter, "{}:{}", item.key, item.window);
    let ttl_ms = s.number2.format(whole_ms(item.ttl)).as_bytes();
    let incr = cmds.add(&[
        b"INCRBY",
        s.counter.as_bytes(),
        s.number.format(item.delta).as_bytes(),
    ]);
    if item.first_write {
        cmds.add(&[b"PEXPIRE", s.counter.as_bytes(), ttl_ms]);
    }
    let previous = item.want_previous.then(|| {
        s.other.clear();
        let _ = write!(s.other, "{}:{}", item.key, item.window.saturating_sub(1));
        cmds.add(&[b"GET", s.other.as_bytes()])
    });
    let entries = item.entry.as_ref().map(|e| {
        s.counter.push_str(":n");
        s.other.clear();
        e.encode_into(&mut s.other);
        let node = e.node.as_bytes();
        cmds.add(&[b"HSET", s.counter.as_bytes(), node, s.other.as_bytes()]);
        if item.first_write {
            cmds.add(&[b"PEXPIRE", s.counter.as_bytes(), ttl_ms]);
        }
        cmds.add(&[b"HGETALL", s.counter.as_bytes()])
    });
    ItemPlan {
        incr,
        previous,
        entries,
    }
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
