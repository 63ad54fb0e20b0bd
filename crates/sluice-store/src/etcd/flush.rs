//! A flush over etcd: items merged per (key, window), sent as compare-and-set transactions of
//! up to `keys_per_txn` groups each, all at once.

use std::collections::HashMap;

use futures_util::future::join_all;

use super::EtcdStore;
use super::layout::{
    Group, MAX_KEYS_PER_WINDOW, counter_key, counters_prefix, encode_entry, entry_key, group,
    prefix_end, transactions, window_prefix,
};
use super::proto::{Compare, KeyValue, RequestOp, Response, TxnRequest, TxnResponse};
use super::state::Own;
use crate::node_entry::NodeNames;
use crate::{FlushItem, FlushOutcome, FlushReceipt, FlushReply, StoreError};

/// How often a transaction is sent again after its compare failed (the store's idea of its own
/// counter was stale: another flush of the same key went first, or a lost one landed).
const MAX_ATTEMPTS: usize = 4;

/// The most instance entries kept per key from one reply.
const MAX_ENTRIES: usize = 256;

/// A counter a transaction sets: its etcd key, the value, and its group in the chunk.
struct Write {
    key: Vec<u8>,
    value: u64,
    group: usize,
}

/// What one group's operations are, by position in the transaction's reply.
pub(crate) struct Ops {
    pub window: usize,
    pub previous: Option<usize>,
}

impl EtcdStore {
    pub(super) async fn flush_all(
        &self,
        items: &[FlushItem],
        receipt: Option<&FlushReceipt>,
    ) -> Result<FlushReply, StoreError> {
        let groups = group(items);
        let chunks = transactions(&groups, self.keys_per_txn);
        let replies = join_all(
            chunks
                .iter()
                .map(|chunk| self.flush_chunk(chunk, items, receipt)),
        )
        .await;
        let mut results: Vec<Result<FlushOutcome, StoreError>> =
            vec![Err(StoreError::Unavailable("not sent".into())); items.len()];
        let mut all_failed = None;
        for (chunk, reply) in chunks.iter().zip(replies) {
            match reply {
                Ok(outcomes) => {
                    for (g, outcome) in chunk.iter().zip(outcomes) {
                        for &i in &g.items {
                            results[i] = outcome.clone().map(|mut o| {
                                if items[i].entry.is_none() {
                                    o.entries.clear();
                                }
                                if !items[i].want_previous {
                                    o.previous_total = None;
                                }
                                o
                            });
                        }
                    }
                }
                Err(e) => {
                    for g in chunk.iter() {
                        for &i in &g.items {
                            results[i] = Err(e.clone());
                        }
                    }
                    all_failed.get_or_insert(e);
                }
            }
        }
        if tracing::enabled!(tracing::Level::TRACE) {
            for (item, result) in items.iter().zip(&results) {
                match result {
                    Ok(o) => {
                        tracing::trace!(instance = %self.instance, clock_ms = self.clock.now() / 1_000_000, key = %item.key, window = item.window, delta = item.delta, total = o.total, entries = o.entries.len(), "etcd flush item")
                    }
                    Err(e) => {
                        tracing::trace!(instance = %self.instance, key = %item.key, window = item.window, delta = item.delta, error = %e, "etcd flush item failed")
                    }
                }
            }
        }
        // The whole flush failed the same way: say so once, as a Redis pipeline would.
        if let Some(e) = all_failed
            && results.iter().all(Result::is_err)
            && !items.is_empty()
        {
            return Err(e);
        }
        Ok(FlushReply {
            results,
            store_time: None,
            round_trips: chunks.len(),
        })
    }

