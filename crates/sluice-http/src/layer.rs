//! `RateLimitLayer` and the `RateLimit` service it builds.

use std::borrow::Cow;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use http::{Request, Response, StatusCode};
use http_body_util::{Either, Full};
use sluice_config::{HeaderStyle, PathMatching, Route};
use sluice_engine::{Engine, Verdict};

use crate::actions::{Descriptor, RequestParts, descriptors};
use crate::client_ip::client_address;
use crate::headers::{add_rate_limit_headers, rate_limit_fields, retry_after_secs};
use crate::method_override::check_method_override;
use crate::path::normalize_path;
use crate::route::{RoutePath, find_route};
use crate::single_value::check_single_inputs;

/// How a gateway or service limits: the domain its rules live in, its routes (first match
/// wins; each builds descriptors and has a cost), the header style, and how many
/// `X-Forwarded-For` hops to trust for the client address.
#[derive(Clone, Debug)]
pub struct LimitPolicy {
    /// Rule domain.
    pub domain: String,
    /// Routes.
    pub routes: Vec<Route>,
    /// Response headers.
    pub headers: HeaderStyle,
    /// Trusted proxies in front of this one (0: the peer address is the client).
    pub trusted_hops: usize,
    /// Give the cost back when the inner service's response carries [`UpstreamFailed`] (the
    /// gateway marks its own 502 when it could not connect to the upstream, so the request was
    /// never sent): the request provably did no work upstream.
    pub refund_upstream_failures: bool,
    /// The databases of the `country` and `asn` actions ([`crate::GeoIp`]); without them those
    /// actions skip their descriptor.
    pub geo: Option<Arc<crate::GeoIp>>,
    /// How request paths are compared with the routes; the default (every field `false`)
    /// matches each spelling an upstream serves as one resource (`/login/`, `/LOGIN`,
    /// `/login;jsessionid=1`, `HEAD` on a `GET` route) to the one route, reads a query
    /// parameter in each spelling an upstream reads (`;` separators, names in any case), and
    /// refuses a request that names another method than its own.
    pub path_matching: PathMatching,
}

/// A response extension saying the request provably did no work upstream: it was never
/// sent (the connection to the upstream could not be opened). With
/// [`LimitPolicy::refund_upstream_failures`] the layer gives the request's cost back. The
/// gateway sets it only on its own 502 for a failed connection, never on a timeout, a
/// connection lost after sending, or any answer of the upstream (those may have done the work,
/// and a client that slows its own request down could make them at will). An inner service
/// should set it under the same condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpstreamFailed;

struct Shared {
    engine: Arc<ArcSwap<Engine>>,
    policy: ArcSwap<LimitPolicy>,
}

/// A `tower::Layer` that limits requests with a Sluice engine before they reach the inner
/// service. Denied requests get `429 Too Many Requests` with `Retry-After`, the configured
/// rate-limit headers and a small JSON body; denied gRPC calls get status `RESOURCE_EXHAUSTED`
/// (HTTP 200, `grpc-status: 8`) with the same headers as metadata. Allowed requests carry the
/// headers too. Shadow-mode rules only count. Works with axum, hyper and tonic services.
#[derive(Clone)]
pub struct RateLimitLayer {
    shared: Arc<Shared>,
}

impl RateLimitLayer {
    /// A layer over `engine` (swapped on reload by whoever holds it) with `policy`.
    pub fn new(engine: Arc<ArcSwap<Engine>>, policy: LimitPolicy) -> Self {
        Self {
            shared: Arc::new(Shared {
                engine,
                policy: ArcSwap::from_pointee(policy),
            }),
        }
    }

    /// Replaces the policy of this layer and of every service it built (a reload): requests
    /// already deciding finish with the old one.
    pub fn set_policy(&self, policy: LimitPolicy) {
        self.shared.policy.store(Arc::new(policy));
    }

    /// The policy in use.
    pub fn policy(&self) -> Arc<LimitPolicy> {
        self.shared.policy.load_full()
    }
}

impl<S> tower::Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service of [`RateLimitLayer`].
#[derive(Clone)]
pub struct RateLimit<S> {
    inner: S,
    shared: Arc<Shared>,
}

