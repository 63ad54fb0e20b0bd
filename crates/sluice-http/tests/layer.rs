//! The layer in process, with a manual clock: each action, header styles, shadow mode, cost,
//! several descriptors per request.

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use arc_swap::ArcSwap;
use axum::body::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use sluice_config::{HeaderStyle, Route};
use sluice_engine::Engine;
use sluice_http::{LimitPolicy, RateLimitLayer};
use tower::{Service, ServiceExt};

const RULES: &str = r#"
domain: edge
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: masked_remote_address
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: remote_address
    rate_limit: { unit: minute, requests_per_unit: 4 }
  - key: endpoint
    value: /users/{id}
    rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: generic_key
    value: all
    rate_limit: { unit: minute, requests_per_unit: 6 }
  - key: tenant
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: plan
    value: free
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: api_key
    rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: method
    value: DELETE
    rate_limit: { unit: minute, requests_per_unit: 1 }
"#;

/// The routes of a gateway section built around `routes_yaml`.
fn routes(routes_yaml: &str) -> Vec<Route> {
    let yaml = format!(
        "gateways:\n  - listen: 127.0.0.1:1\n    upstream: http://127.0.0.1:2\n    domain: edge\n    routes:\n{routes_yaml}"
    );
    sluice_config::parse_service(Path::new("test.yaml"), &yaml)
        .unwrap()
        .gateways[0]
        .routes
        .clone()
}

/// An engine over `RULES` with a manual clock and the memory store.
fn engine() -> Arc<ArcSwap<Engine>> {
    common::engine(RULES)
}

struct Harness {
    svc: tower::util::BoxCloneService<Request<String>, Reply, Infallible>,
}

impl Harness {
    fn new(routes_yaml: &str, headers: HeaderStyle, trusted_hops: usize) -> Self {
        let layer = RateLimitLayer::new(
            engine(),
            LimitPolicy {
                domain: "edge".into(),
                routes: routes(routes_yaml),
                headers,
                trusted_hops,
                refund_upstream_failures: false,
                geo: None,
                path_matching: Default::default(),
            },
        );
        let inner = tower::service_fn(|_req: Request<String>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        });
        Self {
            svc: tower::util::BoxCloneService::new(tower::Layer::layer(&layer, inner)),
        }
    }

    async fn send(
        &mut self,
        method: &str,
        uri: &str,
        headers: &[(&str, &str)],
        peer: &str,
    ) -> Reply {
        let mut b = Request::builder().method(method).uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let mut req = b.body(String::new()).unwrap();
        req.extensions_mut()
            .insert(peer.parse::<SocketAddr>().unwrap());
        self.svc.ready().await.unwrap().call(req).await.unwrap()
    }

    async fn statuses(
        &mut self,
        n: usize,
        uri: &str,
        headers: &[(&str, &str)],
        peer: &str,
    ) -> Vec<u16> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(self.send("GET", uri, headers, peer).await.status().as_u16());
        }
        out
    }
}

type Reply = Response<http_body_util::Either<Full<Bytes>, Full<Bytes>>>;

const PEER: &str = "192.0.2.10:5000";

#[tokio::test]
async fn request_headers_and_the_429_response() {
    let mut h = Harness::new(
        "      - match: { path_prefix: / }\n        rate_limits:\n          - actions:\n              - request_headers: { header_name: x-user-id, descriptor_key: user }\n",
        HeaderStyle::Ietf,
        0,
    );
    let ok = h.send("GET", "/a", &[("x-user-id", "alice")], PEER).await;
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(ok.headers()["ratelimit-policy"], "\"edge/user\";q=2;w=60");
    assert!(
        ok.headers()["ratelimit"]
            .to_str()
            .unwrap()
            .starts_with("\"edge/user\";r=1;t=")
    );
    assert_eq!(
        h.send("GET", "/a", &[("x-user-id", "alice")], PEER)
            .await
            .status(),
        StatusCode::OK
    );
    let denied = h.send("GET", "/a", &[("x-user-id", "alice")], PEER).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = denied.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry));
    assert_eq!(denied.headers()["content-type"], "application/json");
    assert!(
        denied.headers()["ratelimit"]
            .to_str()
            .unwrap()
            .contains(";r=0;")
    );
    // Another user is independent; a request without the header builds no descriptor.
    assert_eq!(
        h.statuses(2, "/a", &[("x-user-id", "bob")], PEER).await,
        [200, 200]
    );
    assert_eq!(h.statuses(5, "/a", &[], PEER).await, [200; 5]);
}