    /// One transaction (sent again while its compare fails): per group, the counter's
    /// compare-and-set, the entries, the window's read and the previous window's counters;
    /// then the receipt's marker.
    async fn flush_chunk(
        &self,
        chunk: &[Group],
        items: &[FlushItem],
        receipt: Option<&FlushReceipt>,
    ) -> Result<Vec<Result<FlushOutcome, StoreError>>, StoreError> {
        let mut lease_forgotten = false;
        let mut attempt = 0;
        loop {
            let leases = self.leases_for(chunk).await?;
            let (txn, ops, writes) = self.build(chunk, items, receipt, &leases);
            let reply = match self.client.txn(txn).await {
                Err(StoreError::Refused(m))
                    if m.contains("lease not found") && !lease_forgotten =>
                {
                    // A lease expired while this store was cut off: nothing was applied.
                    lease_forgotten = true;
                    self.leases.forget().await;
                    continue;
                }
                other => other?,
            };
            if reply.succeeded {
                return Ok(self.read_success(chunk, &reply, &ops, &writes));
            }
            self.read_failure(chunk, &reply, &writes)?;
            attempt += 1;
            if attempt >= MAX_ATTEMPTS {
                return Err(StoreError::Refused(format!(
                    "etcd: this instance's counters changed under {MAX_ATTEMPTS} transactions in a row"
                )));
            }
        }
    }

    async fn leases_for(&self, chunk: &[Group]) -> Result<HashMap<u128, i64>, StoreError> {
        let mut leases = HashMap::new();
        for g in chunk {
            let ttl = g.ttl.as_nanos();
            if let std::collections::hash_map::Entry::Vacant(v) = leases.entry(ttl) {
                v.insert(self.leases.for_ttl(&self.client, g.ttl).await?);
            }
        }
        Ok(leases)
    }

    /// The transaction, where each group's reads are in its reply, and the counters it writes
    /// (etcd key, the value it sets, its group).
    fn build(
        &self,
        chunk: &[Group],
        items: &[FlushItem],
        receipt: Option<&FlushReceipt>,
        leases: &HashMap<u128, i64>,
    ) -> (TxnRequest, Vec<Ops>, Vec<Write>) {
        let mut txn = TxnRequest::default();
        let mut ops = Vec::with_capacity(chunk.len());
        let mut writes = Vec::new();
        for (gi, g) in chunk.iter().enumerate() {
            let lease = leases[&g.ttl.as_nanos()];
            if g.delta > 0 {
                let key = counter_key(&g.prefix, &self.instance);
                let (value, compare) = match self.owned.get(&key) {
                    Some(own) => (
                        own.value.saturating_add(g.delta),
                        Compare::written_at(key.clone(), own.revision),
                    ),
                    None => (g.delta, Compare::absent(key.clone())),
                };
                txn.compare.push(compare);
                txn.success.push(RequestOp::put(
                    key.clone(),
                    value.to_string().into_bytes(),
                    lease,
                ));
                txn.failure
                    .push(RequestOp::range(key.clone(), Vec::new(), 1));
                writes.push(Write {
                    key,
                    value,
                    group: gi,
                });
            }
            for entry in &g.entries {
                txn.success.push(RequestOp::put(
                    entry_key(&g.prefix, &entry.node),
                    encode_entry(entry),
                    lease,
                ));
            }
            let window = txn.success.len();
            txn.success.push(RequestOp::range(
                g.prefix.clone(),
                prefix_end(&g.prefix),
                MAX_KEYS_PER_WINDOW,
            ));
            let previous = match (g.want_previous, g.window.checked_sub(1)) {
                (true, Some(w)) => {
                    let counters = counters_prefix(&window_prefix(&g.key, w));
                    let end = prefix_end(&counters);
                    txn.success
                        .push(RequestOp::range(counters, end, MAX_KEYS_PER_WINDOW));
                    Some(txn.success.len() - 1)
                }
                _ => None,
            };
            ops.push(Ops { window, previous });
        }
        if let (Some(receipt), Some(first)) = (receipt, chunk.first()) {
            let longest = chunk.iter().map(|g| g.ttl).max().unwrap_or_default();
            let lease = leases[&longest.as_nanos()];
            txn.success.push(RequestOp::put(
                receipt.marker_key(&items[first.items[0]]).into_bytes(),
                receipt.token.to_string().into_bytes(),
                lease,
            ));
        }
        (txn, ops, writes)
    }

