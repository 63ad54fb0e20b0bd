//! Redis: standalone (`redis://`, `rediss://` with TLS, password and ACL user in the URL),
//! Sentinel (follows failovers) and Cluster (one pipeline per node).

mod backend;
mod scripts;

use backend::{Backend, ClusterBackend, Conn, SentinelBackend};

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisError, Value};
use sluice_core::{Allowed, Decision, Denied, InsufficientCapacity, Nanos};
use tokio::sync::OnceCell;

use crate::exact::{ExactAlgorithm, ExactRequest};
use crate::{
    CounterStore, FlushItem, FlushOutcome, FlushReply, NodeEntry, StoreError, StoreFuture,
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
}

impl Default for RedisStoreOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_millis(500),
            connect_timeout: Duration::from_millis(500),
            max_backoff: Duration::from_secs(2),
        }
    }
}

pub(crate) struct Scripts {
    pub(crate) flush: redis::Script,
    fixed_window: redis::Script,
    token_bucket: redis::Script,
    sliding_window: redis::Script,
    sliding_log: redis::Script,
}

impl Scripts {
    fn new() -> Self {
        Self {
            flush: redis::Script::new(scripts::FLUSH_BATCH),
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

pub(crate) fn map_error(e: &RedisError) -> StoreError {
    if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout() {
        StoreError::Unavailable(e.to_string())
    } else {
        StoreError::Refused(e.to_string())
    }
}

pub(crate) fn is_noscript(e: &RedisError) -> bool {
    e.code() == Some("NOSCRIPT")
}

fn as_u64(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) => u64::try_from(*i).ok(),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

fn as_str(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn parse_flush(key: &str, v: &Value) -> Result<FlushOutcome, StoreError> {
    let bad = |detail: String| StoreError::BadReply {
        key: key.to_owned(),
        detail,
    };
    let Value::Array(parts) = v else {
        return Err(bad(format!(
            "expected an array from the flush script, got {v:?}"
        )));
    };
    let [total, previous, entries] = parts.as_slice() else {
        return Err(bad(format!(
            "expected 3 values from the flush script, got {}",
            parts.len()
        )));
    };
    let total =
        as_u64(total).ok_or_else(|| bad(format!("window total is not a count: {total:?}")))?;
    // -1: not asked for, or someone else's value sits at that key.
    let previous_total = as_u64(previous);
    let mut out = Vec::new();
    match entries {
        Value::Array(flat) => {
            for pair in flat.chunks(2) {
                let [node, entry] = pair else {
                    return Err(bad("odd number of fields in the per-node hash".into()));
                };
                let (Some(node), Some(entry)) = (as_str(node), as_str(entry)) else {
                    return Err(bad("per-node entry is not text".into()));
                };
                let decoded = NodeEntry::decode(&node, &entry).ok_or_else(|| {
                    bad(format!(
                        "per-node entry `{entry}` of `{node}` is not `count:at_ms:rate`"
                    ))
                })?;
                out.push(decoded);
            }
        }
        Value::Map(pairs) => {
            for (node, entry) in pairs {
                let (Some(node), Some(entry)) = (as_str(node), as_str(entry)) else {
                    return Err(bad("per-node entry is not text".into()));
                };
                out.push(
                    NodeEntry::decode(&node, &entry)
                        .ok_or_else(|| bad(format!("per-node entry `{entry}` is malformed")))?,
                );
            }
        }
        other => return Err(bad(format!("per-node entries are not a list: {other:?}"))),
    }
    Ok(FlushOutcome {
        total,
        previous_total,
        entries: out,
    })
}

/// Items per flush script call: large enough that the call overhead vanishes, small enough
/// that one call does not hold the server for long (about a millisecond).
pub(crate) const BATCH: usize = 500;

/// Splits items into runs of at most `BATCH` with one TTL each (the engine emits a rule's items
/// together, so runs are long); returns the runs and where each starts.
fn batches(items: &[FlushItem]) -> (Vec<&[FlushItem]>, Vec<usize>) {
    let mut batches = Vec::new();
    let mut offsets = Vec::new();
    let mut start = 0;
    while start < items.len() {
        let ttl = items[start].ttl;
        let mut end = start + 1;
        while end < items.len() && end - start < BATCH && items[end].ttl == ttl {
            end += 1;
        }
        batches.push(&items[start..end]);
        offsets.push(start);
        start = end;
    }
    (batches, offsets)
}

/// Spreads one batch reply over its items' results.
pub(crate) fn fill_batch(
    batch: &[FlushItem],
    offset: usize,
    reply: &redis::RedisResult<Value>,
    results: &mut [Result<FlushOutcome, StoreError>],
) {
    let bad = |item: &FlushItem, detail: String| StoreError::BadReply {
        key: item.key.to_string(),
        detail,
    };
    match reply {
        Ok(Value::Array(per_item)) if per_item.len() == batch.len() => {
            for (i, (item, v)) in batch.iter().zip(per_item).enumerate() {
                results[offset + i] = parse_flush(&item.key, v);
            }
        }
        Ok(other) => {
            for (i, item) in batch.iter().enumerate() {
                results[offset + i] = Err(bad(item, format!("unexpected flush reply {other:?}")));
            }
        }
        Err(e) => {
            // The script failed as a whole before applying anything it reports per item.
            for (i, item) in batch.iter().enumerate() {
                results[offset + i] = Err(bad(item, e.to_string()));
            }
        }
    }
}

pub(crate) fn parse_time(v: &Value) -> Option<Nanos> {
    let Value::Array(parts) = v else { return None };
    let secs = as_u64(parts.first()?)?;
    let micros = as_u64(parts.get(1)?)?;
    secs.checked_mul(1_000_000_000)?
        .checked_add(micros.checked_mul(1000)?)
}

fn parse_exact(key: &str, v: &Value, cost: u64) -> Result<Decision, StoreError> {
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
    /// A store for the server at `url` (`redis://[user:pass@]host:port/db` or `rediss://...`).
    /// Does not connect yet.
    pub fn open(url: &str, options: RedisStoreOptions) -> Result<Self, StoreError> {
        Self::connect(RedisTarget::Standalone(url.to_owned()), options)
    }

    /// A store for any deployment. Does not connect yet: the first call does, and a store that
    /// cannot be reached makes calls fail fast (the engine falls back), never the start-up.
    pub fn connect(target: RedisTarget, options: RedisStoreOptions) -> Result<Self, StoreError> {
        let (backend, description) = match &target {
            RedisTarget::Standalone(url) => {
                let client = redis::Client::open(url.as_str())
                    .map_err(|e| StoreError::Refused(format!("invalid Redis URL: {e}")))?;
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
        let moved = match error {
            StoreError::Unavailable(_) | StoreError::Timeout(_) => true,
            other => {
                let text = other.to_string();
                text.contains("READONLY") || text.contains("MOVED") || text.contains("CLUSTERDOWN")
            }
        };
        if moved {
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

    async fn load_script<C: redis::aio::ConnectionLike + Send>(
        &self,
        conn: &mut C,
    ) -> Result<(), StoreError> {
        self.scripts
            .flush
            .prepare_invoke()
            .load_async(conn)
            .await
            .map_err(|e| map_error(&e))?;
        Ok(())
    }

    /// One pipeline holding the items as batches of at most `BATCH` per script call. All items
    /// of a batch share one TTL (see [`batches`]).
    fn flush_pipeline(&self, batches: &[&[FlushItem]], with_time: bool) -> redis::Pipeline {
        flush_pipeline(&self.scripts, batches, with_time)
    }
}

/// One pipeline holding `batches`, one script call each, optionally followed by `TIME`.
pub(crate) fn flush_pipeline(
    scripts: &Scripts,
    batches: &[&[FlushItem]],
    with_time: bool,
) -> redis::Pipeline {
    {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for batch in batches {
            let ttl_ms = batch.first().map_or(1, |i| {
                u64::try_from(i.ttl.as_millis()).unwrap_or(u64::MAX).max(1)
            });
            let cmd = pipe
                .cmd("EVALSHA")
                .arg(scripts.flush.get_hash())
                .arg(batch.len());
            for item in *batch {
                cmd.arg(format!("{}:{}", item.key, item.window));
            }
            cmd.arg(ttl_ms);
            let mut flags = String::new();
            for item in *batch {
                flags.clear();
                if item.want_previous {
                    flags.push('p');
                }
                if let Some(e) = &item.entry {
                    flags.push('|');
                    flags.push_str(&e.node);
                    flags.push('|');
                    flags.push_str(&e.encode());
                }
                cmd.arg(item.delta).arg(flags.as_str());
            }
        }
        if with_time {
            pipe.cmd("TIME");
        }
        pipe
    }
}

impl RedisStore {
    /// Sends `batches` in one pipeline; each batch's reply lands in `results` at `offsets`.
    /// Batches whose script was missing (NOSCRIPT: nothing ran) are sent again after loading.
    async fn flush_batches<C: redis::aio::ConnectionLike + Send>(
        &self,
        conn: &mut C,
        batches: &[&[FlushItem]],
        offsets: &[usize],
        results: &mut [Result<FlushOutcome, StoreError>],
    ) -> Result<(Option<Nanos>, usize), StoreError> {
        let raw: Vec<redis::RedisResult<Value>> = self
            .flush_pipeline(batches, true)
            .query_async(conn)
            .await
            .map_err(|e| map_error(&e))?;
        let mut round_trips = 1;
        let store_time = raw
            .get(batches.len())
            .and_then(|t| t.as_ref().ok())
            .and_then(parse_time);
        let mut missing = Vec::new();
        for (b, reply) in raw.iter().take(batches.len()).enumerate() {
            match reply {
                Err(e) if is_noscript(e) => missing.push(b),
                other => fill_batch(batches[b], offsets[b], other, results),
            }
        }
        if !missing.is_empty() {
            self.load_script(conn).await?;
            let again: Vec<&[FlushItem]> = missing.iter().map(|&b| batches[b]).collect();
            let raw: Vec<redis::RedisResult<Value>> = self
                .flush_pipeline(&again, false)
                .query_async(conn)
                .await
                .map_err(|e| map_error(&e))?;
            round_trips += 2;
            for (&b, reply) in missing.iter().zip(&raw) {
                fill_batch(batches[b], offsets[b], reply, results);
            }
        }
        Ok((store_time, round_trips))
    }

    async fn flush_inner(&self, items: &[FlushItem]) -> Result<FlushReply, StoreError> {
        let mut results: Vec<Result<FlushOutcome, StoreError>> = items
            .iter()
            .map(|_| Err(StoreError::Refused("not sent".into())))
            .collect();
        if let Backend::Cluster(cluster) = &self.backend {
            let reply = cluster.flush(&self.scripts, items, results).await;
            if let Ok(r) = &reply
                && let Some(Err(e)) = r
                    .results
                    .iter()
                    .find(|r| r.as_ref().is_err_and(|e| e.to_string().contains("MOVED")))
            {
                self.on_error(e);
            }
            return reply;
        }
        let (batches, offsets) = batches(items);
        let mut conn = self.connection().await?;
        let (store_time, round_trips) = self
            .flush_batches(&mut conn, &batches, &offsets, &mut results)
            .await?;
        // A demoted master refuses writes item by item: nothing was applied; find the new one.
        if let Some(Err(e)) = results.iter().find(|r| {
            r.as_ref()
                .is_err_and(|e| e.to_string().contains("READONLY"))
        }) {
            self.on_error(e);
        }
        Ok(FlushReply {
            results,
            store_time,
            round_trips,
        })
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
    fn flush<'a>(&'a self, items: &'a [FlushItem]) -> StoreFuture<'a, FlushReply> {
        Box::pin(async move {
            let r = self.with_timeout(self.flush_inner(items)).await;
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
