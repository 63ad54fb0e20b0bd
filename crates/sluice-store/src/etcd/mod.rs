//! The etcd v3 store (`store: etcd://h1:2379,h2:2379`): counters for `synced` mode through etcd
//! transactions, expiry through leases, and flush receipts. `exact` mode is not offered: it
//! would take one Raft-replicated transaction per request (configuration refuses it).
//!
//! Layout and increments: see [`layout`]. Each instance keeps its own counter per key and
//! window and sets it with a compare-and-set on the counter's revision, merged with the
//! window's read into one transaction; the total is the sum of the instances' counters. A
//! transaction that fails after it was sent is not repeated: its receipt marker, written in
//! the same transaction, tells later whether it landed, and a late arrival of the lost one is
//! refused by the compare (its revision is stale), so no count lands twice.
//!
//! etcd has no clock to read: the store's time is this instance's clock (keep instances'
//! clocks in sync with NTP, as for any etcd deployment).

mod client;
mod flush;
mod layout;
mod proto;
mod settle;
mod state;

use std::sync::Arc;
use std::time::Duration;

use sluice_config::EtcdTarget;
use sluice_core::{Clock, Decision, Nanos};

use crate::exact::ExactRequest;
use crate::{
    CounterStore, FlushItem, FlushReceipt, FlushReply, FlushTime, Presence, StoreError, StoreFuture,
};
use client::Client;
use layout::{FLEET_PREFIX, MAX_FLEET, prefix_end};
use proto::{RequestOp, Response, TxnRequest};
use state::{Leases, Owned};

/// How the etcd store connects.
#[derive(Clone, Debug)]
pub struct EtcdStoreOptions {
    /// Longest wait for one transaction (and for a connection).
    pub timeout: Duration,
    /// Groups of (key, window) per transaction: each costs up to four operations, and etcd
    /// refuses more than 128 per transaction by default (`--max-txn-ops`).
    pub keys_per_txn: usize,
    /// PEM root certificate(s) to trust for `etcds://` instead of the built-in web roots.
    pub tls_root_pem: Option<Vec<u8>>,
}

impl Default for EtcdStoreOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_millis(500),
            keys_per_txn: 31,
            tls_root_pem: None,
        }
    }
}

/// Counters in an etcd v3 cluster. See the module documentation for what it supports.
pub struct EtcdStore {
    client: Client,
    tls: bool,
    /// This store's counter name: unique per process, so a restarted instance never writes
    /// over (or needs to read) the counts of its previous life.
    instance: String,
    owned: Owned,
    leases: Leases,
    clock: Arc<dyn Clock>,
    keys_per_txn: usize,
    /// One flush at a time: two flushes of one key would race for its counter's revision and
    /// one would have to send its transaction again. A flush's own transactions run at once
    /// (they never share a counter).
    flushing: tokio::sync::Mutex<()>,
}

impl EtcdStore {
    /// A store for `target`; connects on first use. Call it within a Tokio runtime.
    ///
    /// etcd has no clock to read, so `clock` stands in for the store's: the instances sharing
    /// the store align their windows on it. Give it the host's system clock (kept by NTP,
    /// `sluice_core::StdClock`), not a TSC clock anchored once (`SystemClock`): a TSC
    /// calibrated on a busy machine was measured running 260 ppm fast, which put one
    /// instance's span flushes ahead of the others'. Each call's time is read when it is made.
    pub fn connect(
        target: &EtcdTarget,
        options: EtcdStoreOptions,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, StoreError> {
        let client = Client::new(target, options.tls_root_pem.as_deref(), options.timeout)?;
        let instance = format!("{}-{:x}", std::process::id(), clock.now());
        Ok(Self {
            client,
            tls: target.tls,
            instance,
            owned: Owned::default(),
            leases: Leases::new(clock.clone()),
            clock,
            keys_per_txn: options.keys_per_txn.clamp(1, 31),
            flushing: tokio::sync::Mutex::new(()),
        })
    }
}

impl CounterStore for EtcdStore {
    fn flush_timed<'a>(
        &'a self,
        items: &'a [FlushItem],
        receipt: Option<&'a FlushReceipt>,
        time: FlushTime,
    ) -> StoreFuture<'a, FlushReply> {
        Box::pin(async move {
            let one_at_a_time = self.flushing.lock().await;
            let sent = self.clock.now();
            let mut reply = self.flush_all(items, receipt).await?;
            let received = self.clock.now();
            drop(one_at_a_time);
            reply.store_time = (time == FlushTime::Read).then(|| midpoint(sent, received));
            Ok(reply)
        })
    }

    fn landed<'a>(
        &'a self,
        items: &'a [FlushItem],
        receipt: &'a FlushReceipt,
    ) -> StoreFuture<'a, Vec<Option<bool>>> {
        Box::pin(self.landed_all(items, receipt))
    }

    fn runs_exact(&self) -> bool {
        false
    }

    fn exact<'a>(&'a self, _request: &'a ExactRequest) -> StoreFuture<'a, Decision> {
        Box::pin(async {
            Err(StoreError::Refused(
                "the etcd store does not run exact mode; use synced mode or a Redis store".into(),
            ))
        })
    }

    /// etcd keeps no clock to read: this asks it a linearizable read (so the answer says the
    /// cluster is reachable and has a quorum) and returns the store's clock (see
    /// [`EtcdStore::connect`]) at the middle of the call.
    fn time(&self) -> StoreFuture<'_, Nanos> {
        Box::pin(async {
            let probe = b"sluice:v1:probe".to_vec();
            let txn = TxnRequest {
                success: vec![RequestOp::range(probe, Vec::new(), 1)],
                ..TxnRequest::default()
            };
            let sent = self.clock.now();
            self.client.txn(txn).await?;
            Ok(midpoint(sent, self.clock.now()))
        })
    }

    fn announce<'a>(&'a self, node: &'a str, live_for: Duration) -> StoreFuture<'a, Presence> {
        Box::pin(async move {
            let lease = self.leases.for_ttl(&self.client, live_for).await?;
            let now = self.clock.now();
            let now_ms = now / 1_000_000;
            let prefix = FLEET_PREFIX.as_bytes().to_vec();
            let txn = TxnRequest {
                compare: Vec::new(),
                success: vec![
                    RequestOp::put(
                        [FLEET_PREFIX, node].concat().into_bytes(),
                        now_ms.to_string().into_bytes(),
                        lease,
                    ),
                    RequestOp::range(prefix.clone(), prefix_end(&prefix), MAX_FLEET),
                ],
                failure: Vec::new(),
            };
            let reply = self.client.txn(txn).await?;
            let store_time = midpoint(now, self.clock.now());
            let since_ms = now_ms.saturating_sub(u64::try_from(live_for.as_millis()).unwrap_or(0));
            let live = live_count(&reply, since_ms)?;
            Ok(Presence { live, store_time })
        })
    }

    fn describe(&self) -> String {
        self.client.describe(self.tls)
    }
}

