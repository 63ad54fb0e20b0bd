//! Rate limiting an axum service in process: 5 requests per minute per `x-api-key`, headers
//! in the IETF draft style, the embedded memory store.
//!
//! Run: `cargo run -p sluice-http --example axum_layer`, then
//! `curl -i -H 'x-api-key: k1' localhost:3001/hello` six times.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use arc_swap::ArcSwap;
use sluice_config::HeaderStyle;
use sluice_core::{Clock, CoarseClock};
use sluice_engine::{Engine, EngineOptions};
use sluice_http::{LimitPolicy, RateLimitLayer};
use sluice_store::MemoryStore;

const RULES: &str = "domain: app\ndescriptors:\n  - key: api_key\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n";
const ROUTES: &str = "gateways:\n  - listen: 127.0.0.1:1\n    upstream: http://127.0.0.1:2\n    domain: app\n    routes:\n      - match: { path_prefix: / }\n        rate_limits:\n          - actions:\n              - request_headers: { header_name: x-api-key, descriptor_key: api_key }\n";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Routes and actions use the same types as `sluice.yaml`'s `gateways:` section.
    let config = sluice_config::parse_service(Path::new("routes.yaml"), ROUTES)?;
    let rules = sluice_config::RuleSet::new(vec![sluice_config::parse_domain(
        Path::new("rules.yaml"),
        RULES,
    )?])?;

    let clock: Arc<dyn Clock> = Arc::new(CoarseClock::new());
    let store = Arc::new(MemoryStore::new(clock.clone()));
    let engine = Engine::new(
        &rules,
        &Default::default(),
        store,
        clock,
        EngineOptions {
            shared_store: false,
            ..Default::default()
        },
    );
    let layer = RateLimitLayer::new(
        Arc::new(ArcSwap::from_pointee(engine)),
        LimitPolicy {
            domain: "app".into(),
            routes: config.gateways[0].routes.clone(),
            headers: HeaderStyle::Ietf,
            trusted_hops: 0,
            refund_upstream_failures: false,
            geo: None,
            path_matching: Default::default(),
        },
    );
    let app = axum::Router::new()
        .route("/hello", axum::routing::get(|| async { "hello\n" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3001").await?;
    println!("listening on http://127.0.0.1:3001/hello");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
