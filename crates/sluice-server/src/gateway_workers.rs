//! A gateway's worker threads (workers.rs), each with its own router and upstream pool, and
//! the defences they share (one connection cap and one admission per gateway, over all its
//! workers).

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::response::Response;

use sluice_config::{Gateway, ListenerLimits};
use sluice_rls::SharedEngine;
use tokio::sync::watch;

use crate::admission::{Admission, Buffering, Door, Doors};
use crate::door_metrics::count_gateway;
use crate::error::{Result, ServerError};
use crate::guarded::ConnectionCap;
use crate::listener::overload_response;
use crate::service::Service;
use crate::workers;

/// What every gateway's workers are started with.
pub(crate) struct Shared<'a> {
    pub engine: &'a SharedEngine,
    pub service: &'a Arc<Service>,
    pub geo: Option<&'a Arc<sluice_http::GeoIp>>,
    pub limits: &'a ListenerLimits,
    pub max_connections: usize,
    pub tls: Option<&'a tokio_rustls::TlsAcceptor>,
    pub stop: &'a watch::Receiver<bool>,
    pub doors: &'a Doors,
}

/// Starts every gateway's workers; the set ends when they have all stopped.
pub(crate) fn start(
    gateway_listeners: Vec<(Vec<std::net::TcpListener>, Gateway)>,
    shared: &Shared<'_>,
) -> Result<tokio::task::JoinSet<Result<()>>> {
    let Shared {
        engine,
        service,
        geo,
        limits,
        max_connections,
        tls,
        stop,
        doors,
    } = shared;
    let mut gateways = tokio::task::JoinSet::new();
    for (listeners, gateway) in gateway_listeners {
        // One cap over all the gateway's workers; its requests may take the upstream's time.
        let cap = ConnectionCap::new("gateway", *max_connections);
        let gateway_limits = ListenerLimits {
            request_timeout: limits
                .request_timeout
                .max(gateway.upstream_timeout + Duration::from_secs(1)),
            ..(*limits).clone()
        };
        // One admission over all its workers too: the in-flight cap is the listener's.
        let admission = Admission::new(
            "gateway",
            Door::Http,
            Buffering::Prefix(limits.max_body_bytes),
            &gateway_limits,
            doors,
        );
        tracing::info!(listen = %gateway.listen, upstream = %gateway.upstream, domain = %gateway.domain, workers = listeners.len(), "gateway serving");
        for (i, listener) in listeners.into_iter().enumerate() {
            // Built here, one per worker (each its own upstream pool): a bad upstream stops the
            // start instead of a worker.
            let (gateway_service, handle) =
                sluice_http::gateway_service((*engine).clone(), &gateway, geo.cloned()).map_err(
                    |source| ServerError::Upstream {
                        upstream: gateway.upstream.to_string(),
                        source,
                    },
                )?;
            service.gateways.lock().push((gateway.listen, handle));
            let http = workers::Http {
                router: door(gateway_service, &gateway_limits, admission.clone()),
                hot: None,
                limits: gateway_limits.clone(),
                cap: cap.clone(),
                tls: tls.cloned(),
                stop: (*stop).clone(),
            };
            let worker = workers::spawn("gateway", i, listener, |l| http.serve(l))?;
            workers::join_in(&mut gateways, "gateway worker", worker);
        }
    }
    Ok(gateways)
}

/// One gateway worker's service: the listener's defences (the admission's body read, slots
/// and waiting room, the request timeout, their refusals as answers), then each response
/// guarded against a client that stops reading it (cut after `idle_timeout`,
/// admission/stalled.rs, still under the request timeout) and counted; under them the
/// gateway's limiting and proxy. One tower service composed of concrete layers: as layers of
/// a router, each boxed its future and converted its body once more per request, and the
/// gateway served a fifth fewer requests a second (docs/BENCHMARKS.md, "HTTP gateway").
fn door(
    gateway: sluice_http::GatewayService,
    limits: &ListenerLimits,
    admission: Admission,
) -> impl tower::Service<
    http::Request<axum::body::Body>,
    Response = Response,
    Error = Infallible,
    Future = impl Send,
> + Clone
+ Send
+ Sync
+ 'static {
    let (timeout, stall) = (limits.request_timeout, limits.idle_timeout);
    let defended = tower::ServiceBuilder::new()
        .layer(axum::error_handling::HandleErrorLayer::new(
            move |e: tower::BoxError| async move { overload_response(&e, timeout) },
        ))
        .layer(admission)
        .timeout(timeout)
        .and_then(move |response: http::Response<_>| async move {
            let response = response.map(axum::body::Body::new);
            Ok::<_, Infallible>(crate::admission::guard_response(response, stall).await)
        })
        .service(gateway);
    Answered(defended)
}

/// What becomes of an answer on its way out: counted, and without its body for a `HEAD`.
type Finish = fn(Result<Response, Infallible>) -> Result<Response, Infallible>;

/// The outermost step of a gateway's service ([`door`]).
#[derive(Clone)]
struct Answered<S>(S);

impl<S> tower::Service<http::Request<axum::body::Body>> for Answered<S>
where
    S: tower::Service<http::Request<axum::body::Body>, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = futures_util::future::Map<S::Future, Finish>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<axum::body::Body>) -> Self::Future {
        let finish: Finish = if request.method() == http::Method::HEAD {
            |answer| answer.map(|r| count_gateway(without_body(r)))
        } else {
            |answer| answer.map(count_gateway)
        };
        futures_util::FutureExt::map(self.0.call(request), finish)
    }
}

/// The answer to a `HEAD` request: its head, the length its body would have had, no body.
/// HTTP/1 leaves a `HEAD` answer's body out by itself, HTTP/2 sends what it is given (and a
/// client resets the stream): the gateway's own answers (429, 503, 502) have bodies.
fn without_body(response: Response) -> Response {
    use hyper::body::Body as _;
    let (mut parts, body) = response.into_parts();
    if !parts.headers.contains_key(http::header::CONTENT_LENGTH)
        && let Some(length) = body.size_hint().exact()
    {
        parts.headers.insert(
            http::header::CONTENT_LENGTH,
            http::HeaderValue::from(length),
        );
    }
    Response::from_parts(parts, axum::body::Body::empty())
}
