//! `sluice serve` as a process: a real tonic client (envoy-types), the HTTP/JSON API, reloads,
//! bad requests, graceful shutdown, and three processes sharing one real Redis.

mod common;

use std::time::Duration;

use common::{Serve, http_call, request, threads};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::google::protobuf::UInt64Value;
use sluice_testkit::{RedisServer, wait_until};

const RULES: &str = r#"
domain: edge
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: user
    value: vip
    rate_limit: { unlimited: true }
  - key: tenant
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: path
    value: /search
    rate_limit: { name: search_all, unit: minute, requests_per_unit: 100 }
    descriptors:
      - key: user
        rate_limit:
          unit: minute
          requests_per_unit: 2
          replaces: [{ name: search_all }]
  - key: weight
    rate_limit: { unit: minute, requests_per_unit: 10 }
"#;

const API_RULES: &str = r#"
domain: api
descriptors:
  - key: item
    descriptors:
      - key: user
        rate_limit: { unit: minute, requests_per_unit: 5, mode: local, algorithm: token_bucket }
"#;

fn ok(code: i32) -> bool {
    code == Code::Ok as i32
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_rls_semantics_over_grpc() {
    // Without `rls.response_headers` (the default, as Envoy's ratelimit service) the answers
    // carry no headers to add: Envoy's `enable_x_ratelimit_headers` makes them.
    let plain = Serve::start("rls-plain", "memory://", &[("edge.yaml", RULES)]);
    let r = plain
        .client()
        .await
        .should_rate_limit(request("edge", &[&[("user", "alice")]], 0))
        .await
        .unwrap()
        .into_inner();
    assert!(r.response_headers_to_add.is_empty(), "{r:?}");
    drop(plain);
    let serve = Serve::start_with(
        "rls",
        "memory://",
        &[("edge.yaml", RULES), ("api.yaml", API_RULES)],
        "rls:\n  response_headers: true\n",
    );
    let mut client = serve.client().await;
    // 3 per minute per user; statuses carry the limit and what is left.
    for left in [2u32, 1, 0] {
        let r = client
            .should_rate_limit(request("edge", &[&[("user", "alice")]], 0))
            .await
            .unwrap()
            .into_inner();
        assert!(ok(r.overall_code));
        let s = &r.statuses[0];
        assert_eq!(s.current_limit.as_ref().unwrap().requests_per_unit, 3);
        assert_eq!(s.limit_remaining, left);
        assert!(s.duration_until_reset.is_some());
    }
    let r = client
        .should_rate_limit(request("edge", &[&[("user", "alice")]], 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(r.statuses[0].code, Code::OverLimit as i32);
    let headers: Vec<_> = r
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect();
    assert!(
        headers.contains(&("x-ratelimit-limit", "3, 3;w=60")),
        "{headers:?}"
    );
    // Unlimited value.
    for _ in 0..10 {
        let r = client
            .should_rate_limit(request("edge", &[&[("user", "vip")]], 0))
            .await
            .unwrap()
            .into_inner();
        assert!(ok(r.overall_code));
    }
    // Shadow mode: over its limit, still OK.
    for _ in 0..3 {
        let r = client
            .should_rate_limit(request("edge", &[&[("tenant", "t1")]], 0))
            .await
            .unwrap()
            .into_inner();
        assert!(ok(r.overall_code));
    }
    // Nested descriptors and replaces: the per-user search limit (2) applies, not search_all.
    let both: &[&[(&str, &str)]] = &[
        &[("path", "/search")],
        &[("path", "/search"), ("user", "carol")],
    ];
    for _ in 0..2 {
        assert!(ok(client
            .should_rate_limit(request("edge", both, 0))
            .await
            .unwrap()
            .into_inner()
            .overall_code));
    }
    let r = client
        .should_rate_limit(request("edge", both, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert!(ok(r.statuses[0].code), "search_all was replaced");
    assert_eq!(r.statuses[1].code, Code::OverLimit as i32);
    // hits_addend: request level, then per descriptor.
    let r = client
        .should_rate_limit(request("edge", &[&[("weight", "w")]], 7))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.statuses[0].limit_remaining, 3);
    let mut per_descriptor = request("edge", &[&[("weight", "w")]], 1);
    per_descriptor.descriptors[0].hits_addend = Some(UInt64Value { value: 4 });
    let r = client
        .should_rate_limit(per_descriptor)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::OverLimit as i32, "7 + 4 > 10");
    // Unmatched descriptor: OK with no limit.
    let r = client
        .should_rate_limit(request("edge", &[&[("nothing", "x")]], 0))
        .await
        .unwrap()
        .into_inner();
    assert!(ok(r.overall_code) && r.statuses[0].current_limit.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_grpc_and_http_requests_get_clean_errors() {
    let serve = Serve::start(
        "bad",
        "memory://",
        &[("edge.yaml", RULES), ("api.yaml", API_RULES)],
    );
    let mut client = serve.client().await;
    let err = client
        .should_rate_limit(request("nope", &[&[("user", "a")]], 0))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    assert!(
        err.message().contains("unknown domain `nope`"),
        "{}",
        err.message()
    );
    let err = client
        .should_rate_limit(request("edge", &[], 0))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    let err = client
        .should_rate_limit(request("", &[&[("user", "a")]], 0))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    let long = "x".repeat(5000);
    let err = client
        .should_rate_limit(request("edge", &[&[("user", long.as_str())]], 0))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message()
            .contains("descriptors[0].entries[0].value is 5000 bytes"),
        "{}",
        err.message()
    );
    // HTTP: bad JSON, wrong types, missing fields, zero amount, a huge body.
    let (status, body) = http_call(serve.http, "POST", "/v1/acquire", "{not json");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("\"error\":\"invalid JSON body"), "{body}");
    let (status, body) = http_call(
        serve.http,
        "POST",
        "/v1/acquire",
        r#"{"user": 5, "item": "x"}"#,
    );
    assert_eq!(status, 400, "{body}");
    let (status, _) = http_call(serve.http, "POST", "/v1/acquire", r#"{"item": "x"}"#);
    assert_eq!(status, 400);
    let (status, body) = http_call(
        serve.http,
        "POST",
        "/v1/acquire",
        r#"{"user": "u", "item": "x", "amount": 0}"#,
    );
    assert_eq!((status, body.contains("amount")), (400, true), "{body}");
    let huge = format!(
        r#"{{"user": "u", "item": "{}"}}"#,
        "x".repeat(2 * 1024 * 1024)
    );
    let (status, _) = http_call(serve.http, "POST", "/v1/acquire", &huge);
    assert!(status == 413 || status == 0, "huge body: {status}");
    let (status, body) = http_call(
        serve.http,
        "POST",
        "/json",
        r#"{"domain": "nope", "descriptors": [{"entries": [{"key": "a", "value": "b"}]}]}"#,
    );
    assert_eq!(status, 404, "{body}");
    // Still serving after all that.
    let (status, body) = http_call(
        serve.http,
        "POST",
        "/v1/acquire",
        r#"{"user": "u", "item": "x"}"#,
    );
    assert_eq!(status, 200, "{body}");
    assert!(
        client
            .should_rate_limit(request("edge", &[&[("user", "z")]], 0))
            .await
            .is_ok()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_refill_batch_and_json() {
    let serve = Serve::start(
        "api",
        "memory://",
        &[("edge.yaml", RULES), ("api.yaml", API_RULES)],
    );
    let acquire = |body: &str| http_call(serve.http, "POST", "/v1/acquire", body);
    let (status, body) = acquire(r#"{"user": "u1", "item": "reports", "amount": 5}"#);
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (v["allowed"].as_bool(), v["remaining"].as_u64()),
        (Some(true), Some(0)),
        "{body}"
    );
    let (status, body) = acquire(r#"{"user": "u1", "item": "reports"}"#);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        status, 200,
        "a denied acquire is a successful answer, not a 429"
    );
    assert_eq!(v["allowed"], false);
    assert!(v["retry_after_ms"].as_u64().unwrap() > 0);
    let (status, body) = http_call(
        serve.http,
        "POST",
        "/v1/refill",
        r#"{"user": "u1", "item": "reports", "amount": 2}"#,
    );
    assert_eq!(status, 200, "{body}");
    let (_, body) = acquire(r#"{"user": "u1", "item": "reports", "amount": 2}"#);
    assert!(
        body.contains("\"allowed\":true"),
        "refilled tokens usable: {body}"
    );
    // A limit sent with the request.
    let adhoc = r#"{"user": "u2", "item": "export", "limit": {"requests": 2, "window": "1h"}}"#;
    assert!(acquire(adhoc).1.contains("\"allowed\":true"));
    assert!(acquire(adhoc).1.contains("\"allowed\":true"));
    assert!(acquire(adhoc).1.contains("\"allowed\":false"));
    // Batch: one bad entry does not spoil the others.
    let (status, body) = http_call(
        serve.http,
        "POST",
        "/v1/acquire/batch",
        r#"{"requests": [{"user": "b", "item": "i"}, {"user": "", "item": "i"}, {"user": "b", "item": "i", "amount": 4}]}"#,
    );
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["results"][0]["allowed"], true);
    assert!(
        v["results"][1]["error"]
            .as_str()
            .unwrap()
            .contains("`user` is empty")
    );
    assert_eq!(v["results"][2]["allowed"], true);
    // Envoy's /json shape.
    let (status, body) = http_call(
        serve.http,
        "POST",
        "/json",
        r#"{"domain": "edge", "descriptors": [{"entries": [{"key": "user", "value": "j"}]}]}"#,
    );
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["overallCode"], "OK");
    assert_eq!(v["statuses"][0]["currentLimit"]["unit"], "MINUTE");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_keeps_counters_and_a_bad_reload_keeps_the_rules() {
    let mut serve = Serve::start(
        "reload",
        "memory://",
        &[("edge.yaml", RULES), ("api.yaml", API_RULES)],
    );
    let mut client = serve.client().await;
    for _ in 0..3 {
        client
            .should_rate_limit(request("edge", &[&[("user", "dave")]], 0))
            .await
            .unwrap();
    }
    // A broken rule file: the reload fails with the precise error; the old rules stay.
    std::fs::write(serve.rules_dir().join("edge.yaml"), "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: secnd, requests_per_unit: 3 }\n").unwrap();
    let (status, body) = http_call(serve.admin, "POST", "/reload", "");
    assert_eq!(status, 422, "{body}");
    assert!(
        body.contains("edge.yaml:4:") && body.contains("did you mean `second`?"),
        "{body}"
    );
    let r = client
        .should_rate_limit(request("edge", &[&[("user", "dave")]], 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.overall_code,
        Code::OverLimit as i32,
        "old rules and counters still apply"
    );
    // A good change: a new rule appears; the unchanged user rule keeps its counters.
    std::fs::write(
        serve.rules_dir().join("edge.yaml"),
        format!("{RULES}  - key: ip\n    rate_limit: {{ unit: minute, requests_per_unit: 1 }}\n"),
    )
    .unwrap();
    let (status, body) = http_call(serve.admin, "POST", "/reload", "");
    assert_eq!(status, 200, "{body}");
    let r = client
        .should_rate_limit(request("edge", &[&[("user", "dave")]], 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.overall_code,
        Code::OverLimit as i32,
        "counters survived the reload"
    );
    let r = client
        .should_rate_limit(request("edge", &[&[("ip", "1.2.3.4")]], 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        1
    );
    // The file watcher reloads too (within its 2 s poll).
    std::fs::write(
        serve.rules_dir().join("edge.yaml"),
        format!("{RULES}  - key: ip\n    rate_limit: {{ unit: minute, requests_per_unit: 7 }}\n"),
    )
    .unwrap();
    let mut seen = false;
    for _ in 0..40 {
        let r = client
            .should_rate_limit(request("edge", &[&[("ip", "9.9.9.9")]], 0))
            .await
            .unwrap()
            .into_inner();
        if r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit
            == 7
        {
            seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(seen, "file change not picked up");
    // SIGTERM: a clean exit.
    let status = serve.terminate();
    assert!(status.success(), "{status:?}");
}

/// The file watcher sees a rule file added to a rules directory, and does not load again what
/// `POST /reload` already applied (the status page's "last reload" stays the user's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watcher_sees_a_new_rule_file_and_does_not_repeat_a_posted_reload() {
    let serve = Serve::start("watch-new", "memory://", &[("edge.yaml", RULES)]);
    let ask_extra = || {
        http_call(
            serve.http,
            "POST",
            "/json",
            r#"{"domain":"extra","descriptors":[{"entries":[{"key":"user","value":"x"}]}]}"#,
        )
    };
    assert_eq!(ask_extra().0, 404, "no domain `extra` yet");
    std::fs::write(
        serve.rules_dir().join("extra.yaml"),
        "domain: extra\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 1 }\n",
    )
    .unwrap();
    let mut known = false;
    for _ in 0..40 {
        if ask_extra().0 == 200 {
            known = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(known, "a new rule file not picked up: {}", serve.log_tail());

    // A change applied by `POST /reload`: the watcher's next polls find nothing new.
    std::fs::write(
        serve.rules_dir().join("extra.yaml"),
        "domain: extra\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 2 }\n",
    )
    .unwrap();
    let (status, body) = http_call(serve.admin, "POST", "/reload", "");
    assert_eq!(status, 200, "{body}");
    tokio::time::sleep(Duration::from_millis(4500)).await;
    let (status, body) = http_call(serve.admin, "GET", "/status.json", "");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let last = &v["config"]["last_reload"];
    assert_eq!(
        last["trigger"], "http",
        "reloaded again after POST /reload: {last}"
    );
    assert_eq!(last["ok"], true, "{last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_share_one_redis() {
    let redis = RedisServer::start();
    let rules = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { window: 2s, requests_per_unit: 40, spans: 4 }\n";
    let servers: Vec<Serve> = (0..3)
        .map(|i| Serve::start(&format!("fleet{i}"), &redis.url(), &[("edge.yaml", rules)]))
        .collect();
    // Ready once each has reached the store (its first flush).
    assert!(wait_until(Duration::from_secs(10), || servers
        .iter()
        .all(|s| http_call(s.admin, "GET", "/readyz", "").0 == 200)));
    let mut clients = Vec::new();
    for s in &servers {
        clients.push(s.client().await);
    }
    // Start at a window boundary, then offer 2x the limit for three windows, spread evenly;
    // admissions are tallied in the servers' windows.
    let window = Duration::from_secs(2);
    let window_of = common::align_to_window(window).await;
    let start = tokio::time::Instant::now();
    let per_window = 80;
    let gap = window / per_window;
    let mut admitted = [0u32; 3];
    for n in 0..(per_window * 3) {
        let c = &mut clients[n as usize % 3];
        let before = window_of();
        let r = c
            .should_rate_limit(request("edge", &[&[("user", "shared")]], 0))
            .await
            .unwrap()
            .into_inner();
        let after = window_of();
        if ok(r.overall_code) {
            // Decided in `before`'s window or `after`'s: when they differ (a call across a
            // boundary), it counts in both, which only makes the bound below stricter.
            for count in admitted.iter_mut().take(after + 1).skip(before) {
                *count += 1;
            }
        }
        let next = start + gap * (n + 1);
        tokio::time::sleep_until(next).await;
    }
    eprintln!("three servers, 2x the limit of 40 per 2 s: admitted per window {admitted:?}");
    for (w, count) in admitted.iter().enumerate() {
        // The engine's bound with real timing: predictive stays within a few percent; allow
        // one span's worth of slack (10 of 40) for real-time jitter on this shared machine.
        assert!(
            *count <= 50,
            "window {w}: {count} admitted over a limit of 40"
        );
        assert!(*count >= 30, "window {w}: only {count} admitted");
    }
    drop(servers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_from_a_tls_redis_with_a_private_ca() {
    let redis = RedisServer::start_tls();
    let ca = std::env::temp_dir().join(format!("sluice-ca-{}.pem", std::process::id()));
    std::fs::write(&ca, redis.tls_certificate()).unwrap();
    let rules = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 2, mode: synced, spans: 60 }\n";
    let serve = Serve::start_with(
        "tls",
        &redis.url(),
        &[("d.yaml", rules)],
        &format!("store_ca_file: {}\n", ca.display()),
    );
    // Ready means the store answered over TLS.
    assert!(
        wait_until(Duration::from_secs(10), || {
            http_call(serve.admin, "GET", "/readyz", "").0 == 200
        }),
        "the TLS store was never reached"
    );
    let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"user","value":"u"}]}]}"#;
    let codes: Vec<u16> = (0..3)
        .map(|_| http_call(serve.http, "POST", "/json", body).0)
        .collect();
    assert_eq!(codes, [200, 200, 429]);
    // The counts reach the TLS Redis (a flush a second with 60 spans per minute).
    assert!(wait_until(Duration::from_secs(5), || {
        http_call(serve.admin, "GET", "/metrics", "")
            .1
            .contains("sluice_flushes_total{result=\"ok\"}")
    }));
    drop(serve);
    std::fs::remove_file(&ca).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_and_grpc_workers_share_one_limit_and_hold_their_ports() {
    let rules = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 30 }\n";
    let mut serve = Serve::start_with(
        "workers",
        "memory://",
        &[("edge.yaml", rules)],
        "api:\n  domain: edge\n  workers: 3\n",
    );
    assert_eq!(
        threads(serve.pid(), "http-"),
        ["http-0", "http-1", "http-2"]
    );
    assert_eq!(
        threads(serve.pid(), "grpc-"),
        ["grpc-0", "grpc-1", "grpc-2"]
    );

    // 60 requests for one user over /json, each on its own connection from 6 client threads
    // (the kernel spreads them over the workers), then 15 over gRPC on 5 connections: one
    // engine counts them all, 30 admitted in all.
    let http = serve.http;
    let clients: Vec<_> = (0..6)
        .map(|_| {
            std::thread::spawn(move || {
                (0..10)
                    .filter(|_| {
                        let (status, body) = http_call(
                            http,
                            "POST",
                            "/json",
                            r#"{"domain":"edge","descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}"#,
                        );
                        assert!(matches!(status, 200 | 429), "{status}: {body}");
                        status == 200
                    })
                    .count()
            })
        })
        .collect();
    let http_ok: usize = clients.into_iter().map(|c| c.join().unwrap()).sum();
    let mut grpc_ok = 0;
    for _ in 0..5 {
        let mut client = serve.client().await;
        for _ in 0..3 {
            let r = client
                .should_rate_limit(request("edge", &[&[("user", "alice")]], 1))
                .await
                .unwrap()
                .into_inner();
            grpc_ok += usize::from(ok(r.overall_code));
        }
    }
    assert_eq!(
        (http_ok, grpc_ok),
        (30, 0),
        "30 of the limit over HTTP first"
    );

    // A second process cannot take the ports the workers share.
    let dir = std::env::temp_dir().join(format!("sluice-workers-clash-{}", serve.admin));
    std::fs::create_dir_all(dir.join("rules")).unwrap();
    std::fs::write(dir.join("rules/edge.yaml"), rules).unwrap();
    for (listener, port, others) in [
        ("http", serve.http, ("grpc", "admin")),
        ("grpc", serve.grpc, ("http", "admin")),
    ] {
        std::fs::write(
            dir.join("sluice.yaml"),
            format!(
                "store: memory://\nlisten:\n  {listener}: 127.0.0.1:{port}\n  {}: 127.0.0.1:{}\n  {}: 127.0.0.1:{}\nrules: [rules/]\n",
                others.0,
                sluice_testkit::free_port(),
                others.1,
                sluice_testkit::free_port()
            ),
        )
        .unwrap();
        let clash = common::serve_to_end(&dir.join("sluice.yaml"));
        let stderr = String::from_utf8_lossy(&clash.stderr);
        assert!(!clash.status.success(), "the second process must not start");
        assert!(
            stderr.contains(&format!("cannot listen on 127.0.0.1:{port} ({listener})")),
            "{stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    let (status, body) = http_call(
        serve.http,
        "POST",
        "/json",
        r#"{"domain":"edge","descriptors":[{"entries":[{"key":"user","value":"bob"}]}]}"#,
    );
    assert_eq!(status, 200, "the first one still serves: {body}");
    // SIGTERM stops every worker and the process exits cleanly.
    assert!(serve.terminate().success());
}