/// The peer address, from axum's `ConnectInfo` or a plain `SocketAddr` extension.
/// Canonical (an IPv4-mapped address is IPv4) in [`client_address`].
fn peer<B>(req: &Request<B>) -> Option<IpAddr> {
    req.extensions()
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
        .or_else(|| req.extensions().get::<SocketAddr>().map(SocketAddr::ip))
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, ResBody> tower::Service<Request<B>> for RateLimit<S>
where
    S: tower::Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    B: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<Either<ResBody, Full<bytes_alias::Bytes>>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        // The clone that was polled ready serves this call (tower's usual dance).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        Box::pin(async move {
            let policy = shared.policy.load_full();
            if let Err(message) = normalize_request_path(&mut req) {
                return Ok(bad_request(&message));
            }
            let matching = policy.path_matching;
            let route_path = match RoutePath::new(req.uri().path(), matching) {
                Ok(p) => p,
                Err(e) => return Ok(bad_request(&e.to_string())),
            };
            // A request that names another method is served as that method by some upstreams
            // and as its own by others: routes that tell methods apart cannot count it right.
            if let Err(e) = check_method_override(
                &policy.routes,
                req.method(),
                req.headers(),
                req.uri().query(),
                matching,
            ) {
                return Ok(bad_request(&e.to_string()));
            }
            let Some(route) = find_route(&policy.routes, req.method(), &route_path) else {
                return inner.call(req).await.map(|r| r.map(Either::Left));
            };
            // The upstream must not read an input copy the limiter did not count.
            if let Err(e) =
                check_single_inputs(route, req.headers(), req.uri().query(), matching.into())
            {
                return Ok(bad_request(&e.to_string()));
            }
            let canonical = route_path.canonical();
            let parts = RequestParts {
                method: req.method(),
                path: &canonical,
                query: req.uri().query(),
                headers: req.headers(),
                client: client_address(req.headers(), peer(&req), policy.trusted_hops),
                geo: policy.geo.as_deref(),
                head_as_get: !matching.strict_head,
                query_reading: matching.into(),
            };
            let built = descriptors(route, &parts);
            if built.is_empty() {
                return inner.call(req).await.map(|r| r.map(Either::Left));
            }
            let engine = shared.engine.load_full();
            // An unknown domain means no rules: never fail a request because of the limiter.
            let Ok(verdict) = engine.check(&policy.domain, &built, route.cost).await else {
                return inner.call(req).await.map(|r| r.map(Either::Left));
            };
            if !verdict.allowed {
                return Ok(refusal(&verdict, is_grpc(req.headers()), policy.headers));
            }
            let fields = rate_limit_fields(&verdict, policy.headers);
            drop(verdict);
            // Owned only when a refund may need them (the request goes to the inner service).
            let refund = policy
                .refund_upstream_failures
                .then(|| (owned_descriptors(&built), route.cost));
            let mut response = inner.call(req).await?.map(Either::Left);
            if let Some((descriptors, cost)) = refund
                && response.extensions().get::<UpstreamFailed>().is_some()
            {
                for d in &descriptors {
                    // A rule that cannot take a refill (exact mode) keeps the count.
                    let _ = engine.refill(&policy.domain, d, cost);
                }
            }
            fields.insert_into(response.headers_mut());
            Ok(response)
        })
    }
}

/// Routes match, and the inner service sees, the normalized path: `//login` and `/%6cogin`
/// are `/login` here as they are upstream. The error is the 400's message.
fn normalize_request_path<B>(req: &mut Request<B>) -> Result<(), String> {
    match normalize_path(req.uri().path()) {
        Err(e) => Err(e.to_string()),
        Ok(Cow::Borrowed(_)) => Ok(()),
        Ok(Cow::Owned(path)) => match with_path(req.uri(), &path) {
            Some(uri) => {
                *req.uri_mut() = uri;
                Ok(())
            }
            None => Err("invalid request target".to_owned()),
        },
    }
}

/// The answer to a denied request: a gRPC refusal for a gRPC call, a 429 otherwise.
fn refusal<T>(
    verdict: &Verdict<'_>,
    grpc: bool,
    style: HeaderStyle,
) -> Response<Either<T, Full<bytes_alias::Bytes>>> {
    if grpc {
        grpc_refusal(verdict, style)
    } else {
        http_refusal(verdict, style)
    }
}

/// gRPC clients read the status, not the HTTP code (they would turn a 429 into UNAVAILABLE,
/// which invites retries): a trailers-only response with RESOURCE_EXHAUSTED, the rate-limit
/// headers as metadata.
fn grpc_refusal<T>(
    verdict: &Verdict<'_>,
    style: HeaderStyle,
) -> Response<Either<T, Full<bytes_alias::Bytes>>> {
    let retry = retry_after_secs(verdict);
    let mut response = Response::new(Either::Right(Full::new(bytes_alias::Bytes::new())));
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    headers.insert("grpc-status", http::HeaderValue::from_static("8"));
    if let Ok(message) =
        http::HeaderValue::from_str(&format!("rate limited; retry after {retry} s"))
    {
        headers.insert("grpc-message", message);
    }
    headers.insert(http::header::RETRY_AFTER, http::HeaderValue::from(retry));
    add_rate_limit_headers(headers, verdict, style);
    response
}

/// `429 Too Many Requests` with `Retry-After`, the rate-limit headers and a small JSON body.
fn http_refusal<T>(
    verdict: &Verdict<'_>,
    style: HeaderStyle,
) -> Response<Either<T, Full<bytes_alias::Bytes>>> {
    let retry = retry_after_secs(verdict);
    let body =
        serde_json::json!({ "error": "too many requests", "retry_after_s": retry }).to_string();
    let mut response = Response::new(Either::Right(Full::new(bytes_alias::Bytes::from(body))));
    *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    headers.insert(http::header::RETRY_AFTER, http::HeaderValue::from(retry));
    add_rate_limit_headers(headers, verdict, style);
    response
}

/// The descriptors, owned, for a refund after the inner service answered.
fn owned_descriptors(built: &[Descriptor<'_>]) -> Vec<Vec<(String, String)>> {
    built
        .iter()
        .map(|d| {
            d.iter()
                .map(|(k, v)| ((*k).to_owned(), v.to_string()))
                .collect()
        })
        .collect()
}

/// `uri` with its path replaced (query kept).
fn with_path(uri: &http::Uri, path: &str) -> Option<http::Uri> {
    let path_and_query = match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_owned(),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(path_and_query.parse().ok()?);
    http::Uri::from_parts(parts).ok()
}

fn bad_request<T>(message: &str) -> Response<Either<T, Full<bytes_alias::Bytes>>> {
    let body = serde_json::json!({ "error": message }).to_string();
    let mut response = Response::new(Either::Right(Full::new(bytes_alias::Bytes::from(body))));
    *response.status_mut() = StatusCode::BAD_REQUEST;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

/// Whether a request is a gRPC call (`content-type: application/grpc`, `application/grpc+proto`,
/// ...).
fn is_grpc(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.strip_prefix("application/grpc").is_some_and(|rest| {
                rest.is_empty() || rest.starts_with('+') || rest.starts_with(';')
            })
        })
}

/// `bytes` as re-exported by axum (no direct dependency needed).
mod bytes_alias {
    pub use axum::body::Bytes;
}
