//! A gateway's worker threads: the listening sockets they share (`SO_REUSEPORT`), one thread
//! with its own single-threaded runtime and router per worker, and the defences they share
//! (one connection cap and one admission per gateway, over all its workers).

use std::sync::Arc;
use std::time::Duration;

use sluice_config::{Gateway, ListenerLimits};
use sluice_rls::SharedEngine;
use tokio::sync::watch;

use crate::admission::{Admission, Buffering, Door, Doors};
use crate::error::{Result, ServerError};
use crate::guarded::ConnectionCap;
use crate::listener::{protect, serve_http};
use crate::service::Service;

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
            let (router, handle) =
                sluice_http::reloadable_gateway((*engine).clone(), &gateway, geo.cloned())
                    .map_err(|source| ServerError::Upstream {
                        upstream: gateway.upstream.to_string(),
                        source,
                    })?;
            service.gateways.lock().push((gateway.listen, handle));
            // A response the client stops reading is cut after idle_timeout (admission/stalled.rs).
            let router = router.layer(axum::middleware::from_fn_with_state(
                gateway_limits.idle_timeout,
                crate::admission::guard_responses,
            ));
            let router = protect(router, &gateway_limits, admission.clone()).layer(
                axum::middleware::from_fn(crate::door_metrics::count_gateway),
            );
            let worker = spawn_gateway_worker(
                i,
                listener,
                router,
                gateway_limits.clone(),
                cap.clone(),
                tls.cloned(),
                (*stop).clone(),
            )?;
            gateways.spawn_blocking(move || {
                worker
                    .join()
                    .unwrap_or_else(|_| Err(ServerError::task("gateway worker", "it panicked")))
            });
        }
    }
    Ok(gateways)
}

/// Gateway worker threads when the config does not say: one per CPU.
pub(crate) fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// `count` listening sockets on one address, spread over by the kernel (`SO_REUSEPORT`): one
/// per gateway worker thread, as nginx's workers do. A plain bind first checks that no other
/// process listens there (sockets with `SO_REUSEPORT` would otherwise share the port with
/// another `sluice serve` of the same user without a word) and picks the port for `:0`.
pub(crate) fn bind_workers(
    addr: std::net::SocketAddr,
    count: usize,
) -> Result<Vec<std::net::TcpListener>> {
    let open = |addr: std::net::SocketAddr, reuse_port: bool| -> std::io::Result<socket2::Socket> {
        let socket = socket2::Socket::new(
            socket2::Domain::for_address(addr),
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )?;
        socket.set_reuse_address(true)?;
        socket.set_reuse_port(reuse_port)?;
        socket.set_nonblocking(true)?;
        socket.bind(&addr.into())?;
        Ok(socket)
    };
    let failed = |source| ServerError::Listen {
        listener: "gateway",
        addr,
        source,
    };
    let bound = {
        let probe = open(addr, false).map_err(failed)?;
        probe.listen(1).map_err(failed)?;
        let local = probe.local_addr().map_err(failed)?;
        local
            .as_socket()
            .ok_or_else(|| failed(std::io::Error::other("the socket has no IP address")))?
    };
    (0..count.max(1))
        .map(|_| {
            let socket = open(bound, true).map_err(failed)?;
            socket.listen(1024).map_err(failed)?;
            Ok(socket.into())
        })
        .collect()
}

/// One gateway worker: a thread with its own single-threaded runtime, listener and router
/// (with its own upstream connection pool), so a request never crosses threads (no work
/// stealing, no shared pool lock). The engine is shared; its flush runs on the main runtime.
fn spawn_gateway_worker(
    index: usize,
    listener: std::net::TcpListener,
    router: axum::Router,
    limits: ListenerLimits,
    cap: ConnectionCap,
    tls: Option<tokio_rustls::TlsAcceptor>,
    stop: watch::Receiver<bool>,
) -> Result<std::thread::JoinHandle<Result<()>>> {
    std::thread::Builder::new()
        .name(format!("gateway-{index}"))
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|source| ServerError::Start {
                    what: "cannot start a gateway worker's runtime",
                    source,
                })?;
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).map_err(|source| {
                    ServerError::Start {
                        what: "cannot register the gateway listener",
                        source,
                    }
                })?;
                serve_http(listener, router, limits, cap, tls, stop).await;
                Ok(())
            })
        })
        .map_err(|source| ServerError::Start {
            what: "cannot start a gateway worker thread",
            source,
        })
}
