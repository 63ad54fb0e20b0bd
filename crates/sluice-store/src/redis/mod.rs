//! Redis: standalone (`redis://`, `rediss://` with TLS, password and ACL user in the URL),
//! Sentinel (follows failovers) and Cluster (one pipeline per node).

mod backend;
mod scripts;
pub(crate) mod slots;

use backend::{Backend, ClusterBackend, Conn, SentinelBackend};

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisError, Value};
use sluice_core::{Allowed, Decision, Denied, InsufficientCapacity, Nanos};
use tokio::sync::OnceCell;

use crate::exact::{ExactAlgorithm, ExactRequest};
use crate::{
    CounterStore, FlushItem, FlushOutcome, FlushReceipt, FlushReply, NodeEntry, StoreError,
    StoreFuture,
};

/// Timeouts and reconnection settings.
#[derive(Clone, Debug)]
pub struct RedisStoreOptions {
    /// Longest wait for any one call (a flush pipeline or an exact decision).
    pub timeout: Duration,
    /// Longest wait to establish a connection.
    pub connect_timeout: Duration,
    /// Longest pause between reconnection attempts (they back off exponentially up to this).
    pub max_backoff: Duration,
    /// For TLS (standalone `rediss://`, Sentinel's data nodes and Sentinels, Cluster nodes): PEM root
    /// certificate(s) to trust instead of the built-in web roots, for servers with a private CA.
    pub tls_root_pem: Option<Vec<u8>>,
}

impl Default for RedisStoreOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_millis(500),
            connect_timeout: Duration::from_millis(500),
            max_backoff: Duration::from_secs(2),
            tls_root_pem: None,
        }
    }
}

struct Scripts {
    fixed_window: redis::Script,
    token_bucket: redis::Script,
    sliding_window: redis::Script,
    sliding_log: redis::Script,
}

impl Scripts {
    fn new() -> Self {
        Self {
            fixed_window: redis::Script::new(&scripts::fixed_window()),
            token_bucket: redis::Script::new(&scripts::token_bucket()),
            sliding_window: redis::Script::new(&scripts::sliding_window()),
            sliding_log: redis::Script::new(&scripts::sliding_log()),
        }
    }
}

/// A standalone Redis server.
///
/// Connects lazily and reconnects in the background with exponential backoff; every call has a
/// timeout, so a dead server costs a flush at most `timeout` and never blocks a request.
pub struct RedisStore {
    backend: Backend,
    options: RedisStoreOptions,
    scripts: Arc<Scripts>,
    description: String,
}

/// Where a Redis deployment is and how to log in.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RedisTarget {
    /// One server: a `redis://` or `rediss://` URL.
    Standalone(String),
    /// Sentinels (`host:port`) monitoring `master`.
    Sentinel {
        /// Sentinel addresses.
        sentinels: Vec<String>,
        /// Master name.
        master: String,
        /// ACL user and password for the data nodes.
        auth: Option<(Option<String>, String)>,
        /// Database number.
        db: u32,
        /// TLS to the data nodes.
        tls: bool,
        /// ACL user and password for the Sentinels themselves (their `requirepass`).
        sentinel_auth: Option<(Option<String>, String)>,
        /// TLS to the Sentinels.
        sentinel_tls: bool,
    },
    /// Cluster seed nodes (`host:port`).
    Cluster {
        /// Seed nodes.
        nodes: Vec<String>,
        /// ACL user and password.
        auth: Option<(Option<String>, String)>,
        /// TLS.
        tls: bool,
    },
}

/// Classifies a redis-rs error once, by its kind: the connection (unavailable), a topology
/// change (read-only replica, moved slot), or a refusal.
pub(crate) fn map_error(e: &RedisError) -> StoreError {
    if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout() {
        return StoreError::Unavailable(e.to_string());
    }
    match e.kind() {
        redis::ErrorKind::Server(kind) => classify_server(kind, e.to_string()),
        redis::ErrorKind::ClusterConnectionNotFound => StoreError::Unavailable(e.to_string()),
        _ => StoreError::Refused(e.to_string()),
    }
}

