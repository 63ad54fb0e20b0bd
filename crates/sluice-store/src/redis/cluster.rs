//! Redis Cluster: one pipeline per master node per flush, sent concurrently.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use redis::Value;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::SingleNodeRoutingInfo;
use sluice_core::Nanos;
use tokio::sync::OnceCell;

use super::slots::{SlotMap, group_by_node, parse_slots};
use super::{
    NodeNames, RedisStoreOptions, flush_pipeline, map_error, map_server_error, parse_time,
    read_item,
};
use crate::{
    ClusterTarget, FlushItem, FlushOutcome, FlushReceipt, FlushReply, FlushTime, StoreError,
};

/// Cluster: one pipeline per master node per flush, every batch inside it single-slot (the
/// keys of one rule and descriptor share a hash tag).
pub(super) struct ClusterBackend {
    client: redis::cluster::ClusterClient,
    conn: OnceCell<ClusterConnection>,
    /// (first slot, last slot, host, port) of each master, refreshed after errors.
    slots: Mutex<Option<Arc<SlotMap>>>,
}

impl ClusterBackend {
    pub(super) fn new(
        target: &ClusterTarget,
        options: &RedisStoreOptions,
    ) -> Result<Self, StoreError> {
        let ClusterTarget { nodes, auth, tls } = target;
        let scheme = if *tls { "rediss" } else { "redis" };
        let urls: Vec<String> = nodes.iter().map(|n| format!("{scheme}://{n}")).collect();
        let mut builder = redis::cluster::ClusterClientBuilder::new(urls)
            .connection_timeout(options.connect_timeout)
            .response_timeout(options.longest_call())
            .retries(1);
        if let Some(login) = auth {
            if let Some(user) = login.user() {
                builder = builder.username(user);
            }
            builder = builder.password(login.password());
        }
        // A private CA for `rediss://` nodes (every node, those learnt from `CLUSTER SLOTS` and
        // redirections included).
        if let Some(pem) = options.tls_root_pem.clone().filter(|_| *tls) {
            builder = builder.certs(redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem),
            });
        }
        let client = builder.build().map_err(|e| map_error(&e))?;
        Ok(Self {
            client,
            conn: OnceCell::new(),
            slots: Mutex::new(None),
        })
    }

    pub(super) async fn connection(&self) -> Result<ClusterConnection, StoreError> {
        self.conn
            .get_or_try_init(|| async {
                self.client
                    .get_async_connection()
                    .await
                    .map_err(|e| map_error(&e))
            })
            .await
            .cloned()
    }

    pub(super) fn invalidate(&self) {
        self.slots.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    async fn slot_map(&self, conn: &mut ClusterConnection) -> Result<Arc<SlotMap>, StoreError> {
        if let Some(map) = self.slots.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Ok(map);
        }
        let reply: Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(conn)
            .await
            .map_err(|e| map_error(&e))?;
        let map = Arc::new(parse_slots(&reply)?);
        *self.slots.lock().unwrap_or_else(|p| p.into_inner()) = Some(map.clone());
        Ok(map)
    }

    /// Sends one pipeline per master, concurrently: every command names one key, and each
    /// goes to the master serving its slot (one rule+descriptor's keys share a hash tag).
    pub(super) async fn flush(
        &self,
        items: &[FlushItem],
        receipt: Option<&FlushReceipt>,
        time: FlushTime,
    ) -> Result<FlushReply, StoreError> {
        let read_time = time == FlushTime::Read;
        let mut results: Vec<Result<FlushOutcome, StoreError>> = items
            .iter()
            .map(|_| Err(StoreError::Refused("not sent".into())))
            .collect();
        let mut conn = self.connection().await?;
        let map = self.slot_map(&mut conn).await?;
        let (by_node, unserved) = group_by_node(&map, items);
        for (i, slot) in unserved {
            results[i] = Err(StoreError::Unavailable(format!(
                "no node serves slot {slot}"
            )));
        }
        let mut tasks = tokio::task::JoinSet::new();
        // Which items each node's task carries, so that a task that never answers (it
        // panicked) leaves its items in doubt rather than failed.
        let mut carried: HashMap<tokio::task::Id, Vec<usize>> = HashMap::new();
        for ((host, port), members) in by_node {
            let owned: Vec<FlushItem> = members.iter().map(|&i| items[i].clone()).collect();
            let mut conn = conn.clone();
            let receipt = receipt.cloned();
            let ours = members.clone();
            let task = tasks.spawn(async move {
                let route = SingleNodeRoutingInfo::ByAddress { host, port };
                let outcome =
                    flush_node(&mut conn, route, &owned, receipt.as_ref(), read_time).await;
                (members, outcome)
            });
            carried.insert(task.id(), ours);
        }
        let mut round_trips = 0;
        let mut store_time = None;
        while let Some(done) = tasks.join_next().await {
            let (members, outcome) = match done {
                Ok(done) => done,
                Err(e) => {
                    // The pipeline may or may not have been applied: its outcome is unknown.
                    let error = StoreError::Unavailable(format!(
                        "the flush to one cluster node ended without an answer: {e}"
                    ));
                    for i in carried.remove(&e.id()).unwrap_or_default() {
                        results[i] = Err(error.clone());
                    }
                    continue;
                }
            };
            round_trips += 1;
            match outcome {
                Ok((per_item, time)) => {
                    store_time = store_time.or(time);
                    for (i, r) in members.into_iter().zip(per_item) {
                        results[i] = r;
                    }
                }
                Err(e) => {
                    let err = map_error(&e);
                    for i in members {
                        results[i] = Err(err.clone());
                    }
                    self.invalidate();
                }
            }
        }
        if !items.is_empty() && all_unavailable(&results) {
            return Err(StoreError::Unavailable(
                "no cluster node answered the flush".into(),
            ));
        }
        Ok(FlushReply {
            results,
            store_time,
            round_trips,
        })
    }

    /// Reads the marker of each master's share of `items` (grouped as [`Self::flush`] groups
    /// them: a promoted replica serves the same slots, so the groups and their first items are
    /// the same as when the flush was sent).
    pub(super) async fn landed(
        &self,
        items: &[FlushItem],
        receipt: &FlushReceipt,
    ) -> Result<Vec<Option<bool>>, StoreError> {
        let mut conn = self.connection().await?;
        let map = self.slot_map(&mut conn).await?;
        let (by_node, unserved) = group_by_node(&map, items);
        // An item whose slot no master serves was not sent.
        let mut landed = vec![Some(false); items.len()];
        let mut error = None;
        for members in by_node.into_values() {
            let marker: Result<Option<u64>, _> = redis::cmd("GET")
                .arg(receipt.marker_key(&items[members[0]]))
                .query_async(&mut conn)
                .await;
            let arrived = match marker {
                Ok(marker) => Some(marker == Some(receipt.token)),
                Err(e) => {
                    self.invalidate();
                    error = Some(map_error(&e));
                    None
                }
            };
            for i in members {
                landed[i] = arrived;
            }
        }
        match error {
            Some(e) if unserved.is_empty() && landed.iter().all(Option::is_none) => Err(e),
            _ => Ok(landed),
        }
    }
}

