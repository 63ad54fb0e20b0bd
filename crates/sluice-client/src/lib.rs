//! A client for a set of Sluice servers.
//!
//! Each user is routed by rendezvous (highest random weight) hashing to one server, so that
//! user's bookkeeping lives in that server's memory and needs no shared store. When a server
//! fails (connection error, timeout, 5xx), the user's calls go to the next server in the
//! user's ranking; only that server's users move. The failed server is retried after a
//! backoff, and its users come back as soon as it answers again.
//!
//! [`Leases`] takes tokens in batches and hands them out with no call per use, returning
//! what goes unused.
//!
//! ```no_run
//! # async fn demo() -> Result<(), sluice_client::ClientError> {
//! let client = sluice_client::SluiceClient::new(
//!     ["http://10.0.0.1:8080", "http://10.0.0.2:8080", "http://10.0.0.3:8080"],
//!     sluice_client::ClientOptions::default(),
//! )?;
//! let answer = client.acquire("alice", "reports", 1, None).await?;
//! if !answer.value.allowed {
//!     println!("retry in {:?} ms (asked {})", answer.value.retry_after_ms, answer.server);
//! }
//! # Ok(()) }
//! ```

mod lease;

pub use lease::{LeaseOptions, LeaseStats, Leases};

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use sluice_core::{Clock, CoarseClock};

/// Timeouts and retries.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Longest wait for one server's answer.
    pub timeout: Duration,
    /// How many servers to try for one call (the user's first choices, in order).
    pub attempts: usize,
    /// First pause before a failed server is tried again; doubles per failure up to `max_backoff`.
    pub backoff: Duration,
    /// Longest pause before a failed server is tried again.
    pub max_backoff: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_millis(500),
            attempts: 3,
            backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
        }
    }
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// No server URL was given, or one is not `http://host:port`.
    #[error("invalid server list: {0}")]
    Config(String),
    /// The server rejected the request (a 4xx with Sluice's error message).
    #[error("rejected by {server}: {message}")]
    Rejected {
        /// Which server.
        server: String,
        /// Its error message.
        message: String,
    },
    /// Every server tried failed.
    #[error("no Sluice server answered ({0})")]
    Unavailable(String),
}

/// A limit sent with an acquire (a token bucket per user and item).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Limit {
    /// Tokens per window.
    pub requests: u64,
    /// Window, e.g. `"1m"`.
    pub window: String,
    /// Bucket size (defaults to `requests`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
}

/// The answer to an acquire.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Acquired {
    /// Whether the tokens were taken.
    pub allowed: bool,
    /// Tokens left (None when no rule limits the pair).
    pub remaining: Option<u64>,
    /// When denied: milliseconds until the same acquire can succeed.
    pub retry_after_ms: Option<u64>,
    /// Milliseconds until the quota is whole again.
    pub reset_after_ms: u64,
}

/// An answer and the server that gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Routed<T> {
    /// The server's base URL.
    pub server: String,
    /// The answer.
    pub value: T,
}

struct Server {
    url: String,
    /// Until when (ns, coarse clock) not to try it; 0 when healthy.
    down_until: AtomicU64,
    failures: AtomicU32,
}

/// The client. Cheap to share behind an `Arc`; all methods take `&self`.
pub struct SluiceClient {
    servers: Vec<Server>,
    http: Client<HttpConnector, Full<Bytes>>,
    options: ClientOptions,
    clock: CoarseClock,
}

enum Attempt {
    Answer(Bytes),
    Rejected(String),
    Failed(String),
}

