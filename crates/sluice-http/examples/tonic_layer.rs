//! The same layer in a tonic server: here in front of Sluice's own Envoy RLS service, limiting
//! its callers by their `x-client-id` metadata (gRPC metadata travels as HTTP/2 headers).
//!
//! Run: `cargo run -p sluice-http --example tonic_layer` (listens on 127.0.0.1:50051).
//! A denied call gets the gRPC status `RESOURCE_EXHAUSTED` (with `retry-after` metadata).

use std::path::Path;
use std::sync::Arc;

use arc_swap::ArcSwap;
use sluice_config::HeaderStyle;
use sluice_core::{Clock, CoarseClock};
use sluice_engine::{Engine, EngineOptions};
use sluice_http::{LimitPolicy, RateLimitLayer};
use sluice_store::MemoryStore;

const RULES: &str = "domain: grpc\ndescriptors:\n  - key: client\n    rate_limit: { unit: second, requests_per_unit: 100 }\n";
const ROUTES: &str = "gateways:\n  - listen: 127.0.0.1:1\n    upstream: http://127.0.0.1:2\n    domain: grpc\n    routes:\n      - match: { path_prefix: / }\n        rate_limits:\n          - actions:\n              - request_headers: { header_name: x-client-id, descriptor_key: client }\n";

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
    let engine = Arc::new(ArcSwap::from_pointee(Engine::new(
        &rules,
        &Default::default(),
        store,
        clock,
        EngineOptions {
            shared_store: false,
            ..Default::default()
        },
    )));
    let layer = RateLimitLayer::new(
        engine.clone(),
        LimitPolicy {
            domain: "grpc".into(),
            routes: config.gateways[0].routes.clone(),
            headers: HeaderStyle::None,
            trusted_hops: 0,
            refund_upstream_failures: false,
            geo: None,
            path_matching: Default::default(),
        },
    );
    println!("gRPC on 127.0.0.1:50051");
    tonic::transport::Server::builder()
        .layer(layer)
        .add_service(sluice_rls::grpc_service(engine, Default::default()))
        .serve("127.0.0.1:50051".parse()?)
        .await?;
    Ok(())
}
