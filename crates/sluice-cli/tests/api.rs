//! `/v1/acquire` and `/v1/refill` beyond one descriptor: a global limit beside the per-user
//! one in the same call, and amounts that can never fit.

mod common;

use common::{Serve, http_call};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_with_a_global_limit_beside_the_per_user_one_and_amounts_that_never_fit() {
    let rules = r#"
domain: api
descriptors:
  - key: item
    descriptors:
      - key: user
        rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: item_total
    rate_limit: { unit: minute, requests_per_unit: 8 }
"#;
    let serve = Serve::start("api-global", "memory://", &[("api.yaml", rules)]);
    let acquire = |user: &str, amount: u64| {
        let body = format!(
            r#"{{"user": "{user}", "item": "reports", "amount": {amount}, "descriptors": [{{"entries": [{{"key": "item_total", "value": "reports"}}]}}]}}"#
        );
        let (status, body) = http_call(serve.http, "POST", "/v1/acquire", &body);
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<serde_json::Value>(&body).unwrap()
    };
    // Per user 5, all users together 8: two users get 5 and 3.
    let a: Vec<bool> = (0..6)
        .map(|_| acquire("ann", 1)["allowed"].as_bool().unwrap())
        .collect();
    assert_eq!(a, [true, true, true, true, true, false], "ann's own 5");
    let b: Vec<bool> = (0..4)
        .map(|_| acquire("ben", 1)["allowed"].as_bool().unwrap())
        .collect();
    assert_eq!(b, [true, true, true, false], "the global 8 is reached");
    // Without the extra descriptor only the per-user rule applies.
    let (_, body) = http_call(
        serve.http,
        "POST",
        "/v1/acquire",
        r#"{"user": "cid", "item": "reports"}"#,
    );
    assert!(body.contains("\"allowed\":true"), "{body}");
    // Refill gives back to both rules.
    let (status, body) = http_call(
        serve.http,
        "POST",
        "/v1/refill",
        r#"{"user": "ben", "item": "reports", "amount": 1, "descriptors": [{"entries": [{"key": "item_total", "value": "reports"}]}]}"#,
    );
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"rules\":2"), "{body}");
    assert_eq!(acquire("ben", 1)["allowed"], true);
    // An amount larger than a limit can ever admit says so, with no retry hint.
    let v = acquire("dan", 100);
    assert_eq!(v["allowed"], false);
    assert!(v["retry_after_ms"].is_null(), "{v}");
    let message = v["message"].as_str().unwrap();
    assert!(
        message.starts_with("amount 100 can never be acquired at once")
            && message.contains("(5 per 1m)"),
        "{message}"
    );
    // An ad-hoc limit too.
    let (_, body) = http_call(
        serve.http,
        "POST",
        "/v1/acquire",
        r#"{"user": "e", "item": "x", "amount": 10, "limit": {"requests": 3, "window": "1m"}}"#,
    );
    assert!(
        body.contains("amount 10 can never be acquired at once: the limit admits at most 3"),
        "{body}"
    );
    // Bad extra descriptors are named.
    let (status, body) = http_call(
        serve.http,
        "POST",
        "/v1/acquire",
        r#"{"user": "f", "item": "x", "descriptors": [{"entries": []}]}"#,
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("descriptors[0] has no entries"), "{body}");
}
