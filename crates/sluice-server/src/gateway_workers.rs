//! A gateway's worker threads (workers.rs), each with its own router and upstream pool, and
//! the defences they share (one connection cap and one admission per gateway, over all its
//! workers).

use std::sync::Arc;
use std::time::Duration;

use sluice_config::{Gateway, ListenerLimits};
use sluice_rls::SharedEngine;
use tokio::sync::watch;

use crate::admission::{Admission, Buffering, Door, Doors};
use crate::error::{Result, ServerError};
use crate::guarded::ConnectionCap;
use crate::listener::protect;
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
            let http = workers::Http {
                router,
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