    fn read_success(
        &self,
        chunk: &[Group],
        reply: &TxnResponse,
        ops: &[Ops],
        writes: &[Write],
    ) -> Vec<Result<FlushOutcome, StoreError>> {
        let revision = reply.header.as_ref().map_or(0, |h| h.revision);
        let now = self.clock.now();
        for Write { key, value, group } in writes {
            let ttl = u64::try_from(chunk[*group].ttl.as_nanos()).unwrap_or(u64::MAX);
            let own = Own {
                value: *value,
                revision,
                expires_at: now.saturating_add(ttl),
            };
            self.owned.set(key.clone(), own, now);
        }
        outcomes(chunk, reply, ops)
    }

    /// A failed compare: learn what this instance's counters hold.
    fn read_failure(
        &self,
        chunk: &[Group],
        reply: &TxnResponse,
        writes: &[Write],
    ) -> Result<(), StoreError> {
        let now = self.clock.now();
        for (i, Write { key, group, .. }) in writes.iter().enumerate() {
            let ttl = u64::try_from(chunk[*group].ttl.as_nanos()).unwrap_or(u64::MAX);
            let Some(kvs) = range_at(reply, i) else {
                return Err(StoreError::BadReply {
                    key: String::from_utf8_lossy(key).into_owned(),
                    detail: "etcd's reply to a failed compare has no counter read".into(),
                });
            };
            match kvs.first() {
                Some(kv) => {
                    let value = parse_count(&kv.value).ok_or_else(|| StoreError::BadReply {
                        key: String::from_utf8_lossy(key).into_owned(),
                        detail: "the counter is not a number".into(),
                    })?;
                    let own = Own {
                        value,
                        revision: kv.mod_revision,
                        expires_at: now.saturating_add(ttl),
                    };
                    self.owned.set(key.clone(), own, now);
                }
                None => self.owned.forget(key),
            }
        }
        Ok(())
    }
}

/// Each group's outcome from a successful transaction's reply (`ops`: where its reads are).
pub(crate) fn outcomes(
    chunk: &[Group],
    reply: &TxnResponse,
    ops: &[Ops],
) -> Vec<Result<FlushOutcome, StoreError>> {
    let mut names = NodeNames::default();
    chunk
        .iter()
        .zip(ops)
        .map(|(g, op)| {
            let bad = |detail: &str| StoreError::BadReply {
                key: g.key.to_string(),
                detail: detail.to_owned(),
            };
            let window = range_at(reply, op.window)
                .ok_or_else(|| bad("the window read is missing or holds more than 1024 keys"))?;
            let (total, entries) =
                sum_window(&g.prefix, window, &mut names).map_err(|detail| bad(&detail))?;
            let previous_total = match op.previous {
                Some(at) => {
                    let kvs = range_at(reply, at).ok_or_else(|| {
                        bad("the previous window read is missing or holds more than 1024 keys")
                    })?;
                    let prefix = window_prefix(&g.key, g.window - 1);
                    Some(sum_window(&prefix, kvs, &mut names).map_err(|d| bad(&d))?.0)
                }
                None => None,
            };
            Ok(FlushOutcome {
                total,
                previous_total,
                entries,
            })
        })
        .collect()
}

pub(crate) fn range_at(reply: &TxnResponse, at: usize) -> Option<&[KeyValue]> {
    match reply.responses.get(at)?.response.as_ref()? {
        Response::Range(range) if !range.more => Some(&range.kvs),
        _ => None,
    }
}

