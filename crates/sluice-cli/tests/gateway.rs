//! Three `sluice serve` gateways in front of one upstream, sharing one real Redis: traffic at
//! 3x a per-user limit, spread over the gateways; Redis killed mid-run; bad requests.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{Serve, upstream};
use sluice_testkit::{RedisServer, free_port, wait_until};

/// Sends raw request bytes; returns the whole response text.
fn raw(port: u16, request: &[u8]) -> String {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    s.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let _ = s.write_all(request);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

fn get(port: u16, user: &str) -> String {
    raw(
        port,
        format!("GET /api HTTP/1.1\r\nHost: t\r\nx-user-id: {user}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
}

fn status(response: &str) -> u16 {
    response
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn gateway_yaml(port: u16, upstream: u16) -> String {
    format!(
        "gateways:\n  - listen: 127.0.0.1:{port}\n    upstream: http://127.0.0.1:{upstream}\n    domain: edge\n    headers: both\n    routes:\n      - match: {{ path_prefix: / }}\n        rate_limits:\n          - actions:\n              - request_headers: {{ header_name: x-user-id, descriptor_key: user }}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_one_redis_and_a_redis_outage() {
    let mut redis = RedisServer::start_persistent();
    let (up, upstream_hits) = upstream();
    let rules = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { window: 2s, requests_per_unit: 30, spans: 4 }\n";
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let gateways: Vec<Serve> = ports
        .iter()
        .enumerate()
        .map(|(i, &p)| {
            Serve::start_with(
                &format!("gw{i}"),
                &redis.url(),
                &[("edge.yaml", rules)],
                &gateway_yaml(p, up),
            )
        })
        .collect();
    assert!(wait_until(Duration::from_secs(10), || gateways.iter().all(
        |g| common::http_call(g.admin, "GET", "/readyz", "").0 == 200
    )));
    // Align to a window start, then 3x the limit per window, spread over the gateways.
    let window = Duration::from_secs(2);
    let now =
        std::time::Duration::from_nanos(sluice_core::Clock::now(&sluice_core::SystemClock::new()));
    tokio::time::sleep(Duration::from_nanos(
        (window.as_nanos() - now.as_nanos() % window.as_nanos()) as u64 + 20_000_000,
    ))
    .await;
    let start = tokio::time::Instant::now();
    let per_window = 90u32;
    let gap = window / per_window;
    let mut admitted = [0u32; 5];
    let mut other = 0;
    for n in 0..per_window * 5 {
        let w = (start.elapsed().as_nanos() / window.as_nanos()) as usize;
        if n == per_window * 3 + 10 {
            redis.kill(); // Redis dies early in the fourth window.
        }
        let port = ports[n as usize % 3];
        let response = tokio::task::spawn_blocking(move || get(port, "shared"))
            .await
            .unwrap();
        match status(&response) {
            200 if w < 5 => admitted[w] += 1,
            429 => {
                let lower = response.to_ascii_lowercase();
                assert!(
                    lower.contains("retry-after: "),
                    "429 without Retry-After: {response}"
                );
                assert!(
                    lower.contains("x-ratelimit-limit: 30") && lower.contains("ratelimit-policy:"),
                    "{response}"
                );
            }
            200 => {}
            s => other += u32::from(s != 0) + u32::from(s == 0) * 1000,
        }
        tokio::time::sleep_until(start + gap * (n + 1)).await;
    }
    eprintln!(
        "three gateways, 3x the limit of 30 per 2 s (Redis killed in window 4): admitted per window {admitted:?}"
    );
    assert_eq!(
        other, 0,
        "no request failed because of the limiter or the store"
    );
    // Window 0 is a cold start: no instance knows the others' demand yet (no previous window
    // to carry rates from), so it may overshoot; from window 1 the bound holds.
    assert!(admitted[0] <= 60, "cold window: {}", admitted[0]);
    for (w, count) in admitted.iter().enumerate().skip(1).take(2) {
        assert!(
            *count <= 36 && *count >= 24,
            "window {w} with Redis up: {count} admitted of 30"
        );
    }
    // With Redis down, the local fallback still limits (the seed's MAX/N per span per node).
    for (w, count) in admitted.iter().enumerate().skip(3) {
        assert!(
            *count <= 60,
            "window {w} with Redis down: {count} admitted, fallback did not limit"
        );
    }
    assert!(upstream_hits.load(Ordering::Relaxed) <= u64::from(admitted.iter().sum::<u32>()) + 5);
    drop(gateways);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_rejected_cleanly_and_the_proxy_keeps_serving() {
    let (up, _) = upstream();
    let port = free_port();
    let rules = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 100 }\n";
    let _gw = Serve::start_with(
        "gwbad",
        "memory://",
        &[("edge.yaml", rules)],
        &gateway_yaml(port, up),
    );
    // Huge headers: rejected by the HTTP layer, not a crash.
    let huge = format!(
        "GET / HTTP/1.1\r\nHost: t\r\nx-user-id: {}\r\n\r\n",
        "a".repeat(200_000)
    );
    let r = raw(port, huge.as_bytes());
    // (hyper accepts up to ~400 KB of headers; then the request is limited like any other.)
    assert!(
        r.is_empty() || [200, 400, 431].contains(&status(&r)),
        "huge header: {}",
        &r[..r.len().min(80)]
    );
    // Invalid header bytes.
    let r = raw(
        port,
        b"GET / HTTP/1.1\r\nHost: t\r\nx-user-id: \x01\x02\r\n\r\n",
    );
    assert!(
        r.is_empty() || status(&r) == 400 || status(&r) == 200,
        "{r}"
    );
    // A malformed X-Forwarded-For is passed along with the peer appended.
    let r = raw(port, b"GET / HTTP/1.1\r\nHost: t\r\nx-user-id: u\r\nx-forwarded-for: not-an-ip\r\nConnection: close\r\n\r\n");
    assert_eq!(status(&r), 200, "{r}");
    assert!(r.contains("not-an-ip, 127.0.0.1"), "{r}");
    // Still serving.
    assert_eq!(status(&get(port, "v")), 200);
}