/// The outcome of each item a node's task carries, and the store's time when it was read.
type NodeOutcome = (Vec<Result<FlushOutcome, StoreError>>, Option<Nanos>);

/// One master's share of a flush: its pipeline sent to that node, each item's reply read.
async fn flush_node(
    conn: &mut ClusterConnection,
    route: SingleNodeRoutingInfo,
    owned: &[FlushItem],
    receipt: Option<&FlushReceipt>,
    read_time: bool,
) -> Result<NodeOutcome, redis::RedisError> {
    let refs: Vec<&FlushItem> = owned.iter().collect();
    let (pipe, plans, count) = flush_pipeline(&refs, receipt, read_time);
    let values = conn.route_pipeline(pipe, 0, count, route).await?;
    let replies: Vec<Result<Value, StoreError>> = values
        .into_iter()
        .map(|v| match v {
            Value::ServerError(e) => Err(map_server_error(&e)),
            v => Ok(v),
        })
        .collect();
    let time = read_time
        .then(|| replies.last().and_then(|t| t.as_ref().ok()))
        .flatten()
        .and_then(parse_time);
    let mut names = NodeNames::default();
    let per_item = owned
        .iter()
        .zip(&plans)
        .map(|(item, plan)| read_item(item, plan, &replies, &mut names))
        .collect();
    Ok((per_item, time))
}

/// Whether every item failed with the store unavailable (no node answered).
fn all_unavailable(results: &[Result<FlushOutcome, StoreError>]) -> bool {
    results
        .iter()
        .all(|r| r.as_ref().is_err_and(StoreError::is_unavailable))
}