impl SluiceClient {
    /// A client for these servers (`http://host:port`).
    pub fn new<S: AsRef<str>>(
        servers: impl IntoIterator<Item = S>,
        options: ClientOptions,
    ) -> Result<Self, ClientError> {
        let servers: Vec<Server> = servers
            .into_iter()
            .map(|s| {
                let url = s.as_ref().trim_end_matches('/').to_owned();
                if !url.starts_with("http://") || url.len() <= "http://".len() {
                    return Err(ClientError::Config(format!(
                        "`{url}` is not http://host:port"
                    )));
                }
                Ok(Server {
                    url,
                    down_until: AtomicU64::new(0),
                    failures: AtomicU32::new(0),
                })
            })
            .collect::<Result<_, _>>()?;
        if servers.is_empty() {
            return Err(ClientError::Config("no server given".into()));
        }
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(options.timeout));
        connector.set_nodelay(true);
        let http = Client::builder(TokioExecutor::new()).build(connector);
        Ok(Self {
            servers,
            http,
            options,
            clock: CoarseClock::new(),
        })
    }

    /// Servers in `user`'s order of preference: rendezvous hashing, stable as servers come and go.
    pub fn ranking(&self, user: &str) -> Vec<&str> {
        self.ranked(user)
            .into_iter()
            .map(|i| self.servers[i].url.as_str())
            .collect()
    }

    fn ranked(&self, user: &str) -> Vec<usize> {
        // A fixed seed: every client process must rank alike.
        let state = foldhash::fast::FixedState::with_seed(0x005e_ed51_u64);
        let mut scored: Vec<(u64, usize)> = self
            .servers
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let mut h = state.build_hasher();
                h.write(s.url.as_bytes());
                h.write_u8(0xff);
                h.write(user.as_bytes());
                (h.finish(), i)
            })
            .collect();
        scored.sort_unstable_by(|a, b| b.cmp(a));
        scored.into_iter().map(|(_, i)| i).collect()
    }

    /// The server `user`'s calls go to now (the first in its ranking that is not backing off).
    pub fn server_for(&self, user: &str) -> &str {
        let now = self.clock.now();
        let ranked = self.ranked(user);
        let i = ranked
            .iter()
            .copied()
            .find(|&i| self.servers[i].down_until.load(Ordering::Relaxed) <= now)
            .unwrap_or(ranked[0]);
        &self.servers[i].url
    }

    async fn post(&self, server: &Server, path: &str, body: &serde_json::Value) -> Attempt {
        let request = hyper::Request::post(format!("{}{path}", server.url))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())));
        let Ok(request) = request else {
            return Attempt::Failed("cannot build request".into());
        };
        let call = async {
            let response = self
                .http
                .request(request)
                .await
                .map_err(|e| e.to_string())?;
            let status = response.status();
            let bytes = response
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            Ok::<_, String>((status, bytes))
        };
        match tokio::time::timeout(self.options.timeout, call).await {
            Err(_) => Attempt::Failed(format!(
                "{} timed out after {:?}",
                server.url, self.options.timeout
            )),
            Ok(Err(e)) => Attempt::Failed(format!("{}: {e}", server.url)),
            // `/json` answers 429 with the decision in the body when over the limit (as Envoy's
            // ratelimit service does): an answer, not an error.
            Ok(Ok((status, bytes)))
                if status.is_success() || status == hyper::StatusCode::TOO_MANY_REQUESTS =>
            {
                Attempt::Answer(bytes)
            }
            Ok(Ok((status, bytes))) if status.is_client_error() => {
                let message = serde_json::from_slice::<serde_json::Value>(&bytes)
                    .ok()
                    .and_then(|v| v["error"].as_str().map(str::to_owned))
                    .unwrap_or_else(|| format!("HTTP {status}"));
                Attempt::Rejected(message)
            }
            Ok(Ok((status, _))) => {
                Attempt::Failed(format!("{} answered HTTP {status}", server.url))
            }
        }
    }

    fn mark_down(&self, server: &Server) {
        let failures = server.failures.fetch_add(1, Ordering::Relaxed).min(16);
        let pause = self
            .options
            .backoff
            .saturating_mul(1 << failures)
            .min(self.options.max_backoff);
        let until = self
            .clock
            .now()
            .saturating_add(u64::try_from(pause.as_nanos()).unwrap_or(u64::MAX));
        server.down_until.store(until, Ordering::Relaxed);
    }

    fn mark_up(&self, server: &Server) {
        if server.down_until.load(Ordering::Relaxed) != 0 {
            server.down_until.store(0, Ordering::Relaxed);
            server.failures.store(0, Ordering::Relaxed);
        }
    }

    /// Sends `body` to `path` on `user`'s servers in ranking order, skipping those backing off
    /// (unless all are), until one answers.
    async fn call(
        &self,
        user: &str,
        path: &str,
        body: serde_json::Value,
    ) -> Result<Routed<Bytes>, ClientError> {
        let now = self.clock.now();
        let ranked = self.ranked(user);
        let (up, down): (Vec<usize>, Vec<usize>) = ranked
            .into_iter()
            .partition(|&i| self.servers[i].down_until.load(Ordering::Relaxed) <= now);
        let mut errors = Vec::new();
        for i in up
            .into_iter()
            .chain(down)
            .take(self.options.attempts.max(1))
        {
            let server = &self.servers[i];
            match self.post(server, path, &body).await {
                Attempt::Answer(bytes) => {
                    self.mark_up(server);
                    return Ok(Routed {
                        server: server.url.clone(),
                        value: bytes,
                    });
                }
                Attempt::Rejected(message) => {
                    self.mark_up(server);
                    return Err(ClientError::Rejected {
                        server: server.url.clone(),
                        message,
                    });
                }
                Attempt::Failed(e) => {
                    self.mark_down(server);
                    errors.push(e);
                }
            }
        }
        Err(ClientError::Unavailable(errors.join("; ")))
    }

    fn decode<T: serde::de::DeserializeOwned>(
        routed: Routed<Bytes>,
    ) -> Result<Routed<T>, ClientError> {
        let value = serde_json::from_slice(&routed.value).map_err(|e| ClientError::Rejected {
            server: routed.server.clone(),
            message: format!("unreadable answer: {e}"),
        })?;
        Ok(Routed {
            server: routed.server,
            value,
        })
    }

    /// Takes `amount` tokens of `item` for `user` (from the rules, or from `limit`).
    pub async fn acquire(
        &self,
        user: &str,
        item: &str,
        amount: u64,
        limit: Option<&Limit>,
    ) -> Result<Routed<Acquired>, ClientError> {
        let mut body = serde_json::json!({ "user": user, "item": item, "amount": amount });
        if let Some(limit) = limit {
            body["limit"] = serde_json::to_value(limit).unwrap_or_default();
        }
        Self::decode(self.call(user, "/v1/acquire", body).await?)
    }

    /// Gives back `amount` unused tokens.
    pub async fn refill(
        &self,
        user: &str,
        item: &str,
        amount: u64,
        limit: Option<&Limit>,
    ) -> Result<Routed<serde_json::Value>, ClientError> {
        let mut body = serde_json::json!({ "user": user, "item": item, "amount": amount });
        if let Some(limit) = limit {
            body["limit"] = serde_json::to_value(limit).unwrap_or_default();
        }
        Self::decode(self.call(user, "/v1/refill", body).await?)
    }

    /// Envoy-style check (`/json`) routed by `routing_key` (e.g. the user the descriptors are
    /// about). Returns the response as JSON (`overallCode`, `statuses`).
    pub async fn should_rate_limit(
        &self,
        routing_key: &str,
        domain: &str,
        descriptors: &[&[(&str, &str)]],
        hits_addend: u32,
    ) -> Result<Routed<serde_json::Value>, ClientError> {
        let descriptors: Vec<serde_json::Value> = descriptors
            .iter()
            .map(|entries| serde_json::json!({ "entries": entries.iter().map(|(k, v)| serde_json::json!({"key": k, "value": v})).collect::<Vec<_>>() }))
            .collect();
        let body = serde_json::json!({ "domain": domain, "descriptors": descriptors, "hitsAddend": hits_addend });
        Self::decode(self.call(routing_key, "/json", body).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removing_a_server_moves_only_its_users() {
        let all = SluiceClient::new(
            ["http://a:1", "http://b:1", "http://c:1"],
            ClientOptions::default(),
        )
        .unwrap();
        let two =
            SluiceClient::new(["http://a:1", "http://c:1"], ClientOptions::default()).unwrap();
        let mut moved = 0;
        for i in 0..1000 {
            let user = format!("user-{i}");
            let before = all.ranking(&user);
            let after = two.ranking(&user);
            if before[0] == "http://b:1" {
                moved += 1;
                assert_eq!(
                    after[0], before[1],
                    "a moved user goes to its second choice"
                );
            } else {
                assert_eq!(after[0], before[0], "users of other servers stay");
            }
        }
        assert!(
            (250..420).contains(&moved),
            "{moved} of 1000 users were on b"
        );
    }

    #[test]
    fn bad_server_lists_are_rejected() {
        assert!(SluiceClient::new(Vec::<String>::new(), ClientOptions::default()).is_err());
        assert!(SluiceClient::new(["10.0.0.1:8080"], ClientOptions::default()).is_err());
    }
}