/// Classifies an error reply of one command in a pipeline.
pub(crate) fn map_server_error(e: &redis::ServerError) -> StoreError {
    let message = match e.details() {
        Some(details) => format!("{} {details}", e.code()),
        None => e.code().to_owned(),
    };
    match e.kind() {
        Some(kind) => classify_server(kind, message),
        None => StoreError::Refused(message),
    }
}

fn classify_server(kind: redis::ServerErrorKind, message: String) -> StoreError {
    use redis::ServerErrorKind as K;
    match kind {
        K::ReadOnly => StoreError::ReadOnly(message),
        K::Moved | K::Ask | K::TryAgain | K::ClusterDown | K::MasterDown => {
            StoreError::Redirected(message)
        }
        _ => StoreError::Refused(message),
    }
}

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

/// The instance ids met while reading one flush's replies: a fleet has a handful, and every
/// shared key names them all, so each entry clones one of these instead of allocating its own.
#[derive(Default)]
pub(crate) struct NodeNames(Vec<Arc<str>>);

impl NodeNames {
    pub(crate) fn get(&mut self, name: &str) -> Arc<str> {
        if let Some(known) = self.0.iter().find(|n| &***n == name) {
            return known.clone();
        }
        let new: Arc<str> = name.into();
        // Bounded: entries someone wrote under many names are read, not remembered.
        if self.0.len() < 64 {
            self.0.push(new.clone());
        }
        new
    }
}

fn parse_entries(v: &Value, names: &mut NodeNames) -> Option<Vec<NodeEntry>> {
    let pairs: Vec<(&str, &str)> = match v {
        Value::Array(flat) => flat
            .chunks(2)
            .map(|p| match p {
                [n, e] => Some((as_str(n)?, as_str(e)?)),
                _ => None,
            })
            .collect::<Option<_>>()?,
        Value::Map(pairs) => pairs
            .iter()
            .map(|(n, e)| Some((as_str(n)?, as_str(e)?)))
            .collect::<Option<_>>()?,
        _ => return None,
    };
    // An entry someone else wrote in another shape is skipped, not fatal.
    Some(
        pairs
            .iter()
            .filter_map(|(n, e)| NodeEntry::decode(n, e, names))
            .collect(),
    )
}

