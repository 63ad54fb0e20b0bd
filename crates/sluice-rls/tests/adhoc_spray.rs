//! The red team's ad-hoc spray: 2,100 keys of one shape against a budget of 2,000 filled it in
//! 1.3 s and then every new ad-hoc key was refused for the attacker's window (365 days). Now a
//! window past 1 day is a 400, and a full budget evicts the oldest key of the largest shape
//! instead of refusing, so new users of any shape are served; the sprayer gets its limit again
//! only for keys it has had evicted, once per eviction.

mod common;

use http_body_util::BodyExt;
use sluice_rls::{RlsOptions, SharedEngine};
use tower::ServiceExt;

const BUDGET: usize = 2_000;
const SPRAY: usize = 2_100;

fn engine() -> SharedEngine {
    common::engine("domain: api\ndescriptors: []\n")
}

async fn acquire(app: &axum::Router, user: &str, limit: serde_json::Value) -> (u16, String) {
    let body = serde_json::json!({ "user": user, "item": "x", "limit": limit });
    let request = axum::http::Request::post("/v1/acquire")
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body.to_string()))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

async fn allowed(app: &axum::Router, user: &str, limit: serde_json::Value) -> bool {
    let (status, body) = acquire(app, user, limit).await;
    assert_eq!(status, 200, "{body}");
    body.contains("\"allowed\":true")
}

async fn count_allowed(
    app: &axum::Router,
    users: impl Iterator<Item = String>,
    limit: &serde_json::Value,
) -> usize {
    let mut n = 0;
    for user in users {
        n += usize::from(allowed(app, &user, limit.clone()).await);
    }
    n
}

#[tokio::test]
async fn an_adhoc_spray_does_not_lock_new_users_out() {
    let options = RlsOptions {
        adhoc_max_keys: BUDGET,
        ..RlsOptions::default()
    };
    let app = sluice_rls::http_router(engine(), options);
    let spray = serde_json::json!({ "requests": 1, "window": "1d" });
    let spray_key = |i: usize| format!("spray{i}");

    // The red team's windows are refused, with the way out.
    for window in ["365d", "10000d"] {
        let (status, body) = acquire(
            &app,
            "u",
            serde_json::json!({ "requests": 1, "window": window }),
        )
        .await;
        assert_eq!(status, 400, "{body}");
        assert!(
            body.contains("at most 1d") && body.contains("rule"),
            "{body}"
        );
    }

    // The spray: every key takes its one request for a day.
    assert_eq!(
        count_allowed(&app, (0..SPRAY).map(spray_key), &spray).await,
        SPRAY
    );

    // New users of another shape and of the sprayed shape: all served (before: 0 of 10).
    let other = serde_json::json!({ "requests": 5, "window": "1m" });
    assert_eq!(
        count_allowed(&app, (0..10).map(|i| format!("new{i}")), &other).await,
        10
    );
    assert_eq!(
        count_allowed(&app, (0..10).map(|i| format!("same{i}")), &spray).await,
        10
    );
    // And they are limited: the known ones keep their counts.
    assert_eq!(
        count_allowed(&app, (0..10).map(|i| format!("same{i}")), &spray).await,
        0
    );

    // The sprayer: its 2,100 - 2,000 + 20 oldest keys were evicted (the other shape was never
    // the largest, so its keys stay). Every key still held is denied...
    let evicted = SPRAY - BUDGET + 20;
    assert_eq!(
        count_allowed(&app, (evicted..SPRAY).map(spray_key), &spray).await,
        0
    );
    // ...an evicted key gets its limit (1) again, once: that is what eviction gives away,
    // and each one evicts another of the sprayer's own oldest keys.
    assert_eq!(
        count_allowed(&app, (0..evicted).map(spray_key), &spray).await,
        evicted
    );
    assert_eq!(
        count_allowed(&app, (0..evicted).map(spray_key), &spray).await,
        0
    );
    // The other shape's new users were not evicted by any of it.
    assert_eq!(
        count_allowed(&app, (0..10).map(|i| format!("new{i}")), &other).await,
        10
    );
}
