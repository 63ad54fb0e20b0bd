//! A small etcd v3 gRPC client: the endpoints (tried in turn), the login token, a deadline on
//! every call, and etcd's errors as [`StoreError`]s (no password or token in any of them).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use super::proto::{
    AuthenticateRequest, AuthenticateResponse, LeaseGrantRequest, LeaseGrantResponse, TxnRequest,
    TxnResponse,
};
use crate::StoreError;
use sluice_config::{Credentials, EtcdTarget};

/// The largest reply accepted from etcd (a hostile or broken server cannot make the store
/// buffer more).
const MAX_REPLY_BYTES: usize = 16 << 20;

pub(crate) struct Client {
    endpoints: Vec<(String, Channel)>,
    /// The endpoint calls go to; moves on when one fails.
    current: AtomicUsize,
    auth: Option<Credentials>,
    token: parking_lot::Mutex<Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>>,
    timeout: Duration,
}

impl Client {
    /// Channels to every endpoint, connected on first use.
    pub(crate) fn new(
        target: &EtcdTarget,
        tls_root_pem: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        if target.endpoints.is_empty() {
            return Err(StoreError::Refused(
                "an etcd store needs an endpoint".into(),
            ));
        }
        let mut endpoints = Vec::new();
        for host in &target.endpoints {
            let scheme = if target.tls { "https" } else { "http" };
            let bad = |e: tonic::transport::Error| {
                StoreError::Refused(format!("invalid etcd endpoint `{host}`: {e}"))
            };
            let mut endpoint = Endpoint::from_shared(format!("{scheme}://{host}"))
                .map_err(bad)?
                .connect_timeout(timeout)
                .tcp_nodelay(true)
                .http2_keep_alive_interval(Duration::from_secs(10))
                .keep_alive_timeout(timeout.max(Duration::from_secs(1)));
            if target.tls {
                let name = host.rsplit_once(':').map_or(host.as_str(), |(h, _)| h);
                let name = name.trim_start_matches('[').trim_end_matches(']');
                let tls = match tls_root_pem {
                    Some(pem) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)),
                    None => ClientTlsConfig::new().with_webpki_roots(),
                };
                endpoint = endpoint.tls_config(tls.domain_name(name)).map_err(bad)?;
            }
            endpoints.push((host.clone(), endpoint.connect_lazy()));
        }
        Ok(Self {
            endpoints,
            current: AtomicUsize::new(0),
            auth: target.auth.clone(),
            token: parking_lot::Mutex::new(None),
            timeout,
        })
    }

    pub(crate) async fn txn(&self, request: TxnRequest) -> Result<TxnResponse, StoreError> {
        self.call("/etcdserverpb.KV/Txn", request).await
    }

    pub(crate) async fn lease_grant(&self, ttl_s: i64) -> Result<LeaseGrantResponse, StoreError> {
        let request = LeaseGrantRequest { ttl: ttl_s, id: 0 };
        let reply: LeaseGrantResponse =
            self.call("/etcdserverpb.Lease/LeaseGrant", request).await?;
        if !reply.error.is_empty() {
            return Err(StoreError::Refused(format!(
                "etcd refused a lease: {}",
                reply.error
            )));
        }
        Ok(reply)
    }

    /// One unary call, logged in when the store has a user. A call that could not reach an
    /// endpoint goes to the next one at once (nothing was sent); a call that failed after it
    /// was sent is not repeated (its outcome is unknown), but the next call goes elsewhere.
    async fn call<Req, Reply>(&self, path: &'static str, request: Req) -> Result<Reply, StoreError>
    where
        Req: prost::Message + Clone + Default + Send + Sync + 'static,
        Reply: prost::Message + Default + Send + Sync + 'static,
    {
        let mut relogged = false;
        let mut tried = 0;
        loop {
            let at = self.current.load(Ordering::Relaxed) % self.endpoints.len();
            let token = match &self.auth {
                Some(auth) => Some(self.token(at, auth, relogged).await?),
                None => None,
            };
            match self.unary(at, path, request.clone(), token).await {
                Ok(reply) => return Ok(reply),
                Err(Failure::NotSent(e)) if tried + 1 < self.endpoints.len() => {
                    tried += 1;
                    self.next_endpoint(at);
                    tracing::debug!(endpoint = %self.endpoints[at].0, error = %e, "etcd endpoint unreachable; trying the next");
                }
                Err(Failure::BadToken) if !relogged && self.auth.is_some() => {
                    relogged = true;
                    *self.token.lock() = None;
                }
                Err(Failure::BadToken) => {
                    return Err(StoreError::Refused("etcd refused the login token".into()));
                }
                Err(Failure::NotSent(e) | Failure::Other(e)) => {
                    if e.is_unavailable() {
                        self.next_endpoint(at);
                    }
                    return Err(e);
                }
            }
        }
    }

    fn next_endpoint(&self, failed: usize) {
        let _ = self.current.compare_exchange(
            failed,
            (failed + 1) % self.endpoints.len(),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// The login token, asked for when there is none (or `fresh`).
    async fn token(
        &self,
        at: usize,
        auth: &Credentials,
        fresh: bool,
    ) -> Result<tonic::metadata::MetadataValue<tonic::metadata::Ascii>, StoreError> {
        if !fresh && let Some(token) = self.token.lock().clone() {
            return Ok(token);
        }
        let request = AuthenticateRequest {
            name: auth.user().unwrap_or_default().to_owned(),
            password: auth.password().to_owned(),
        };
        let reply: AuthenticateResponse = self
            .unary(at, "/etcdserverpb.Auth/Authenticate", request, None)
            .await
            .map_err(|f| match f {
                Failure::NotSent(e) | Failure::Other(e) => e,
                Failure::BadToken => StoreError::Refused("etcd refused the login".into()),
            })?;
        let token: tonic::metadata::MetadataValue<tonic::metadata::Ascii> =
            reply.token.parse().map_err(|_| StoreError::BadReply {
                key: "(login)".into(),
                detail: "etcd sent a login token that is not a header value".into(),
            })?;
        *self.token.lock() = Some(token.clone());
        Ok(token)
    }

    async fn unary<Req, Reply>(
        &self,
        at: usize,
        path: &'static str,
        request: Req,
        token: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    ) -> Result<Reply, Failure>
    where
        Req: prost::Message + Send + Sync + 'static,
        Reply: prost::Message + Default + Send + Sync + 'static,
    {
        let (host, channel) = &self.endpoints[at];
        let mut grpc =
            tonic::client::Grpc::new(channel.clone()).max_decoding_message_size(MAX_REPLY_BYTES);
        let mut request = tonic::Request::new(request);
        if let Some(token) = token {
            request.metadata_mut().insert("token", token);
        }
        let call = async {
            grpc.ready().await.map_err(|e| {
                Failure::NotSent(StoreError::Unavailable(format!(
                    "etcd {host}: {}",
                    source_chain(&e)
                )))
            })?;
            let codec = tonic_prost::ProstCodec::<Req, Reply>::default();
            grpc.unary(request, PathAndQuery::from_static(path), codec)
                .await
                .map(tonic::Response::into_inner)
                .map_err(|status| Failure::of(host, &status))
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(Failure::Other(StoreError::Timeout(self.timeout))),
        }
    }

    /// `etcd://h1:2379,h2:2379` (or `etcds://`), never the login.
    pub(crate) fn describe(&self, tls: bool) -> String {
        let hosts: Vec<&str> = self.endpoints.iter().map(|(h, _)| h.as_str()).collect();
        format!(
            "{}://{}",
            if tls { "etcds" } else { "etcd" },
            hosts.join(",")
        )
    }
}

enum Failure {
    /// The endpoint could not be reached: nothing was sent.
    NotSent(StoreError),
    /// The login token expired or was revoked: nothing was applied.
    BadToken,
    Other(StoreError),
}

impl Failure {
    fn of(host: &str, status: &tonic::Status) -> Self {
        use tonic::Code;
        let message = status.message();
        let detail = if message.is_empty() {
            source_chain(status)
        } else {
            message.to_owned()
        };
        if message.contains("invalid auth token") || message.contains("auth: revision") {
            return Failure::BadToken;
        }
        let unreachable = detail.contains("tcp connect error")
            || detail.contains("error trying to connect")
            || detail.contains("Connection refused");
        match status.code() {
            Code::Unavailable if unreachable => {
                Failure::NotSent(StoreError::Unavailable(format!("etcd {host}: {detail}")))
            }
            Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Cancelled
            | Code::Aborted
            | Code::Unknown
            | Code::Internal => {
                Failure::Other(StoreError::Unavailable(format!("etcd {host}: {detail}")))
            }
            _ => Failure::Other(StoreError::Refused(format!("etcd {host}: {detail}"))),
        }
    }
}

fn source_chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        out.push_str(": ");
        out.push_str(&e.to_string());
        source = e.source();
    }
    out
}
