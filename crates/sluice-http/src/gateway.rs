//! The reverse-proxy gateway: limits with [`RateLimitLayer`], then forwards to the upstream.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use axum::body::{Body, Bytes};
use std::convert::Infallible;
use std::future::Future;
use std::io::Write as _;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::extract::{ConnectInfo, Request};
use axum::response::{IntoResponse, Response};
use http::header::{self, HeaderName};
use http::{HeaderValue, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use sluice_config::Gateway;
use sluice_engine::Engine;

use crate::GeoIp;
use crate::client_ip::canonical_ip;
use crate::layer::{LimitPolicy, RateLimit, RateLimitLayer, UpstreamFailed};

/// Headers that describe one connection, not the request: never forwarded (RFC 9110 7.6.1).
/// (Names as constants: looking a header up by `&str` parses the name on every request.)
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
    header::TRANSFER_ENCODING,
];
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

struct Upstream {
    client: Client<HttpConnector, Body>,
    authority: http::uri::Authority,
    timeout: Duration,
}

fn strip_hop_by_hop(headers: &mut http::HeaderMap) {
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in listed {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

fn error(status: StatusCode, message: &str) -> Response {
    let body = serde_json::json!({ "error": message }).to_string();
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// The forwarding service under the gateway's limiting: each request to the upstream the
/// gateway's configuration names at the moment it arrives. The peer's address comes from the
/// request's [`ConnectInfo`] extension.
#[derive(Clone)]
pub struct Proxy {
    upstream: Arc<ArcSwap<Upstream>>,
}

impl tower::Service<Request> for Proxy {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let up = self.upstream.load_full();
        Box::pin(async move { Ok(proxy(&up, req).await) })
    }
}

/// The gateway's whole service: its limiting in front of its [`Proxy`].
pub type GatewayService = RateLimit<Proxy>;

async fn proxy(up: &Upstream, mut req: Request) -> Response {
    let Some(&ConnectInfo(peer)) = req.extensions().get::<ConnectInfo<SocketAddr>>() else {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the gateway is served without the peer's address",
        );
    };
    // The target as the client sent it (validated by the server), no copy: only the
    // scheme and authority change.
    let mut target = http::uri::Parts::default();
    target.scheme = Some(http::uri::Scheme::HTTP);
    target.authority = Some(up.authority.clone());
    target.path_and_query = Some(
        req.uri()
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/")),
    );
    let Ok(uri) = Uri::from_parts(target) else {
        return error(StatusCode::BAD_REQUEST, "invalid request target");
    };
    *req.uri_mut() = uri;
    *req.version_mut() = http::Version::HTTP_11;
    let headers = req.headers_mut();
    strip_hop_by_hop(headers);
    // X-Forwarded-For: append the peer (canonical: an IPv4 client on a dual-stack socket is
    // its IPv4 address for the upstream too), to every line the client sent, joined as bytes;
    // Forwarded (RFC 7239) likewise. Each value is written once into its own buffer, which
    // the header then owns.
    let peer_ip = canonical_ip(peer.ip());
    let mut xff: Vec<u8> = Vec::with_capacity(48);
    for prev in headers.get_all(&X_FORWARDED_FOR) {
        xff.extend_from_slice(prev.as_bytes());
        xff.extend_from_slice(b", ");
    }
    let _ = write!(xff, "{peer_ip}");
    if let Ok(v) = HeaderValue::from_maybe_shared(Bytes::from(xff)) {
        headers.insert(X_FORWARDED_FOR, v);
    }
    let mut forwarded: Vec<u8> = Vec::with_capacity(48);
    let _ = if peer_ip.is_ipv6() {
        write!(forwarded, "for=\"[{peer_ip}]\";proto=http")
    } else {
        write!(forwarded, "for={peer_ip};proto=http")
    };
    if let Ok(v) = HeaderValue::from_maybe_shared(Bytes::from(forwarded)) {
        headers.append(header::FORWARDED, v);
    }
    headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
    match tokio::time::timeout(up.timeout, up.client.request(req)).await {
        // The request may be at the upstream, working (a slow body, a slow handler): counted.
        Err(_) => error(
            StatusCode::GATEWAY_TIMEOUT,
            "the upstream did not answer in time",
        ),
        // No connection could be opened: the request was never sent, the only refundable case.
        Ok(Err(e)) if e.is_connect() => {
            tracing::warn!(upstream = %up.authority, error = %e, "upstream connection failed");
            never_sent(StatusCode::BAD_GATEWAY, "the upstream is unreachable")
        }
        // Lost after sending (a reset, a closed connection): the upstream may have done it.
        Ok(Err(e)) => {
            tracing::warn!(upstream = %up.authority, error = %e, "upstream request failed");
            error(StatusCode::BAD_GATEWAY, "the upstream failed to answer")
        }
        Ok(Ok(response)) => {
            let (mut parts, body) = response.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            Response::from_parts(parts, Body::new(body))
        }
    }
}

/// The gateway's own answer for a request the upstream never received, marked for the
/// layer's refund.
fn never_sent(status: StatusCode, message: &str) -> Response {
    let mut response = error(status, message);
    response.extensions_mut().insert(UpstreamFailed);
    response
}

/// What a reload may change in a running gateway: its policy (domain, routes and their
/// actions and costs, header style, refunds, trusted hops) and its upstream (address, timeout). Requests
/// already in flight finish with what they started with; no connection is dropped.
#[derive(Clone)]
pub struct GatewayHandle {
    layer: RateLimitLayer,
    upstream: Arc<ArcSwap<Upstream>>,
}

impl GatewayHandle {
    /// Whether [`GatewayHandle::apply`] would take `gateway` (its upstream parses).
    ///
    /// # Errors
    /// When `gateway.upstream` does not name a valid host and port.
    pub fn check(gateway: &Gateway) -> Result<(), http::uri::InvalidUri> {
        authority_of(gateway).map(|_| ())
    }

    /// Applies `gateway` (its `listen` and `workers` are not read: they need a restart).
    ///
    /// # Errors
    /// When `gateway.upstream` does not name a valid host and port; nothing changes then.
    pub fn apply(&self, gateway: &Gateway) -> Result<(), http::uri::InvalidUri> {
        let current = self.upstream.load_full();
        let authority: http::uri::Authority = authority_of(gateway)?;
        let client = if authority == current.authority {
            // Same upstream: keep its pooled connections.
            current.client.clone()
        } else {
            upstream_client()
        };
        self.upstream.store(Arc::new(Upstream {
            client,
            authority,
            timeout: gateway.upstream_timeout,
        }));
        // The databases stay those the gateway started with (`geoip` needs a restart).
        let geo = self.layer.policy().geo.clone();
        self.layer.set_policy(policy_of(gateway, geo));
        Ok(())
    }
}

fn authority_of(gateway: &Gateway) -> Result<http::uri::Authority, http::uri::InvalidUri> {
    gateway.upstream.trim_start_matches("http://").parse()
}

fn upstream_client() -> Client<HttpConnector, Body> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(Duration::from_secs(2)));
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector)
}

