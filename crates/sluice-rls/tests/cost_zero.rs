//! No spelling of a zero cost lets a banned key or a key over its limit through: gRPC's
//! request-level `hits_addend: 0` counts 1, and a descriptor's own `hits_addend: 0` (gRPC and
//! `/json`) is a look that counts nothing and answers OVER_LIMIT when the key has no room.
//! Envoy's ratelimit service reads a descriptor's 0 as "check only, no increment" too.

mod common;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::google::protobuf::UInt64Value;
use http_body_util::BodyExt;
use sluice_rls::{RateLimitGrpc, RlsOptions, SharedEngine};
use tower::ServiceExt;

const RULES: &str = "domain: d
descriptors:
  - key: banned
    rate_limit: { unit: minute, requests_per_unit: 0 }
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: free
    rate_limit: { unlimited: true }
";

fn engine() -> SharedEngine {
    common::engine(RULES)
}

fn descriptor(key: &str, value: &str, hits: Option<u64>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: vec![Entry {
            key: key.to_owned(),
            value: value.to_owned(),
        }],
        hits_addend: hits.map(|value| UInt64Value { value }),
        ..Default::default()
    }
}

async fn grpc(
    service: &RateLimitGrpc,
    descriptors: Vec<RateLimitDescriptor>,
    hits_addend: u32,
) -> Result<Code, tonic::Code> {
    let request = RateLimitRequest {
        domain: "d".to_owned(),
        descriptors,
        hits_addend,
    };
    match service
        .should_rate_limit(tonic::Request::new(request))
        .await
    {
        Ok(r) => Ok(Code::try_from(r.into_inner().overall_code).unwrap()),
        Err(status) => Err(status.code()),
    }
}

#[tokio::test]
async fn no_spelling_of_cost_zero_lets_a_banned_or_over_limit_key_through_grpc() {
    let service = RateLimitGrpc::new(engine(), RlsOptions::default());
    let over = Ok(Code::OverLimit);
    // A banned value: every spelling of 0 is over the limit.
    for (hits, request) in [(Some(0), 0), (Some(0), 5), (None, 0)] {
        let d = descriptor("banned", "mallory", hits);
        assert_eq!(
            grpc(&service, vec![d], request).await,
            over,
            "{hits:?} {request}"
        );
    }
    // A key at its limit of 2.
    for _ in 0..2 {
        let d = descriptor("user", "alice", None);
        assert_eq!(grpc(&service, vec![d], 0).await, Ok(Code::Ok));
    }
    for (hits, request) in [(Some(0), 0), (Some(0), 1), (None, 0), (Some(1), 0)] {
        let d = descriptor("user", "alice", hits);
        assert_eq!(
            grpc(&service, vec![d], request).await,
            over,
            "{hits:?} {request}"
        );
    }
    // A look at a key with room answers OK and counts nothing: bob still gets his 2.
    for _ in 0..5 {
        let d = descriptor("user", "bob", Some(0));
        assert_eq!(grpc(&service, vec![d], 0).await, Ok(Code::Ok));
    }
    for expected in [Code::Ok, Code::Ok, Code::OverLimit] {
        let d = descriptor("user", "bob", Some(1));
        assert_eq!(grpc(&service, vec![d], 0).await, Ok(expected));
    }
    // An unlimited rule stays OK at 0.
    let d = descriptor("free", "x", Some(0));
    assert_eq!(grpc(&service, vec![d], 0).await, Ok(Code::Ok));
    // A refill spelled as negative hits is refused, not counted as a hit nor as a refill.
    let mut d = descriptor("user", "carol", Some(1));
    d.is_negative_hits = true;
    assert_eq!(
        grpc(&service, vec![d], 0).await,
        Err(tonic::Code::InvalidArgument)
    );
}

async fn json(app: &axum::Router, body: serde_json::Value) -> (u16, serde_json::Value) {
    let request = axum::http::Request::post("/json")
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body.to_string()))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

#[tokio::test]
async fn no_spelling_of_cost_zero_lets_a_banned_or_over_limit_key_through_json() {
    let app = sluice_rls::http_router(engine(), RlsOptions::default());
    let one = |key: &str, value: &str, hits: Option<u64>| {
        let mut d = serde_json::json!({ "entries": [{ "key": key, "value": value }] });
        if let Some(h) = hits {
            d["hitsAddend"] = h.into();
        }
        d
    };
    for body in [
        serde_json::json!({ "domain": "d", "descriptors": [one("banned", "mallory", Some(0))] }),
        serde_json::json!({ "domain": "d", "descriptors": [one("banned", "mallory", None)], "hitsAddend": 0 }),
    ] {
        let (status, answer) = json(&app, body).await;
        assert_eq!(
            (status, &answer["overallCode"]),
            (429, &"OVER_LIMIT".into())
        );
    }
    for _ in 0..2 {
        let body =
            serde_json::json!({ "domain": "d", "descriptors": [one("user", "alice", None)] });
        assert_eq!(json(&app, body).await.0, 200);
    }
    for hits in [Some(0), None] {
        let body = serde_json::json!({ "domain": "d", "descriptors": [one("user", "alice", hits)], "hits_addend": 0 });
        let (status, answer) = json(&app, body).await;
        assert_eq!(status, 429, "{hits:?}: {answer}");
        assert_eq!(answer["statuses"][0]["limitRemaining"], 0);
    }
    let body = serde_json::json!({ "domain": "d", "descriptors": [one("user", "bob", Some(0))] });
    let (status, answer) = json(&app, body).await;
    assert_eq!(
        (status, &answer["statuses"][0]["limitRemaining"]),
        (200, &2.into())
    );
}