#[tokio::test]
async fn masked_and_plain_remote_address() {
    let mut h = Harness::new(
        "      - match: { path_prefix: / }\n        rate_limits:\n          - actions:\n              - masked_remote_address: { v4_prefix_mask_len: 24, v6_prefix_mask_len: 64 }\n",
        HeaderStyle::None,
        0,
    );
    // One /24 shares 3 per minute; another /24 is independent.
    assert_eq!(h.statuses(2, "/", &[], "198.51.100.1:1").await, [200, 200]);
    assert_eq!(
        h.statuses(2, "/", &[], "198.51.100.200:1").await,
        [200, 429]
    );
    assert_eq!(h.statuses(1, "/", &[], "198.51.101.1:1").await, [200]);
    // One IPv6 /64 is one client.
    assert_eq!(
        h.statuses(2, "/", &[], "[2001:db8:0:1::1]:1").await,
        [200, 200]
    );
    assert_eq!(
        h.statuses(2, "/", &[], "[2001:db8:0:1:ffff::9]:1").await,
        [200, 429]
    );
    let mut h = Harness::new(
        "      - match: { path_prefix: / }\n        rate_limits:\n          - actions:\n              - remote_address: {}\n",
        HeaderStyle::None,
        1,
    );
    // One trusted hop: the client is the last X-Forwarded-For entry; a malformed header falls
    // back to the peer.
    let xff = [("x-forwarded-for", "203.0.113.7")];
    assert_eq!(
        h.statuses(5, "/", &xff, PEER).await,
        [200, 200, 200, 200, 429]
    );
    assert_eq!(
        h.statuses(1, "/", &[("x-forwarded-for", "garbage")], PEER)
            .await,
        [200]
    );
}

#[tokio::test]
async fn path_templates_cost_and_several_descriptors() {
    let routes = "      - match: { path_template: \"/users/{id}\" }\n        cost: 2\n        rate_limits:\n          - actions:\n              - path: { descriptor_key: endpoint }\n          - actions:\n              - generic_key: { descriptor_value: all }\n";
    let mut h = Harness::new(routes, HeaderStyle::Legacy, 0);
    // Cost 2 per request against 5 per minute on the endpoint (and 6 on `all`).
    let r = h.send("GET", "/users/1", &[], PEER).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-ratelimit-limit"], "5");
    assert_eq!(r.headers()["x-ratelimit-remaining"], "3");
    assert!(!r.headers().contains_key("x-ratelimit-retry-after"));
    assert_eq!(h.statuses(1, "/users/2", &[], PEER).await, [200]);
    // Denied: the legacy set names the wait too, equal to `Retry-After`.
    let denied = h.send("GET", "/users/3", &[], PEER).await;
    assert_eq!(denied.status(), 429);
    let retry = &denied.headers()["retry-after"];
    assert_eq!(&denied.headers()["x-ratelimit-retry-after"], retry);
    assert!(retry.to_str().unwrap().parse::<u64>().unwrap() >= 1);
    // Unmatched path: no route, no limit.
    assert_eq!(h.statuses(3, "/other", &[], PEER).await, [200, 200, 200]);
}

#[tokio::test]
async fn header_match_query_method_and_shadow() {
    let routes = "      - match: { path_prefix: / }\n        rate_limits:\n          - actions:\n              - header_value_match: { descriptor_key: plan, descriptor_value: free, headers: [{ name: x-plan, exact_match: free }] }\n          - actions:\n              - query_parameter: { query_parameter_name: key, descriptor_key: api_key }\n          - actions:\n              - method: {}\n          - actions:\n              - request_headers: { header_name: x-tenant, descriptor_key: tenant }\n";
    let mut h = Harness::new(routes, HeaderStyle::Both, 0);
    assert_eq!(
        h.statuses(2, "/", &[("x-plan", "free")], PEER).await,
        [200, 429]
    );
    assert_eq!(
        h.statuses(2, "/", &[("x-plan", "pro")], PEER).await,
        [200, 200]
    );
    assert_eq!(
        h.statuses(3, "/?key=k1&x=y", &[], PEER).await,
        [200, 200, 429]
    );
    let d1 = h.send("DELETE", "/", &[], PEER).await.status().as_u16();
    let d2 = h.send("DELETE", "/", &[], PEER).await.status().as_u16();
    assert_eq!((d1, d2), (200, 429));
    // Shadow: over its limit of 1, never denied.
    assert_eq!(
        h.statuses(3, "/", &[("x-tenant", "t")], PEER).await,
        [200, 200, 200]
    );
}