fn policy_of(gateway: &Gateway, geo: Option<Arc<GeoIp>>) -> LimitPolicy {
    LimitPolicy {
        domain: gateway.domain.clone(),
        routes: gateway.routes.clone(),
        headers: gateway.headers,
        trusted_hops: gateway.trusted_hops,
        refund_upstream_failures: gateway.refund_upstream_failures,
        geo,
        path_matching: gateway.path_matching,
    }
}

/// The gateway's router: rate limiting in front of a streaming reverse proxy to
/// `gateway.upstream`. Serve it with `into_make_service_with_connect_info::<SocketAddr>()`.
/// An upstream that is down gives 502 (504 on timeout), never 429; only a 502 for a connection
/// that could not be opened is refunded (with `refund_upstream_failures`). `geo` serves the routes'
/// `country` and `asn` actions.
///
/// # Errors
/// When `gateway.upstream` does not name a valid host and port.
pub fn gateway_router(
    engine: Arc<ArcSwap<Engine>>,
    gateway: &Gateway,
    geo: Option<Arc<GeoIp>>,
) -> Result<axum::Router, http::uri::InvalidUri> {
    reloadable_gateway(engine, gateway, geo).map(|(router, _)| router)
}

/// [`gateway_router`] with the handle that applies a reloaded configuration to it.
///
/// # Errors
/// When `gateway.upstream` does not name a valid host and port.
pub fn reloadable_gateway(
    engine: Arc<ArcSwap<Engine>>,
    gateway: &Gateway,
    geo: Option<Arc<GeoIp>>,
) -> Result<(axum::Router, GatewayHandle), http::uri::InvalidUri> {
    let (service, handle) = gateway_service(engine, gateway, geo)?;
    // As a method router's service: axum strips a `HEAD` answer's body there (HTTP/2 sends
    // whatever body it is given).
    Ok((
        axum::Router::new().fallback_service(axum::routing::any_service(service)),
        handle,
    ))
}

/// The gateway as one tower service (its limiting, then its proxy), without a router's
/// boxing per layer, with the handle that applies a reloaded configuration to it. Serve it
/// with each request's [`ConnectInfo`] extension set.
///
/// # Errors
/// When `gateway.upstream` does not name a valid host and port.
pub fn gateway_service(
    engine: Arc<ArcSwap<Engine>>,
    gateway: &Gateway,
    geo: Option<Arc<GeoIp>>,
) -> Result<(GatewayService, GatewayHandle), http::uri::InvalidUri> {
    let upstream = Arc::new(ArcSwap::from_pointee(Upstream {
        client: upstream_client(),
        authority: authority_of(gateway)?,
        timeout: gateway.upstream_timeout,
    }));
    let layer = RateLimitLayer::new(engine, policy_of(gateway, geo));
    let service = tower::Layer::layer(
        &layer,
        Proxy {
            upstream: upstream.clone(),
        },
    );
    Ok((service, GatewayHandle { layer, upstream }))
}
