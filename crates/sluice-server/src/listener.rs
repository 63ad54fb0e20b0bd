//! How every listener of `sluice serve` defends itself: an accept loop with a connection cap
//! and per-connection idle timeouts, hyper's header-read timeout and size limits, and in
//! front of the routes a request timeout, a cap on requests in flight that sheds load at
//! once (503) rather than queueing, and a body limit.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::extract::{ConnectInfo, DefaultBodyLimit};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use http::StatusCode;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use sluice_config::ListenerLimits;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt as _;

use crate::admission::{Admission, Refusal};
use crate::guarded::{ConnectionCap, Guarded};
use crate::hot_lane::HotLane;
use crate::tls::{Conn, handshake};

/// The router behind the request-level defences: its body read first (`admission`: within
/// `body_read_timeout`, in a bounded waiting room), then one of `max_requests_in_flight`
/// slots (503 beyond, at once), `request_timeout` per request (408), `max_body_bytes` for
/// bodies read whole (413).
pub(crate) fn protect(
    router: axum::Router,
    limits: &ListenerLimits,
    admission: Admission,
) -> axum::Router {
    let timeout = limits.request_timeout;
    router
        .layer(DefaultBodyLimit::max(limits.max_body_bytes))
        .layer(
            tower::ServiceBuilder::new()
                .layer(HandleErrorLayer::new(
                    move |e: tower::BoxError| async move { overload_response(&e, timeout) },
                ))
                .layer(admission)
                .timeout(timeout),
        )
}

/// The answer to a request the listener's defences refused, or that ran past the timeout.
pub(crate) fn overload_response(e: &tower::BoxError, timeout: Duration) -> Response {
    let (status, message) = if let Some(refusal) = e.downcast_ref::<Refusal>() {
        let status = match refusal {
            Refusal::Busy => StatusCode::SERVICE_UNAVAILABLE,
            Refusal::Evicted | Refusal::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Refusal::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Refusal::BodyError => StatusCode::BAD_REQUEST,
        };
        (status, refusal.to_string())
    } else if e.is::<tower::timeout::error::Elapsed>() {
        (
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request was not complete within {} ms",
                timeout.as_millis()
            ),
        )
    } else {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal error".to_owned(),
        )
    };
    let mut response =
        (status, axum::Json(serde_json::json!({ "error": message }))).into_response();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        response
            .headers_mut()
            .insert(http::header::RETRY_AFTER, http::HeaderValue::from(1));
    }
    response
}

fn connection_builder(limits: &ListenerLimits) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_header_bytes);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.http2_max_concurrent_streams)
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX));
    builder
}