/// The bypasses of an attacker who knows the routes: other spellings of a limited path, header
/// bytes that are not UTF-8, encoded query values, very long values. Each one must land on the
/// same counter as the plain request (and the inner service must see the normalized path).
#[tokio::test]
async fn other_spellings_of_a_path_header_or_query_share_one_limit() {
    let routes = "      - match: { path: /login }\n        rate_limits:\n          - actions:\n              - generic_key: { descriptor_value: all }\n      - match: { path_prefix: /q }\n        rate_limits:\n          - actions:\n              - query_parameter: { query_parameter_name: key, descriptor_key: api_key }\n      - match: { path_prefix: / }\n        rate_limits:\n          - actions:\n              - request_headers: { header_name: x-user-id, descriptor_key: user }\n";
    let mut h = Harness::new(routes, HeaderStyle::None, 0);
    // `all` allows 6 per minute; every spelling counts against it.
    let spellings = [
        "/login",
        "//login",
        "/./login",
        "/%6cogin",
        "/x/../login",
        "/%2E/login",
        "/login",
    ];
    let mut got = Vec::new();
    for p in spellings {
        got.push(h.send("GET", p, &[], PEER).await.status().as_u16());
    }
    assert_eq!(got, [200, 200, 200, 200, 200, 200, 429]);
    // A malformed escape is refused, not passed on unlimited.
    assert_eq!(h.statuses(1, "/log%zzin", &[], PEER).await, [400]);
    // So are targets no route can match (`OPTIONS *`, `CONNECT host:port`): found by fuzzing
    // (fuzz/fuzz_targets/gateway_request.rs), they used to reach the upstream unlimited.
    assert_eq!(h.send("OPTIONS", "*", &[], PEER).await.status(), 400);
    assert_eq!(
        h.send("CONNECT", "login.example:443", &[], PEER)
            .await
            .status(),
        400
    );
    // `api_key` allows 2: `%6B1` and `k+1`-style spellings are the same value upstream.
    assert_eq!(h.statuses(1, "/q?key=k1", &[], PEER).await, [200], "plain");
    assert_eq!(h.statuses(1, "/q?key=%6B1", &[], PEER).await, [200]);
    assert_eq!(h.statuses(1, "/q?%6Bey=k1", &[], PEER).await, [429]);
    // Header bytes >= 0x80 are a value like any other (user allows 2 per minute).
    let raw = http::HeaderValue::from_bytes(b"mallory\xff").unwrap();
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let mut req = Request::builder().uri("/a").body(String::new()).unwrap();
        req.headers_mut().insert("x-user-id", raw.clone());
        req.extensions_mut()
            .insert(PEER.parse::<SocketAddr>().unwrap());
        let r = h.svc.ready().await.unwrap().call(req).await.unwrap();
        statuses.push(r.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 429]);
    // A 100 KB value is limited like a short one (hashed, not skipped or stored whole).
    let long = "u".repeat(100_000);
    assert_eq!(
        h.statuses(3, "/a", &[("x-user-id", long.as_str())], PEER)
            .await,
        [200, 200, 429]
    );
}

#[tokio::test]
async fn the_inner_service_sees_the_normalized_path() {
    let layer = RateLimitLayer::new(
        engine(),
        LimitPolicy {
            domain: "edge".into(),
            routes: routes(
                "      - match: { path: /login }\n        rate_limits:\n          - actions:\n              - generic_key: { descriptor_value: all }\n",
            ),
            headers: HeaderStyle::None,
            trusted_hops: 0,
            refund_upstream_failures: false,
            geo: None,
            path_matching: Default::default(),
        },
    );
    let inner = tower::service_fn(|req: Request<String>| async move {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(req.uri().to_string()))))
    });
    let mut svc = tower::Layer::layer(&layer, inner);
    let req = Request::builder()
        .uri("//a/../login?x=%41")
        .body(String::new())
        .unwrap();
    let reply = svc.ready().await.unwrap().call(req).await.unwrap();
    let body = http_body_util::BodyExt::collect(reply.into_body())
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(
        &body[..],
        b"/login?x=%41",
        "path normalized, query untouched"
    );
}
