//! The admin listener's endpoints: the probes, the status page and `/status.json`,
//! `/rlconfig`, `/metrics` and `POST /reload` (docs/OPERATIONS.md).

use std::sync::Arc;

use axum::http::StatusCode;

use crate::access::Token;
use crate::host_check::AllowedHosts;
use crate::service::Service;

/// The admin endpoints; with a token, every one but the probes (`/healthz`, `/readyz`) needs
/// it; without one, they answer only to the hosts `hosts` allows (DNS rebinding).
pub(crate) fn admin_router(
    service: Arc<Service>,
    token: Option<Token>,
    hosts: AllowedHosts,
) -> axum::Router {
    use axum::routing::get;
    let open = axum::Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(
                |axum::extract::State(s): axum::extract::State<Arc<Service>>| async move {
                    let engine = s.engine.load();
                    let doors = s.doors.report();
                    let shedding: Vec<&str> = doors.shedding().map(|d| d.listener).collect();
                    if !shedding.is_empty() {
                        // Turning calls away: a load balancer should send them elsewhere.
                        return (
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!(
                                "shedding requests on {} (see /status.json `listeners`)\n",
                                shedding.join(", ")
                            ),
                        );
                    }
                    // A shared store must have answered once; the memory store is always there.
                    if s.store_is_memory
                        || engine.store_reached()
                        || engine.flush_interval().is_none()
                    {
                        (StatusCode::OK, "ready\n".to_owned())
                    } else {
                        (
                            StatusCode::SERVICE_UNAVAILABLE,
                            "the store has not been reached yet\n".to_owned(),
                        )
                    }
                },
            ),
        )
        .with_state(service.clone());
    let protected = match token {
        Some(token) => with_token(admin_protected(service), Some(token)),
        None => admin_protected(service).layer(axum::middleware::from_fn_with_state(
            hosts,
            crate::host_check::require_known_host,
        )),
    };
    open.merge(protected)
}

/// `router` behind a bearer token, when one is configured.
pub(crate) fn with_token(router: axum::Router, token: Option<Token>) -> axum::Router {
    match token {
        Some(token) => router.layer(axum::middleware::from_fn_with_state(
            token,
            crate::access::require_bearer,
        )),
        None => router,
    }
}

fn admin_protected(service: Arc<Service>) -> axum::Router {
    use axum::routing::{get, post};
    axum::Router::new()
        .route(
            "/",
            get(
                |axum::extract::State(s): axum::extract::State<Arc<Service>>| async move {
                    let status = s.book.status(&s.engine.load(), &s.doors);
                    axum::response::Html(crate::status_page::render(&status))
                },
            ),
        )
        .route(
            "/rlconfig",
            get(
                |axum::extract::State(s): axum::extract::State<Arc<Service>>| async move {
                    s.rules_text.lock().clone()
                },
            ),
        )
        .route(
            "/status.json",
            get(
                |axum::extract::State(s): axum::extract::State<Arc<Service>>| async move {
                    axum::Json(s.book.status(&s.engine.load(), &s.doors))
                },
            ),
        )
        .route(
            "/metrics",
            get(
                |axum::extract::State(s): axum::extract::State<Arc<Service>>| async move {
                    s.prometheus.render()
                },
            ),
        )
        .route(
            "/reload",
            post(
                |axum::extract::State(s): axum::extract::State<Arc<Service>>| async move {
                    match s.reload("http").await {
                        Ok(m) => (StatusCode::OK, format!("{m}\n")),
                        Err(e) => (
                            StatusCode::UNPROCESSABLE_ENTITY,
                            format!("reload failed, the running rules stay: {e}\n"),
                        ),
                    }
                },
            ),
        )
        .with_state(service)
}