pub(crate) fn parse_count(value: &[u8]) -> Option<u64> {
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// The sum of a window's counters and its entries. A counter that is not a number is a bad
/// reply for the key (someone else wrote there), not a zero.
fn sum_window(
    prefix: &[u8],
    kvs: &[KeyValue],
    names: &mut NodeNames,
) -> Result<(u64, Vec<crate::NodeEntry>), String> {
    let mut total = 0u64;
    let mut entries = Vec::new();
    for kv in kvs {
        let Some(rest) = kv.key.strip_prefix(prefix) else {
            continue;
        };
        if rest.starts_with(b"c/") {
            let count = parse_count(&kv.value).ok_or("a counter is not a number")?;
            total = total.saturating_add(count);
        } else if let Some(node) = rest.strip_prefix(b"e/") {
            let node = std::str::from_utf8(node).map_err(|_| "an entry's node is not UTF-8")?;
            let value = std::str::from_utf8(&kv.value).map_err(|_| "an entry is not UTF-8")?;
            let entry = crate::NodeEntry::decode(node, value, names)
                .ok_or_else(|| format!("entry of `{node}` is not count:at_ms:rate"))?;
            // As many as the Redis store keeps: more are someone else's writes.
            if entries.len() < MAX_ENTRIES {
                entries.push(entry);
            }
        }
    }
    Ok((total, entries))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::proto::{RangeResponse, ResponseOp};

    fn range(kvs: &[(&[u8], &[u8])], more: bool) -> ResponseOp {
        ResponseOp {
            response: Some(Response::Range(RangeResponse {
                header: None,
                kvs: kvs
                    .iter()
                    .map(|(k, v)| KeyValue {
                        key: k.to_vec(),
                        mod_revision: 3,
                        version: 1,
                        value: v.to_vec(),
                    })
                    .collect(),
                more,
                count: 0,
            })),
        }
    }

    #[test]
    fn a_reply_is_summed_per_window_and_hostile_values_are_bad_replies_not_zeros() {
        let item = |key: &str, window, previous| FlushItem {
            key: key.into(),
            window,
            delta: 1,
            ttl: std::time::Duration::from_secs(60),
            entry: None,
            want_previous: previous,
            first_write: false,
        };
        let items = [
            item("ka", 5, true),
            item("kb", 2, false),
            item("kc", 2, false),
        ];
        let groups = group(&items);
        let p = window_prefix("ka", 5);
        let q = window_prefix("ka", 4);
        let key = |prefix: &[u8], rest: &str| [prefix, rest.as_bytes()].concat();
        let (c1, c2, e1, prev) = (
            key(&p, "c/1"),
            key(&p, "c/2"),
            key(&p, "e/n1"),
            key(&q, "c/1"),
        );
        let b = window_prefix("kb", 2);
        let huge = key(&b, "c/1");
        let huge2 = key(&b, "c/2");
        let reply = TxnResponse {
            header: None,
            succeeded: true,
            responses: vec![
                range(
                    &[(&c1, b"5"), (&c2, b"7"), (&e1, b"4:1800000000000:1500")],
                    false,
                ),
                range(&[(&prev, b"3")], false),
                range(
                    &[
                        (&huge, b"18446744073709551615"),
                        (&huge2, b"18446744073709551615"),
                    ],
                    false,
                ),
                range(&[(&key(&window_prefix("kc", 2), "c/1"), b"x")], false),
            ],
        };
        let ops = [
            Ops {
                window: 0,
                previous: Some(1),
            },
            Ops {
                window: 2,
                previous: None,
            },
            Ops {
                window: 3,
                previous: None,
            },
        ];
        let out = outcomes(&groups, &reply, &ops);
        let a = out[0].as_ref().unwrap();
        assert_eq!(
            (a.total, a.previous_total, a.entries.len()),
            (12, Some(3), 1)
        );
        assert_eq!(out[1].as_ref().unwrap().total, u64::MAX, "saturates");
        crate::etcd::tests::assert_bad(&out[2], "kc", "not a number");
        // A read cut short (`more`) is refused rather than summed in part.
        let short = TxnResponse {
            responses: vec![range(&[(&c1, b"5")], true)],
            ..reply
        };
        let out = outcomes(&groups[..1], &short, &ops[..1]);
        crate::etcd::tests::assert_bad(&out[0], "ka", "more than 1024");
    }
}