/// Waits for the next connection the cap admits. Accept errors (the process is out of file
/// descriptors, say) are counted and retried after a pause instead of spinning.
async fn next_connection(
    listener: &TcpListener,
    cap: &ConnectionCap,
    idle: Duration,
) -> (Guarded<TcpStream>, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let Some(slot) = cap.admit() else {
                    drop(stream);
                    continue;
                };
                let _ = stream.set_nodelay(true);
                return (Guarded::new(stream, idle, slot), peer);
            }
            Err(e) => {
                metrics::counter!("sluice_accept_errors_total", "listener" => cap.listener())
                    .increment(1);
                tracing::debug!(listener = cap.listener(), error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// What a listener serves: a router, or a gateway's composed service.
pub(crate) trait HttpService:
    tower::Service<
        http::Request<axum::body::Body>,
        Response = Response,
        Error = std::convert::Infallible,
        Future: Send,
    > + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S> HttpService for S where
    S: tower::Service<
            http::Request<axum::body::Body>,
            Response = Response,
            Error = std::convert::Infallible,
            Future: Send,
        > + Clone
        + Send
        + Sync
        + 'static
{
}

/// Serves `router` on `listener` (over TLS when `tls` is set) until `stop` turns true, then
/// lets the requests in flight finish (for at most the request timeout).
pub(crate) async fn serve_http(
    listener: TcpListener,
    router: impl HttpService,
    hot: Option<Arc<HotLane>>,
    limits: ListenerLimits,
    cap: ConnectionCap,
    tls: Option<TlsAcceptor>,
    mut stop: watch::Receiver<bool>,
) {
    let builder = Arc::new(connection_builder(&limits));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let (io, peer) = tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            next = next_connection(&listener, &cap, limits.idle_timeout) => next,
        };
        let (router, hot) = (router.clone(), hot.clone());
        let service = hyper::service::service_fn(move |req: http::Request<Incoming>| {
            let (router, hot) = (router.clone(), hot.clone());
            async move {
                let hot = hot
                    .as_deref()
                    .and_then(|lane| Some((lane, lane.route(&req)?)));
                let mut req = match hot {
                    Some((lane, route)) => match lane.serve(route, req).await {
                        Ok(response) => return Ok(response),
                        Err(req) => req,
                    },
                    None => req.map(axum::body::Body::new),
                };
                req.extensions_mut().insert(ConnectInfo(peer));
                router.oneshot(req).await
            }
        });
        let (builder, tls, watcher) = (builder.clone(), tls.clone(), graceful.watcher());
        let (handshake_timeout, listener_name) = (limits.header_read_timeout, cap.listener());
        tokio::spawn(async move {
            let Some(io) = handshake(tls.as_ref(), io, handshake_timeout, listener_name).await
            else {
                return;
            };
            let connection = builder
                .serve_connection_with_upgrades(TokioIo::new(io), service)
                .into_owned();
            let _ = watcher.watch(connection).await;
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(limits.request_timeout, graceful.shutdown()).await;
}

/// The gRPC listener's connections, under the same cap and idle timeout, over TLS when `tls`
/// is set (each handshake in its own task, within `handshake_timeout`). The listener closes
/// when the server drops the stream.
pub(crate) fn guarded_incoming(
    listener: TcpListener,
    cap: ConnectionCap,
    idle: Duration,
    tls: Option<TlsAcceptor>,
    handshake_timeout: Duration,
) -> impl Stream<Item = std::io::Result<Conn>> {
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Conn>>(64);
    tokio::spawn(async move {
        loop {
            let (io, _) = tokio::select! {
                _ = tx.closed() => break,
                next = next_connection(&listener, &cap, idle) => next,
            };
            let (tx, tls) = (tx.clone(), tls.clone());
            tokio::spawn(async move {
                if let Some(conn) = handshake(tls.as_ref(), io, handshake_timeout, "grpc").await {
                    let _ = tx.send(Ok(conn)).await;
                }
            });
        }
    });
    futures_util::stream::unfold(rx, |mut rx| async move {
        let conn = rx.recv().await?;
        Some((conn, rx))
    })
}

/// Raises the soft limit on open files to the hard limit, and returns how many connections
/// each API listener may hold so that, all full at once, the admin listener and the process
/// (store connections, files) still have descriptors: `max_connections` or less.
pub(crate) fn connection_budget(limits: &ListenerLimits, api_listeners: usize) -> usize {
    use rustix::process::{Resource, getrlimit, setrlimit};
    const RESERVE: u64 = 256;
    let mut nofile = getrlimit(Resource::Nofile);
    if nofile.current < nofile.maximum {
        nofile.current = nofile.maximum;
        if setrlimit(Resource::Nofile, nofile).is_err() {
            nofile = getrlimit(Resource::Nofile);
        }
    }
    let Some(available) = nofile.current else {
        return limits.max_connections;
    };
    let spare = available.saturating_sub(RESERVE + limits.admin_max_connections as u64);
    let per_listener = usize::try_from(spare / api_listeners.max(1) as u64)
        .unwrap_or(usize::MAX)
        .max(1);
    if per_listener < limits.max_connections {
        if limits.max_connections_written {
            tracing::warn!(
                open_files = available,
                listeners = api_listeners,
                configured = limits.max_connections,
                used = per_listener,
                "listeners.max_connections does not fit the open-file limit; each API listener takes fewer so that admin keeps answering (raise the hard limit: `LimitNOFILE=` in a systemd unit, `ulimit -Hn` as root)"
            );
        } else {
            tracing::info!(
                open_files = available,
                listeners = api_listeners,
                used = per_listener,
                "each API listener takes at most this many connections, to fit the open-file limit"
            );
        }
        return per_listener;
    }
    limits.max_connections
}
