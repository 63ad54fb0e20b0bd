//! Redis: standalone (`redis://`, `rediss://` with TLS, password and ACL user in the URL),
//! Sentinel (follows failovers) and Cluster (one pipeline per node).

mod backend;
mod cluster;
mod errors;
mod pipeline;
mod replies;
mod scripts;
pub(crate) mod slots;

pub(crate) use crate::node_entry::NodeNames;
pub(crate) use errors::{map_error, map_server_error};
pub(crate) use pipeline::flush_pipeline;
pub use pipeline::packed_flush;
pub(crate) use replies::{parse_exact, parse_presence, parse_time, read_item};

use backend::{Backend, Conn, SentinelBackend};
use cluster::ClusterBackend;

use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use sluice_core::{Decision, Nanos};
use tokio::sync::OnceCell;

use crate::exact::{ExactAlgorithm, ExactRequest};
use crate::{
    CounterStore, FlushItem, FlushOutcome, FlushReceipt, FlushReply, FlushTime, Presence,
    StoreError, StoreFuture,
};
use crate::{RedisTarget, StandaloneTarget};

/// Timeouts and reconnection settings.
#[derive(Clone, Debug)]
pub struct RedisStoreOptions {
    /// Longest wait for any one call (an exact decision, a settling, a clock read); a flush
    /// pipeline gets `timeout_per_item` more per item.
    pub timeout: Duration,
    /// Added to a flush pipeline's wait per item it carries: a larger pipeline takes the store
    /// longer to run (default 100 µs: a 1,000-key chunk may take 600 ms).
    pub timeout_per_item: Duration,
    /// The most items one flush call carries (the engine's `flush_chunk_items`): bounds the
    /// longest call, which the connections are set to allow.
    pub max_items_per_call: usize,
    /// Longest wait to establish a connection.
    pub connect_timeout: Duration,
    /// Longest pause between reconnection attempts (they back off exponentially up to this).
    pub max_backoff: Duration,
    /// For TLS (standalone `rediss://`, Sentinel's data nodes and Sentinels, Cluster nodes): PEM root
    /// certificate(s) to trust instead of the built-in web roots, for servers with a private CA.
    pub tls_root_pem: Option<Vec<u8>>,
}

impl RedisStoreOptions {
    /// How long a call carrying `items` flush items may take.
    pub fn call_timeout(&self, items: usize) -> Duration {
        let items = u32::try_from(items.min(self.max_items_per_call)).unwrap_or(u32::MAX);
        self.timeout
            .saturating_add(self.timeout_per_item.saturating_mul(items))
    }

    /// The longest call (a flush of `max_items_per_call`): the connections' response timeout.
    pub(crate) fn longest_call(&self) -> Duration {
        self.call_timeout(self.max_items_per_call)
    }
}

impl Default for RedisStoreOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_millis(500),
            timeout_per_item: Duration::from_micros(100),
            max_items_per_call: sluice_config::DEFAULT_FLUSH_CHUNK_ITEMS,
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
    window_counter: redis::Script,
    announce: redis::Script,
}

impl Scripts {
    fn new() -> Self {
        Self {
            fixed_window: redis::Script::new(&scripts::fixed_window()),
            token_bucket: redis::Script::new(&scripts::token_bucket()),
            sliding_window: redis::Script::new(&scripts::sliding_window()),
            sliding_log: redis::Script::new(&scripts::sliding_log()),
            window_counter: redis::Script::new(&scripts::window_counter()),
            announce: redis::Script::new(&scripts::announce()),
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
        let url = url.to_owned();
        Self::connect(RedisTarget::Standalone(StandaloneTarget { url }), options)
    }

    /// A store for any deployment. Does not connect yet: the first call does, and a store that
    /// cannot be reached makes calls fail fast (the engine falls back), never the start-up.
    pub fn connect(target: RedisTarget, options: RedisStoreOptions) -> Result<Self, StoreError> {
        // redis-rs uses rustls for `rediss://`, and rustls needs a process-wide crypto provider
        // (without one the first TLS connection panics). Installing it twice is harmless.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (backend, description) = match &target {
            RedisTarget::Standalone(StandaloneTarget { url }) => {
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
                    sluice_config::redact_url(url),
                )
            }
            RedisTarget::Sentinel(target) => (
                Backend::Sentinel(SentinelBackend::new(target, &options)?),
                format!(
                    "redis+sentinel://{}/{}",
                    target.sentinels.join(","),
                    target.master
                ),
            ),
            RedisTarget::Cluster(target) => (
                Backend::Cluster(ClusterBackend::new(target, &options)?),
                format!("redis+cluster://{}", target.nodes.join(",")),
            ),
            _ => {
                return Err(StoreError::Refused(
                    "this kind of Redis target is not supported by this build".into(),
                ));
            }
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
                            .set_response_timeout(Some(self.options.longest_call()))
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
        self.within(self.options.timeout, f).await
    }

