//! Settling a flush whose outcome is unknown. Per transaction of the flush (recomputed from
//! the items, as sent), one fencing transaction: if this instance's counters are as the store
//! last knew them, the lost transaction has not been applied, and rewriting them with their
//! values moves their revisions on so it never can be (its compare now fails); if they moved,
//! it was applied, and its marker says so.

use futures_util::future::join_all;

use super::EtcdStore;
use super::flush::{parse_count, range_at};
use super::layout::{Group, counter_key, group, transactions};
use super::proto::{Compare, RequestOp, TxnRequest};
use super::state::Own;
use crate::{FlushItem, FlushReceipt, StoreError};

impl EtcdStore {
    pub(super) async fn landed_all(
        &self,
        items: &[FlushItem],
        receipt: &FlushReceipt,
    ) -> Result<Vec<Option<bool>>, StoreError> {
        // No flush runs meanwhile: the fence must see the counters as the lost one left them.
        let _one_at_a_time = self.flushing.lock().await;
        let groups = group(items);
        let chunks = transactions(&groups, self.keys_per_txn);
        let settled = join_all(
            chunks
                .iter()
                .map(|chunk| self.settle_chunk(chunk, items, receipt)),
        )
        .await;
        let mut out = vec![None; items.len()];
        for (chunk, arrived) in chunks.iter().zip(settled) {
            let arrived = arrived.ok();
            for g in chunk.iter() {
                for &i in &g.items {
                    out[i] = arrived;
                }
            }
        }
        Ok(out)
    }

    async fn settle_chunk(
        &self,
        chunk: &[Group],
        items: &[FlushItem],
        receipt: &FlushReceipt,
    ) -> Result<bool, StoreError> {
        match self.settle_once(chunk, items, receipt).await {
            // A lease that expired while etcd was away: nothing was applied; take a new one.
            Err(StoreError::Refused(m)) if m.contains("lease not found") => {
                self.leases.forget().await;
                self.settle_once(chunk, items, receipt).await
            }
            other => other,
        }
    }

    async fn settle_once(
        &self,
        chunk: &[Group],
        items: &[FlushItem],
        receipt: &FlushReceipt,
    ) -> Result<bool, StoreError> {
        let marker = receipt.marker_key(&items[chunk[0].items[0]]).into_bytes();
        let mut txn = TxnRequest::default();
        let mut fenced = Vec::new();
        for g in chunk.iter().filter(|g| g.delta > 0) {
            let key = counter_key(&g.prefix, &self.instance);
            let lease = self.leases.for_ttl(&self.client, g.ttl).await?;
            let (value, compare) = match self.owned.get(&key) {
                Some(own) => (own.value, Compare::written_at(key.clone(), own.revision)),
                None => (0, Compare::absent(key.clone())),
            };
            txn.compare.push(compare);
            txn.success.push(RequestOp::put(
                key.clone(),
                value.to_string().into_bytes(),
                lease,
            ));
            fenced.push((key, value, g.ttl));
        }
        let read = RequestOp::range(marker, Vec::new(), 1);
        let at = txn.success.len();
        txn.success.push(read.clone());
        txn.failure.push(read);
        let reply = self.client.txn(txn).await?;
        if reply.succeeded {
            let revision = reply.header.as_ref().map_or(0, |h| h.revision);
            let now = self.clock.now();
            for (key, value, ttl) in fenced {
                let ttl = u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX);
                let own = Own {
                    value,
                    revision,
                    expires_at: now.saturating_add(ttl),
                };
                self.owned.set(key, own, now);
            }
        } else {
            // The counters moved: the next flush reads them back (its compare fails once).
            for (key, _, _) in &fenced {
                self.owned.forget(key);
            }
        }
        let at = if reply.succeeded { at } else { 0 };
        let marker = range_at(&reply, at).ok_or_else(|| StoreError::BadReply {
            key: receipt.owner.to_string(),
            detail: "etcd's reply has no marker read".into(),
        })?;
        Ok(marker
            .first()
            .and_then(|kv| parse_count(&kv.value))
            .is_some_and(|token| token == receipt.token))
    }
}
