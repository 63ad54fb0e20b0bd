//! Sluice's rate-limit service front doors over the engine:
//!
//! - the Envoy RLS gRPC API (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`),
//!   so Envoy, Istio, Contour, Gloo and Emissary can call Sluice in place of Envoy's ratelimit
//!   service ([`grpc_service`]);
//! - Envoy ratelimit's `/json` endpoint and an HTTP/JSON API for applications:
//!   `POST /v1/acquire`, `POST /v1/refill`, `POST /v1/acquire/batch` ([`http_router`]).
//!
//! - Envoy's Rate Limit Quota Service (`envoy.service.rate_limit_quota.v3`), whose streams
//!   carry usage reports and quota assignments, with no call per request ([`rlqs`]).
//!
//! All read the engine through a [`SharedEngine`], which `sluice serve` swaps on reload.

mod adhoc;
mod adhoc_arrivals;
mod api;
mod error;
mod grpc;
mod hot;
mod json;
mod metadata;
pub mod rlqs;

use std::sync::Arc;

use arc_swap::ArcSwap;
use sluice_engine::Engine;

pub use adhoc::AdhocLimit;
pub use api::{AcquireRequest, AcquireResponse, ApiDescriptor, ApiEntry, RefillRequest};
pub use error::RequestError;
pub use grpc::{RateLimitGrpc, SHOULD_RATE_LIMIT_PATH, grpc_service, grpc_service_shared};
pub use hot::{HotRoute, HotRoutes};

/// The engine in use; `sluice serve` stores a new one on reload.
pub type SharedEngine = Arc<ArcSwap<Engine>>;

/// The options in use; `sluice serve` stores new ones on reload (`api.domain`,
/// `rls.response_headers`). The size limits and `max_body` are read when a door is built.
pub type SharedOptions = Arc<ArcSwap<RlsOptions>>;

/// Limits on what requests may carry, and response options.
#[derive(Clone, Debug)]
pub struct RlsOptions {
    /// Longest descriptor key, in bytes.
    pub max_key_len: usize,
    /// Longest descriptor value, in bytes.
    pub max_value_len: usize,
    /// Most descriptors per request.
    pub max_descriptors: usize,
    /// Most entries per descriptor.
    pub max_entries: usize,
    /// Largest HTTP request body, in bytes.
    pub max_body: usize,
    /// Add `x-ratelimit-limit`, `-remaining`, `-reset` to gRPC responses (as Envoy's ratelimit
    /// service does with `LIMIT_RESPONSE_HEADERS_ENABLED`).
    pub response_headers: bool,
    /// Domain of `/v1/acquire` and `/v1/refill`.
    pub api_domain: String,
    /// Keys all ad-hoc limits (`/v1/acquire` with `limit`) keep at once; a new key beyond them
    /// is refused (`api.adhoc_max_keys`).
    pub adhoc_max_keys: usize,
}

impl Default for RlsOptions {
    fn default() -> Self {
        Self {
            max_key_len: 256,
            max_value_len: 1024,
            max_descriptors: 64,
            max_entries: 32,
            max_body: 1024 * 1024,
            response_headers: false,
            api_domain: "default".to_owned(),
            adhoc_max_keys: sluice_config::DEFAULT_ADHOC_MAX_KEYS,
        }
    }
}

/// The HTTP routes: `/json`, `/v1/acquire`, `/v1/acquire/batch`, `/v1/refill`.
pub fn http_router(engine: SharedEngine, options: RlsOptions) -> axum::Router {
    http_router_shared(engine, Arc::new(ArcSwap::from_pointee(options)))
}

/// [`http_router`] with options the caller may swap while it serves.
pub fn http_router_shared(engine: SharedEngine, options: SharedOptions) -> axum::Router {
    http_api(engine, options).0
}

/// [`http_router_shared`] and its [`HotRoutes`] over the same state (one table of ad-hoc
/// limits, one engine): a listener may answer the hot routes itself and hand the rest to the
/// router.
pub fn http_api(engine: SharedEngine, options: SharedOptions) -> (axum::Router, HotRoutes) {
    let max_body = options.load().max_body;
    let state = Arc::new(api::ApiState::new(engine, options));
    let hot = HotRoutes::new(state.clone(), max_body);
    let router = axum::Router::new()
        .route("/json", axum::routing::post(json::should_rate_limit))
        .route("/v1/acquire", axum::routing::post(api::acquire))
        .route("/v1/acquire/batch", axum::routing::post(api::acquire_batch))
        .route("/v1/refill", axum::routing::post(api::refill))
        .layer(axum::extract::DefaultBodyLimit::max(max_body))
        .with_state(state);
    (router, hot)
}
