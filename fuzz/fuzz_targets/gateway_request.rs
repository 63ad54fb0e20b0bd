//! Requests through the gateway's limiter (the tower layer every gateway runs): arbitrary
//! methods, URIs and header bytes. Never a panic or a 5xx from the limiter; the path the
//! upstream sees is normalized (normalizing it again changes nothing, no `.`/`..` segment and
//! no `//` is left); every descriptor value fits the value cap.
#![no_main]

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use arbitrary::Arbitrary;
use http::{Request, Response};
use libfuzzer_sys::fuzz_target;
use sluice_config::HeaderStyle;
use sluice_http::{LimitPolicy, RateLimitLayer, RequestParts, descriptors, normalize_path};
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceExt};

/// Every action kind, on a template route, an exact one and a catch-all.
const GATEWAY: &str = r#"
gateways:
  - listen: 127.0.0.1:1
    upstream: http://127.0.0.1:2
    domain: edge
    routes:
      - match: { path_template: "/orders/{id}", method: GET }
        cost: 3
        rate_limits:
          - actions:
              - request_headers: { header_name: x-user-id, descriptor_key: user }
              - path: { descriptor_key: route }
              - method: { descriptor_key: method }
      - match: { path: /login }
        rate_limits:
          - actions:
              - masked_remote_address: { v4_prefix_mask_len: 24, v6_prefix_mask_len: 64 }
          - actions:
              - remote_address: {}
      - match: { path_prefix: / }
        rate_limits:
          - actions:
              - header_value_match:
                  descriptor_value: bots
                  headers: [{ name: user-agent, contains_match: bot }]
              - query_parameter: { query_parameter_name: tenant, descriptor_key: tenant, skip_if_absent: true }
          - actions:
              - generic_key: { descriptor_value: all, descriptor_key: api }
              - request_headers: { header_name: x-api, descriptor_key: queue, skip_if_absent: true }
"#;

#[derive(Arbitrary, Debug)]
struct Input {
    method: Vec<u8>,
    uri: Vec<u8>,
    headers: Vec<(Vec<u8>, Vec<u8>)>,
    peer: [u8; 16],
    v6: bool,
}

type Svc = BoxCloneSyncService<Request<String>, http::StatusCode, Infallible>;

struct Harness {
    svc: Svc,
    seen_path: Arc<Mutex<String>>,
    routes: Vec<sluice_config::Route>,
}

fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(|| {
        let gateway = sluice_config::parse_service(Path::new("gateway.yaml"), GATEWAY)
            .expect("gateway config")
            .gateways
            .remove(0);
        let layer = RateLimitLayer::new(
            sluice_fuzz::shared_engine(),
            LimitPolicy {
                domain: "edge".into(),
                routes: gateway.routes.clone(),
                headers: HeaderStyle::Both,
                trusted_hops: 1,
                refund_upstream_failures: true,
                geo: None,
                path_matching: Default::default(),
            },
        );
        let seen_path = Arc::new(Mutex::new(String::new()));
        let seen = seen_path.clone();
        let inner = tower::service_fn(move |req: Request<String>| {
            *seen.lock().unwrap() = req.uri().path().to_owned();
            async { Ok::<_, Infallible>(Response::new("ok".to_owned())) }
        });
        Harness {
            svc: BoxCloneSyncService::new(layer.layer(inner).map_response(|r| r.status())),
            seen_path,
            routes: gateway.routes,
        }
    })
}

fn assert_normalized(path: &str) {
    assert!(path.starts_with('/'), "{path:?}");
    assert!(!path.contains("//"), "{path:?}");
    for segment in path.split('/') {
        assert!(segment != "." && segment != "..", "{path:?}");
    }
    assert_eq!(normalize_path(path).as_deref(), Ok(path), "not idempotent");
}

fuzz_target!(|input: Input| {
    let mut builder = Request::builder().method(input.method.as_slice()).uri(input.uri.as_slice());
    for (name, value) in &input.headers {
        builder = builder.header(name.as_slice(), value.as_slice());
    }
    let peer = if input.v6 {
        IpAddr::from(input.peer)
    } else {
        IpAddr::from([input.peer[0], input.peer[1], input.peer[2], input.peer[3]])
    };
    let Ok(request) = builder
        .extension(SocketAddr::new(peer, 40000))
        .body(String::new())
    else {
        return;
    };
    let harness = harness();
    // The pure parts first: a normalized path, and descriptors within the caps.
    if let Ok(path) = normalize_path(request.uri().path()) {
        assert_normalized(&path);
        let client = sluice_http::client_address(request.headers(), Some(peer), 1);
        let route_path = sluice_http::RoutePath::new(&path, Default::default());
        let canonical = route_path
            .as_ref()
            .map_or(Default::default(), |p| p.canonical());
        let parts = RequestParts {
            method: request.method(),
            path: &canonical,
            query: request.uri().query(),
            headers: request.headers(),
            client,
            geo: None,
            head_as_get: true,
            query_reading: Default::default(),
        };
        for route in &harness.routes {
            if route_path
                .as_ref()
                .is_ok_and(|p| sluice_http::route_matches(&route.matcher, request.method(), p))
            {
                for descriptor in descriptors(route, &parts) {
                    for (_, value) in descriptor {
                        assert!(value.len() <= sluice_http::MAX_VALUE_LEN, "{}", value.len());
                    }
                }
            }
        }
    }
    // Then the layer as a gateway runs it.
    harness.seen_path.lock().unwrap().clear();
    let runtime = sluice_fuzz::runtime();
    let status = runtime
        .block_on(harness.svc.clone().oneshot(request))
        .unwrap();
    assert!(!status.is_server_error(), "{status}");
    if status.is_success() {
        assert_normalized(&harness.seen_path.lock().unwrap());
    }
});