    async fn within<T>(
        &self,
        timeout: Duration,
        f: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        tokio::time::timeout(timeout, f)
            .await
            .unwrap_or(Err(StoreError::Timeout(timeout)))
    }

    async fn flush_inner(
        &self,
        items: &[FlushItem],
        receipt: Option<&FlushReceipt>,
        time: FlushTime,
    ) -> Result<FlushReply, StoreError> {
        if let Backend::Cluster(cluster) = &self.backend {
            let reply = cluster.flush(items, receipt, time).await;
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
        let (pipe, plans, _) = flush_pipeline(&refs, receipt, time == FlushTime::Read);
        let raw: Vec<redis::RedisResult<Value>> = pipe
            .query_async(&mut conn)
            .await
            .map_err(|e| map_error(&e))?;
        let replies: Vec<Result<Value, StoreError>> = raw
            .into_iter()
            .map(|r| r.map_err(|e| map_error(&e)))
            .collect();
        let store_time = (time == FlushTime::Read)
            .then(|| replies.last().and_then(|t| t.as_ref().ok()))
            .flatten()
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
                // The counters the rule's flushes add to (one slot: the key's hash tag).
                ExactAlgorithm::WindowCounter { sliding, .. } => {
                    let window = request.now_us / request.algorithm.window_us().max(1);
                    (
                        &self.scripts.window_counter,
                        vec![
                            format!("{key}:{window}"),
                            format!("{key}:{}", window.saturating_sub(1)),
                        ],
                        Some(u64::from(sliding)),
                    )
                }
            };
        let (limit, window_us) = (request.algorithm.limit(), request.algorithm.window_us());
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

    async fn announce_inner(&self, node: &str, live_for: Duration) -> Result<Presence, StoreError> {
        let mut conn = self.connection().await?;
        let live_for_ms = u64::try_from(live_for.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let reply: Value = self
            .scripts
            .announce
            .key(crate::FLEET_KEY)
            .arg(node)
            .arg(live_for_ms)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| map_error(&e))?;
        parse_presence(&reply).ok_or_else(|| StoreError::BadReply {
            key: crate::FLEET_KEY.into(),
            detail: format!("{reply:?}"),
        })
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
    fn flush_timed<'a>(
        &'a self,
        items: &'a [FlushItem],
        receipt: Option<&'a FlushReceipt>,
        time: FlushTime,
    ) -> StoreFuture<'a, FlushReply> {
        Box::pin(async move {
            let timeout = self.options.call_timeout(items.len());
            let r = self
                .within(timeout, self.flush_inner(items, receipt, time))
                .await;
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

    fn announce<'a>(&'a self, node: &'a str, live_for: Duration) -> StoreFuture<'a, Presence> {
        Box::pin(async move {
            let r = self.with_timeout(self.announce_inner(node, live_for)).await;
            if let Err(e) = &r {
                self.on_error(e);
            }
            r
        })
    }

    fn leave<'a>(&'a self, node: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let r = self
                .with_timeout(async {
                    let mut conn = self.connection().await?;
                    redis::cmd("ZREM")
                        .arg(crate::FLEET_KEY)
                        .arg(node)
                        .query_async::<Value>(&mut conn)
                        .await
                        .map(|_| ())
                        .map_err(|e| map_error(&e))
                })
                .await;
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