/// The middle of a call between `sent` and `received`: where the engine places a store clock
/// reading (it measures the offset from its own midpoint of the round trip).
fn midpoint(sent: Nanos, received: Nanos) -> Nanos {
    sent / 2 + received / 2
}

/// How many fleet entries of an announcement's reply (its second operation) are recent.
pub(crate) fn live_count(reply: &proto::TxnResponse, since_ms: u64) -> Result<u64, StoreError> {
    match reply.responses.get(1).and_then(|r| r.response.as_ref()) {
        Some(Response::Range(range)) => Ok(range
            .kvs
            .iter()
            .filter(|kv| flush::parse_count(&kv.value).is_some_and(|at| at >= since_ms))
            .count() as u64),
        _ => Err(StoreError::BadReply {
            key: FLEET_PREFIX.into(),
            detail: "the fleet read is missing from etcd's reply".into(),
        }),
    }
}

/// Entry point of the `etcd_replies` fuzz target: `bytes` as a transaction reply, read as a
/// flush of two keys (one with an entry and the previous window), as a failed compare, and as
/// an announcement.
#[doc(hidden)]
pub fn fuzz_reply(bytes: &[u8]) {
    use prost::Message as _;
    let Ok(reply) = proto::TxnResponse::decode(bytes) else {
        return;
    };
    let entry = crate::NodeEntry {
        node: "fuzz-1".into(),
        count: 2,
        at_ms: 1_800_000_000_000,
        rate_milli: 1500,
    };
    let items = [
        FlushItem {
            key: "sluice:v1:{0}:1:ra".into(),
            window: 5,
            delta: 2,
            ttl: Duration::from_secs(60),
            entry: Some(entry),
            want_previous: true,
            first_write: false,
        },
        FlushItem {
            key: "sluice:v1:{1}:1:rb".into(),
            window: 0,
            delta: 0,
            ttl: Duration::from_secs(60),
            entry: None,
            want_previous: false,
            first_write: true,
        },
    ];
    let groups = layout::group(&items);
    let ops = [
        flush::Ops {
            window: 1,
            previous: Some(2),
        },
        flush::Ops {
            window: 3,
            previous: None,
        },
    ];
    let _ = flush::outcomes(&groups, &reply, &ops);
    let _ = live_count(&reply, 1_800_000_000_000);
    for at in 0..reply.responses.len().min(64) {
        if let Some(kvs) = flush::range_at(&reply, at) {
            let _ = kvs.first().map(|kv| flush::parse_count(&kv.value));
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::{FlushOutcome, StoreError};

    pub(crate) fn assert_bad(result: &Result<FlushOutcome, StoreError>, key: &str, says: &str) {
        match result {
            Err(StoreError::BadReply { key: k, detail }) => {
                assert_eq!(k, key);
                assert!(detail.contains(says), "{detail}");
            }
            other => panic!("expected a bad reply for {key}, got {other:?}"),
        }
    }
}
