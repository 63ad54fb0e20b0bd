//! The layer in front of a real tonic server, called by a real tonic client over loopback: a
//! call over the limit gets the gRPC status RESOURCE_EXHAUSTED, not an HTTP 429 (which gRPC
//! clients would report as UNAVAILABLE and retry).

use std::path::Path;
use std::sync::Arc;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice_config::HeaderStyle;
use sluice_core::{Clock, CoarseClock};
use sluice_engine::{Engine, EngineOptions};
use sluice_http::{LimitPolicy, RateLimitLayer};
use sluice_store::MemoryStore;

#[tokio::test]
async fn grpc_calls_over_the_limit_get_resource_exhausted() {
    // The layer limits callers by their `x-client-id` metadata to 3 calls a minute; the inner
    // service is Sluice's own RLS service (any tonic service would do).
    let rules = sluice_config::RuleSet::new(vec![
        sluice_config::parse_domain(
            Path::new("rules.yaml"),
            "domain: grpc\ndescriptors:\n  - key: client\n    rate_limit: { unit: minute, requests_per_unit: 3 }\n  - key: d\n    rate_limit: { unit: minute, requests_per_unit: 1000 }\n",
        )
        .unwrap(),
    ])
    .unwrap();
    let config = sluice_config::parse_service(
        Path::new("routes.yaml"),
        "gateways:\n  - listen: 127.0.0.1:1\n    upstream: http://127.0.0.1:2\n    domain: grpc\n    routes:\n      - match: { path_prefix: / }\n        rate_limits:\n          - actions:\n              - request_headers: { header_name: x-client-id, descriptor_key: client }\n",
    )
    .unwrap();
    let clock: Arc<dyn Clock> = Arc::new(CoarseClock::new());
    let engine = Arc::new(ArcSwap::from_pointee(Engine::new(
        &rules,
        &Default::default(),
        Arc::new(MemoryStore::new(clock.clone())),
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
            headers: HeaderStyle::Legacy,
            trusted_hops: 0,
            refund_upstream_failures: false,
            geo: None,
            path_matching: Default::default(),
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .layer(layer)
            .add_service(sluice_rls::grpc_service(engine, Default::default()))
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener),
                async {
                    let _ = stopped.await;
                },
            ),
    );
    let mut client = RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let call = |id: &'static str| {
        let mut request = tonic::Request::new(RateLimitRequest {
            domain: "grpc".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "d".into(),
                    value: "x".into(),
                }],
                limit: None,
                hits_addend: None,
                is_negative_hits: false,
            }],
            hits_addend: 1,
        });
        request
            .metadata_mut()
            .insert("x-client-id", id.parse().unwrap());
        request
    };
    for _ in 0..3 {
        let ok = client.should_rate_limit(call("alice")).await.unwrap();
        assert_eq!(ok.metadata().get("x-ratelimit-limit").unwrap(), "3");
    }
    let denied = client.should_rate_limit(call("alice")).await.unwrap_err();
    assert_eq!(denied.code(), tonic::Code::ResourceExhausted, "{denied:?}");
    assert!(
        denied.message().starts_with("rate limited; retry after "),
        "{denied:?}"
    );
    let retry: u64 = denied
        .metadata()
        .get("retry-after")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry));
    assert_eq!(denied.metadata().get("x-ratelimit-remaining").unwrap(), "0");
    // Another caller is independent, and the connection still serves.
    client.should_rate_limit(call("bob")).await.unwrap();
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}
