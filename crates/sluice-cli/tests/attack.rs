//! Attack drills against real `sluice serve` processes on loopback. Each drill is an attack
//! that worked before its fix (cost overflow, path and header bypasses, slow and idle
//! connection floods, open admin and API endpoints, a password in a reload error) and states
//! the bound it now holds. Every loop is bounded; waits are bounded polls.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{Serve, http_call, upstream};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::google::protobuf::UInt64Value;
use sluice_testkit::{free_port, wait_until};

const RULES: &str = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 3 }\n  - key: generic_key\n    value: login\n    rate_limit: { unit: minute, requests_per_unit: 3 }\n";
const API_RULES: &str = "domain: api\ndescriptors:\n  - key: item\n    descriptors:\n      - key: user\n        rate_limit: { unit: minute, requests_per_unit: 5 }\n";

fn rls_request(user: &str, descriptor_hits: Option<u64>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: user.into(),
            }],
            hits_addend: descriptor_hits.map(|value| UInt64Value { value }),
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

/// Sends raw bytes as one HTTP/1.1 request; returns the status (0: no answer).
fn raw_status(port: u16, request: &[u8]) -> u16 {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return 0;
    };
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok();
    if stream.write_all(request).is_err() {
        return 0;
    }
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    String::from_utf8_lossy(&response)
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Whether the server closes `stream` within `limit`: reads (a 408 or an HTTP/2 SETTINGS
/// frame may come first) until EOF or a reset.
fn closed_within(stream: &mut TcpStream, limit: Duration) -> bool {
    let clock = sluice_core::SystemClock::new();
    let deadline = sluice_core::Clock::now(&clock) + limit.as_nanos() as u64;
    let mut buf = [0u8; 1024];
    loop {
        let left = Duration::from_nanos(deadline.saturating_sub(sluice_core::Clock::now(&clock)));
        if left.is_zero() {
            return false;
        }
        stream.set_read_timeout(Some(left)).unwrap();
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false;
            }
            Err(_) => return true,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_cost_is_refused_at_every_front_door_and_never_admits() {
    let serve = Serve::start(
        "cost",
        "memory://",
        &[("edge.yaml", RULES), ("api.yaml", API_RULES)],
    );
    let mut client = serve.client().await;
    // Use up mallory's 3.
    for _ in 0..3 {
        let r = client.should_rate_limit(rls_request("mallory", None)).await;
        assert_eq!(r.unwrap().into_inner().overall_code, Code::Ok as i32);
    }
    // gRPC: a descriptor's hits_addend of 2^64-1 (and 2^32) is INVALID_ARGUMENT, not OK.
    for hits in [u64::MAX, 1 << 32] {
        let e = client
            .should_rate_limit(rls_request("mallory", Some(hits)))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{hits}: {e:?}");
        assert!(
            e.message().contains("at most 1000000000"),
            "{}",
            e.message()
        );
    }
    // Within the cap but above the limit: a denial that says it can never fit.
    let r = client
        .should_rate_limit(rls_request("eve", Some(1_000_000_000)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    // /json: the request-level hits_addend is a u32; 4294967295 is over the cap.
    let (status, body) = http_call(
        serve.http,
        "POST",
        "/json",
        r#"{"domain":"edge","hits_addend":4294967295,"descriptors":[{"entries":[{"key":"user","value":"mallory"}]}]}"#,
    );
    assert_eq!(status, 400, "{body}");
    // The next normal request is still denied: nothing wrapped.
    let r = client
        .should_rate_limit(rls_request("mallory", None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    // /v1/acquire: amounts beyond the cap are 400; a fitting one counts.
    let (status, _) = http_call(
        serve.http,
        "POST",
        "/v1/acquire",
        r#"{"user":"u","item":"i","amount":18446744073709551615}"#,
    );
    assert_eq!(status, 400);
    let (status, body) = http_call(
        serve.http,
        "POST",
        "/v1/acquire",
        r#"{"user":"u","item":"i","amount":1000000000}"#,
    );
    assert_eq!(status, 200);
    assert!(body.contains("\"allowed\":false"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_paths_and_header_bytes_cannot_walk_past_a_limit() {
    let (up, hits) = upstream();
    let port = free_port();
    let gateway = format!(
        "gateways:\n  - listen: 127.0.0.1:{port}\n    upstream: http://127.0.0.1:{up}\n    domain: edge\n    workers: 1\n    routes:\n      - match: {{ path: /login }}\n        rate_limits:\n          - actions:\n              - generic_key: {{ descriptor_value: login }}\n      - match: {{ path_prefix: / }}\n        rate_limits:\n          - actions:\n              - request_headers: {{ header_name: x-user-id, descriptor_key: user }}\n"
    );
    let serve = Serve::start_with("bypass", "memory://", &[("edge.yaml", RULES)], &gateway);
    assert!(wait_until(Duration::from_secs(10), || http_call(
        port, "GET", "/x", ""
    )
    .0 == 200));
    let before = hits.load(Ordering::Relaxed);
    // Ten spellings of /login against a limit of 3: three reach the upstream (a trailing
    // slash, another case and `;` parameters too: Express, Spring, Tomcat serve them as
    // /login).
    let statuses: Vec<u16> = [
        "/login",
        "//login",
        "/./login",
        "/%6cogin",
        "/a/../login",
        "/%2e/login",
        "/login/",
        "/LOGIN",
        "/login;jsessionid=1",
        "/login/.",
    ]
    .iter()
    .map(|p| {
        raw_status(
            port,
            format!("GET {p} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
    })
    .collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429, 429, 429, 429, 429]);
    assert_eq!(hits.load(Ordering::Relaxed) - before, 3);
    // A user id with a byte >= 0x80 is limited like any other (3 of 6).
    let statuses: Vec<u16> = (0..6)
        .map(|_| {
            raw_status(
                port,
                b"GET /a HTTP/1.1\r\nHost: x\r\nx-user-id: mall\xffory\r\nConnection: close\r\n\r\n",
            )
        })
        .collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429]);
    // A 100 KB head is over listeners.max_header_bytes (64 KiB): refused before any work.
    let long = "u".repeat(100_000);
    let status = raw_status(
        port,
        format!("GET /a HTTP/1.1\r\nHost: x\r\nx-user-id: {long}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    );
    assert!(
        status == 431 || status == 0,
        "a head above listeners.max_header_bytes is refused, got {status}"
    );
    let id = "v".repeat(30_000);
    let statuses: Vec<u16> = (0..4)
        .map(|_| {
            raw_status(
                port,
                format!(
                    "GET /a HTTP/1.1\r\nHost: x\r\nx-user-id: {id}\r\nConnection: close\r\n\r\n"
                )
                .as_bytes(),
            )
        })
        .collect();
    assert_eq!(statuses, [200, 200, 200, 429], "30 KB ids are limited");
    drop(serve);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_idle_connections_are_capped_and_timed_out_while_admin_answers() {
    let serve = Serve::start_with(
        "slowloris",
        "memory://",
        &[("edge.yaml", RULES)],
        "listeners:\n  max_connections: 40\n  admin_max_connections: 8\n  header_read_timeout: 1s\n  idle_timeout: 2s\n",
    );
    // 40 slowloris connections (a partial head each) fill the HTTP listener; 160 more are
    // closed as soon as they are accepted.
    let mut slow = Vec::new();
    for _ in 0..200 {
        let mut s = TcpStream::connect(("127.0.0.1", serve.http)).unwrap();
        let _ = s.write_all(b"POST /v1/acquire HTTP/1.1\r\nHost: x\r\n");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        slow.push(s);
    }
    // gRPC: 100 idle TCP connections that never send the preface.
    let idle: Vec<TcpStream> = (0..100)
        .map(|_| TcpStream::connect(("127.0.0.1", serve.grpc)).unwrap())
        .collect();
    // Admin answers at once, flood or not.
    for _ in 0..5 {
        assert_eq!(http_call(serve.admin, "GET", "/healthz", "").0, 200);
    }
    // Every slow connection is closed by the server within the header-read timeout (1 s,
    // plus slack), every idle gRPC one within the idle timeout (2 s, plus slack).
    for (i, s) in slow.iter_mut().enumerate() {
        assert!(
            closed_within(s, Duration::from_secs(4)),
            "slow connection {i} stayed open"
        );
    }
    for (i, mut s) in idle.into_iter().enumerate() {
        assert!(
            closed_within(&mut s, Duration::from_secs(5)),
            "idle gRPC connection {i} stayed open"
        );
    }
    // And the API serves well-behaved clients again.
    assert!(wait_until(Duration::from_secs(5), || http_call(
        serve.http,
        "POST",
        "/json",
        r#"{"domain":"edge","descriptors":[{"entries":[{"key":"user","value":"ok"}]}]}"#
    )
    .0 == 200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_guard_admin_and_apis_and_reload_errors_hide_passwords() {
    let dir = std::env::temp_dir().join(format!(
        "sluice-tokens-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let admin_token = "admin-0123456789abcdef";
    let api_token = "api-0123456789abcdef0";
    std::fs::write(dir.join("admin.token"), format!("{admin_token}\n")).unwrap();
    std::fs::write(dir.join("api.token"), api_token).unwrap();
    let access = format!(
        "access:\n  admin_token_file: {}\n  api_token_file: {}\n",
        dir.join("admin.token").display(),
        dir.join("api.token").display()
    );
    let serve = Serve::start_with(
        "tokens",
        "memory://",
        &[("edge.yaml", RULES), ("api.yaml", API_RULES)],
        &access,
    );
    let call = |port: u16,
                method: &str,
                path: &str,
                token: Option<&str>,
                body: &str|
     -> (u16, String) {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let auth = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        let text = String::from_utf8_lossy(&out).to_string();
        (
            text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0),
            text,
        )
    };
    // Probes stay open; everything else on admin needs the admin token.
    assert_eq!(call(serve.admin, "GET", "/healthz", None, "").0, 200);
    assert_eq!(call(serve.admin, "GET", "/readyz", None, "").0, 200);
    assert_eq!(call(serve.admin, "GET", "/metrics", None, "").0, 401);
    assert_eq!(
        call(serve.admin, "GET", "/metrics", Some(api_token), "").0,
        401
    );
    assert_eq!(
        call(serve.admin, "GET", "/metrics", Some(admin_token), "").0,
        200
    );
    assert_eq!(call(serve.admin, "POST", "/reload", None, "").0, 401);
    // The APIs need the API token, refill included.
    let acquire = r#"{"user":"u","item":"i"}"#;
    assert_eq!(
        call(serve.http, "POST", "/v1/acquire", None, acquire).0,
        401
    );
    assert_eq!(
        call(
            serve.http,
            "POST",
            "/v1/refill",
            None,
            r#"{"user":"u","item":"i","amount":1}"#
        )
        .0,
        401
    );
    assert_eq!(
        call(
            serve.http,
            "POST",
            "/v1/acquire",
            Some(admin_token),
            acquire
        )
        .0,
        401
    );
    assert_eq!(
        call(serve.http, "POST", "/v1/acquire", Some(api_token), acquire).0,
        200
    );
    let mut client = serve.client().await;
    let e = client
        .should_rate_limit(rls_request("x", None))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    let mut request = tonic::Request::new(rls_request("x", None));
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {api_token}").parse().unwrap(),
    );
    assert_eq!(
        client
            .should_rate_limit(request)
            .await
            .unwrap()
            .into_inner()
            .overall_code,
        Code::Ok as i32
    );
    // A reload that fails on a store URL answers 422 without its passwords.
    let config = serve.rules_dir().parent().unwrap().join("sluice.yaml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replace(
            "store: memory://",
            "store: redis+sentinel://app:S3cretPass@127.0.0.1:1?sentinel_password=Wh4tEver",
        ),
    )
    .unwrap();
    let (status, reply) = call(serve.admin, "POST", "/reload", Some(admin_token), "");
    assert_eq!(status, 422, "{reply}");
    assert!(reply.contains("app:***@"), "{reply}");
    assert!(
        !reply.contains("S3cretPass") && !reply.contains("Wh4tEver"),
        "{reply}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