/// Where one item's replies are in the flush pipeline.
pub(crate) struct ItemPlan {
    incr: usize,
    previous: Option<usize>,
    entries: Option<usize>,
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
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    let mut n = 0;
    let mut plans = Vec::with_capacity(items.len());
    // Key names and entries are written into these and copied into each command's own buffer:
    // no allocation per key here (the flush's cost is per key; a shared key takes 3 commands).
    let mut counter = String::with_capacity(128);
    let mut other = String::with_capacity(128);
    for item in items {
        counter.clear();
        let _ = write!(counter, "{}:{}", item.key, item.window);
        let ttl_ms = whole_ms(item.ttl);
        pipe.cmd("INCRBY").arg(counter.as_str()).arg(item.delta);
        let incr = n;
        n += 1;
        if item.first_write {
            pipe.cmd("PEXPIRE").arg(counter.as_str()).arg(ttl_ms);
            n += 1;
        }
        let previous = item.want_previous.then(|| {
            other.clear();
            let _ = write!(other, "{}:{}", item.key, item.window.saturating_sub(1));
            pipe.cmd("GET").arg(other.as_str());
            n += 1;
            n - 1
        });
        let entries = item.entry.as_ref().map(|e| {
            counter.push_str(":n");
            other.clear();
            e.encode_into(&mut other);
            pipe.cmd("HSET")
                .arg(counter.as_str())
                .arg(&*e.node)
                .arg(other.as_str());
            n += 1;
            if item.first_write {
                pipe.cmd("PEXPIRE").arg(counter.as_str()).arg(ttl_ms);
                n += 1;
            }
            pipe.cmd("HGETALL").arg(counter.as_str());
            n += 1;
            n - 1
        });
        plans.push(ItemPlan {
            incr,
            previous,
            entries,
        });
    }
    if let (Some(receipt), Some(first)) = (receipt, items.first()) {
        let longest = items.iter().map(|i| i.ttl).max().unwrap_or_default();
        pipe.cmd("SET")
            .arg(receipt.marker_key(first))
            .arg(receipt.token)
            .arg("PX")
            .arg(whole_ms(longest));
        n += 1;
    }
    if with_time {
        pipe.cmd("TIME");
        n += 1;
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

/// The URL with any password replaced, for logs.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}://***@{}", &url[..scheme_end], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

impl RedisStore {
    /// Sentinel targets: how many `+switch-master` announcements for this master the store has
    /// received (each one drops the connection to the old master at once). 0 for others.
    pub fn master_switches_seen(&self) -> u64 {
        match &self.backend {
            Backend::Sentinel(s) => s.switches(),
            _ => 0,
        }
    }

    /// A store for the server at `url` (`redis://[user:pass@]host:port/db` or `rediss://...`).
    /// Does not connect yet.
    pub fn open(url: &str, options: RedisStoreOptions) -> Result<Self, StoreError> {
        Self::connect(RedisTarget::Standalone(url.to_owned()), options)
    }

    /// A store for any deployment. Does not connect yet: the first call does, and a store that
    /// cannot be reached makes calls fail fast (the engine falls back), never the start-up.
    pub fn connect(target: RedisTarget, options: RedisStoreOptions) -> Result<Self, StoreError> {
        // redis-rs uses rustls for `rediss://`, and rustls needs a process-wide crypto provider
        // (without one the first TLS connection panics). Installing it twice is harmless.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (backend, description) = match &target {
            RedisTarget::Standalone(url) => {
                let client = match &options.tls_root_pem {
                    Some(pem) if url.starts_with("rediss://") => redis::Client::build_with_tls(
                        url.as_str(),
                        redis::TlsCertificates {
                            client_tls: None,
                            root_cert: Some(pem.clone()),
                        },
                    ),
                    _ => redis::Client::open(url.as_str()),
                }
                .map_err(|e| StoreError::Refused(format!("invalid Redis URL or TLS roots: {e}")))?;
                (
                    Backend::Standalone {
                        client,
                        conn: OnceCell::new(),
                    },
                    redact(url),
                )
            }
            RedisTarget::Sentinel {
                sentinels, master, ..
            } => (
                Backend::Sentinel(SentinelBackend::new(&target, &options)?),
                format!("redis+sentinel://{}/{master}", sentinels.join(",")),
            ),
            RedisTarget::Cluster { nodes, .. } => (
                Backend::Cluster(ClusterBackend::new(&target, &options)?),
                format!("redis+cluster://{}", nodes.join(",")),
            ),
        };
        Ok(Self {
            backend,
            options,
            scripts: Arc::new(Scripts::new()),
            description,
        })
    }

    async fn connection(&self) -> Result<Conn, StoreError> {
        match &self.backend {
            Backend::Standalone { client, conn } => {
                let manager = conn
                    .get_or_try_init(|| async {
                        let config = ConnectionManagerConfig::new()
                            .set_connection_timeout(Some(self.options.connect_timeout))
                            .set_response_timeout(Some(self.options.timeout))
                            .set_number_of_retries(2)
                            .set_max_delay(self.options.max_backoff);
                        ConnectionManager::new_lazy_with_config(client.clone(), config)
                            .map_err(|e| map_error(&e))
                    })
                    .await?;
                Ok(Conn::Manager(manager.clone()))
            }
            Backend::Sentinel(sentinel) => sentinel.connection(&self.options).await,
            Backend::Cluster(cluster) => cluster.connection().await.map(Conn::Cluster),
        }
    }

    /// After an error that may mean the master moved: forget the connection (Sentinel) or the
    /// slot map (Cluster) so the next call finds the new one.
    fn on_error(&self, error: &StoreError) {
        if error.is_unavailable() || error.is_topology_change() {
            match &self.backend {
                Backend::Sentinel(s) => s.invalidate(),
                Backend::Cluster(c) => c.invalidate(),
                Backend::Standalone { .. } => {}
            }
        }
    }

    async fn with_timeout<T>(
        &self,
        f: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        tokio::time::timeout(self.options.timeout, f)
            .await
            .unwrap_or(Err(StoreError::Timeout(self.options.timeout)))
    }

    async fn flush_inner(
        &self,
        items: &[FlushItem],
        receipt: Option<&FlushReceipt>,
    ) -> Result<FlushReply, StoreError> {
        if let Backend::Cluster(cluster) = &self.backend {
            let reply = cluster.flush(items, receipt).await;
            if let Ok(r) = &reply
                && let Some(Err(e)) = r
                    .results
                    .iter()
                    .find(|r| r.as_ref().is_err_and(StoreError::is_topology_change))
            {
                self.on_error(e);
            }
            return reply;
        }
        let mut conn = self.connection().await?;
        let refs: Vec<&FlushItem> = items.iter().collect();
        let (pipe, plans, _) = flush_pipeline(&refs, receipt, true);
        let raw: Vec<redis::RedisResult<Value>> = pipe
            .query_async(&mut conn)
            .await
            .map_err(|e| map_error(&e))?;
        let replies: Vec<Result<Value, StoreError>> = raw
            .into_iter()
            .map(|r| r.map_err(|e| map_error(&e)))
            .collect();
        let store_time = replies
            .last()
            .and_then(|t| t.as_ref().ok())
            .and_then(parse_time);
        let mut names = NodeNames::default();
        let results: Vec<Result<FlushOutcome, StoreError>> = items
            .iter()
            .zip(&plans)
            .map(|(item, plan)| read_item(item, plan, &replies, &mut names))
            .collect();
        // A demoted master refuses writes item by item: nothing was applied; find the new one.
        if let Some(Err(e)) = results
            .iter()
            .find(|r| r.as_ref().is_err_and(StoreError::is_topology_change))
        {
            self.on_error(e);
        }
        // Sentinel: acknowledged only once a replica has the counts (see SentinelBackend).
        let mut round_trips = 1;
        if let Backend::Sentinel(sentinel) = &self.backend
            && sentinel.replicas.load(std::sync::atomic::Ordering::Relaxed) > 0
        {
            round_trips = 2;
            let wait_ms = (self.options.timeout.as_millis() * 3 / 4).max(1) as u64;
            let acked: i64 = redis::cmd("WAIT")
                .arg(1)
                .arg(wait_ms)
                .query_async(&mut conn)
                .await
                .map_err(|e| map_error(&e))?;
            if acked < 1 {
                let error = StoreError::Unavailable(format!(
                    "no replica acknowledged the flush within {wait_ms} ms (WAIT answered {acked}); its counts are kept and sent again"
                ));
                self.on_error(&error);
                return Err(error);
            }
        }
        Ok(FlushReply {
            results,
            store_time,
            round_trips,
        })
    }

    async fn landed_inner(
        &self,
        items: &[FlushItem],
        receipt: &FlushReceipt,
    ) -> Result<Vec<Option<bool>>, StoreError> {
        if let Backend::Cluster(cluster) = &self.backend {
            return cluster.landed(items, receipt).await;
        }
        let Some(first) = items.first() else {
            return Ok(Vec::new());
        };
        let mut conn = self.connection().await?;
        let marker: Option<u64> = redis::cmd("GET")
            .arg(receipt.marker_key(first))
            .query_async(&mut conn)
            .await
            .map_err(|e| map_error(&e))?;
        Ok(vec![Some(marker == Some(receipt.token)); items.len()])
    }

    async fn exact_inner(&self, request: &ExactRequest) -> Result<Decision, StoreError> {
        let mut conn = self.connection().await?;
        let key = &*request.key;
        let (script, keys, extra): (&redis::Script, Vec<String>, Option<u64>) =
            match request.algorithm {
                ExactAlgorithm::FixedWindow { .. } => {
                    (&self.scripts.fixed_window, vec![format!("{key}:fw")], None)
                }
                ExactAlgorithm::TokenBucket { burst, .. } => (
                    &self.scripts.token_bucket,
                    vec![format!("{key}:tb")],
                    Some(burst),
                ),
                ExactAlgorithm::SlidingWindow { .. } => (
                    &self.scripts.sliding_window,
                    vec![format!("{key}:sw")],
                    None,
                ),
                ExactAlgorithm::SlidingLog { .. } => (
                    &self.scripts.sliding_log,
                    vec![format!("{key}:log"), format!("{key}:logm")],
                    None,
                ),
            };
        let (limit, window_us) = match request.algorithm {
            ExactAlgorithm::FixedWindow { limit, window_us }
            | ExactAlgorithm::TokenBucket {
                limit, window_us, ..
            }
            | ExactAlgorithm::SlidingWindow { limit, window_us }
            | ExactAlgorithm::SlidingLog { limit, window_us } => (limit, window_us),
        };
        let mut invocation = script.prepare_invoke();
        for k in &keys {
            invocation.key(k);
        }
        invocation
            .arg(request.now_us)
            .arg(window_us)
            .arg(limit)
            .arg(request.cost);
        if let Some(burst) = extra {
            invocation.arg(burst);
        }
        // `invoke_async` sends EVALSHA and loads the script on NOSCRIPT.
        let reply: Value = invocation.invoke_async(&mut conn).await.map_err(|e| {
            if e.code() == Some("WRONGTYPE")
                || e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError)
            {
                StoreError::BadReply {
                    key: key.to_owned(),
                    detail: e.to_string(),
                }
            } else {
                map_error(&e)
            }
        })?;
        parse_exact(key, &reply, request.cost)
    }

    async fn time_inner(&self) -> Result<Nanos, StoreError> {
        let mut conn = self.connection().await?;
        let v: Value = redis::cmd("TIME")
            .query_async(&mut conn)
            .await
            .map_err(|e| map_error(&e))?;
        parse_time(&v).ok_or_else(|| StoreError::BadReply {
            key: "TIME".into(),
            detail: format!("{v:?}"),
        })
    }
}

impl CounterStore for RedisStore {
    fn flush<'a>(
        &'a self,
        items: &'a [FlushItem],
        receipt: Option<&'a FlushReceipt>,
    ) -> StoreFuture<'a, FlushReply> {
        Box::pin(async move {
            let r = self.with_timeout(self.flush_inner(items, receipt)).await;
            if let Err(e) = &r {
                self.on_error(e);
            }
            r
        })
    }

    fn landed<'a>(
        &'a self,
        items: &'a [FlushItem],
        receipt: &'a FlushReceipt,
    ) -> StoreFuture<'a, Vec<Option<bool>>> {
        Box::pin(async move {
            let r = self.with_timeout(self.landed_inner(items, receipt)).await;
            if let Err(e) = &r {
                self.on_error(e);
            }
            r
        })
    }

    fn exact<'a>(&'a self, request: &'a ExactRequest) -> StoreFuture<'a, Decision> {
        Box::pin(async move {
            let r = self.with_timeout(self.exact_inner(request)).await;
            if let Err(e) = &r {
                self.on_error(e);
            }
            r
        })
    }

    fn time(&self) -> StoreFuture<'_, Nanos> {
        Box::pin(async move {
            let r = self.with_timeout(self.time_inner()).await;
            if let Err(e) = &r {
                self.on_error(e);
            }
            r
        })
    }

    fn describe(&self) -> String {
        self.description.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // A reply that is not a list of pairs is no entries at all.
        assert_eq!(parse_entries(&Value::Int(3), &mut names), None);
        let mut encoded = String::new();
        first[1].encode_into(&mut encoded);
        assert_eq!(encoded, "5:1001:0");
    }

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
