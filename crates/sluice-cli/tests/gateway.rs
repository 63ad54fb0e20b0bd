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

/// A `sluice serve` on the memory store with `rules` as `edge.yaml` and `config`, once its
/// gateways are ready.
fn ready_gateway(name: &str, rules: &str, config: &str) -> Serve {
    let serve = Serve::start_with(name, "memory://", &[("edge.yaml", rules)], config);
    assert!(wait_until(Duration::from_secs(10), || {
        common::http_call(serve.admin, "GET", "/readyz", "").0 == 200
    }));
    serve
}

/// An upstream that accepts connections and never answers; its port.
fn silent_upstream() -> u16 {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in silent.incoming().flatten() {
            held.push(stream);
        }
    });
    port
}

fn gateway_yaml(port: u16, upstream: u16) -> String {
    format!(
        "gateways:\n  - listen: 127.0.0.1:{port}\n    upstream: http://127.0.0.1:{upstream}\n    domain: edge\n    headers: both\n    routes:\n      - match: {{ path_prefix: / }}\n        rate_limits:\n          - actions:\n              - request_headers: {{ header_name: x-user-id, descriptor_key: user }}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_one_redis_and_a_redis_outage() {
    let mut redis = RedisServer::start();
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
                &format!("expected_instances: 3\n{}", gateway_yaml(p, up)),
            )
        })
        .collect();
    assert!(wait_until(Duration::from_secs(10), || gateways.iter().all(
        |g| common::http_call(g.admin, "GET", "/readyz", "").0 == 200
    )));
    // Align to a window start, then 3x the limit per window, spread over the gateways;
    // admissions are tallied in the gateways' windows.
    let window = Duration::from_secs(2);
    let window_of = common::align_to_window(window).await;
    let start = tokio::time::Instant::now();
    let per_window = 90u32;
    let gap = window / per_window;
    let mut admitted = [0u32; 5];
    let mut straddled = 0u32;
    let mut other = 0;
    for n in 0..per_window * 5 {
        let w = window_of();
        if n == per_window * 3 + 10 {
            redis.kill(); // Redis dies early in the fourth window.
        }
        let port = ports[n as usize % 3];
        let response = tokio::task::spawn_blocking(move || get(port, "shared"))
            .await
            .unwrap();
        // A request whose answer came back in the next window (a busy machine) may have been
        // counted in either: it is left out of the tally rather than guessed.
        let settled = window_of() == w;
        match status(&response) {
            200 if w < 5 && settled => admitted[w] += 1,
            200 if w < 5 => straddled += 1,
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
        "three gateways, 3x the limit of 30 per 2 s (Redis killed in window 4): admitted per window {admitted:?} ({straddled} admitted across a window boundary, not counted)"
    );
    assert!(
        straddled <= 5,
        "{straddled} requests straddled a window boundary"
    );
    assert_eq!(
        other, 0,
        "no request failed because of the limiter or the store"
    );
    // Window 0 is a cold start: no instance knows the others yet, so each keeps to the fallback
    // share of its `expected_instances: 3` until its first reply, and keeps exchanging entries
    // until a second reply settles whether the key is shared (the first gateway to flush at a
    // span boundary sees only itself; it used to treat the others as one group a span out of
    // date and admitted up to 37 of 30 here, docs/SYNCED.md).
    let logs = || {
        gateways
            .iter()
            .enumerate()
            .map(|(i, g)| format!("gw{i}:\n{}", g.log_tail()))
            .collect::<Vec<_>>()
            .join("\n")
    };
    // Window 0 is a cold key's first window: it keeps the bound of the others (the instances
    // know the fleet's size from the store, sync early once a span's cold share is spent,
    // and take instances a reply does not list yet as counting like themselves).
    for (w, count) in admitted.iter().enumerate().take(3) {
        let most = 36;
        assert!(
            *count <= most && *count >= 24,
            "window {w} with Redis up: {count} admitted of 30 (at most {most}); the gateways logged:\n{}",
            logs()
        );
    }
    // With Redis down, the local fallback still limits (the seed's MAX/N per span per node).
    for (w, count) in admitted.iter().enumerate().skip(3) {
        assert!(
            *count <= 60,
            "window {w} with Redis down: {count} admitted, fallback did not limit"
        );
    }
    assert!(
        upstream_hits.load(Ordering::Relaxed)
            <= u64::from(admitted.iter().sum::<u32>() + straddled) + 5
    );
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_failures_are_502_and_504_never_429_and_http2_clients_are_served() {
    // An upstream that accepts connections and never answers, and one that is not there.
    let silent_port = silent_upstream();
    let dead_port = free_port();
    let (up, _) = upstream();
    let rules = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 3 }\n";
    let (slow, dead, h2) = (free_port(), free_port(), free_port());
    let config = format!(
        "{}{}{}",
        gateway_yaml(slow, silent_port).replace(
            "    headers: both\n",
            "    headers: both\n    upstream_timeout: 300ms\n"
        ),
        gateway_yaml(dead, dead_port).replace("gateways:\n", ""),
        gateway_yaml(h2, up).replace("gateways:\n", ""),
    );
    let _serve = ready_gateway("gwfail", rules, &config);
    let timed = tokio::time::Instant::now();
    let r = tokio::task::spawn_blocking(move || get(slow, "a"))
        .await
        .unwrap();
    assert_eq!(status(&r), 504, "{r}");
    assert!(
        timed.elapsed() < Duration::from_secs(3),
        "the 300 ms upstream_timeout applies"
    );
    let r = tokio::task::spawn_blocking(move || get(dead, "b"))
        .await
        .unwrap();
    assert_eq!(status(&r), 502, "{r}");
    // A down upstream stays a 502 (the limit of 3 per user is not reached); once the limit is,
    // the limiter answers 429 before the proxy is tried.
    let mut dead_statuses = Vec::new();
    for _ in 0..4 {
        let r = tokio::task::spawn_blocking(move || get(dead, "c"))
            .await
            .unwrap();
        dead_statuses.push(status(&r));
    }
    assert_eq!(dead_statuses, [502, 502, 502, 429]);

    // HTTP/2 with prior knowledge (h2c), as gRPC clients and most proxies speak it.
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", h2))
        .await
        .unwrap();
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let request = http::Request::get(format!("http://127.0.0.1:{h2}/api"))
            .header("x-user-id", "h2-user")
            .body(http_body_util::Empty::<axum::body::Bytes>::new())
            .unwrap();
        let response = sender.send_request(request).await.unwrap();
        assert_eq!(response.version(), http::Version::HTTP_2);
        assert_eq!(response.headers()["x-ratelimit-limit"], "3");
        if response.status() == 429 {
            assert!(response.headers().contains_key("retry-after"));
        }
        statuses.push(response.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429], "over one HTTP/2 connection");
    // A HEAD the gateway answers itself (over the limit): its head and length, no body (HTTP/2
    // sends whatever body it is given, and a client resets a HEAD stream that carries one).
    let request = http::Request::head(format!("http://127.0.0.1:{h2}/api"))
        .header("x-user-id", "h2-user")
        .body(http_body_util::Empty::<axum::body::Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 429);
    assert!(response.headers().contains_key("content-length"));
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .expect("a HEAD answer without a body");
    assert!(body.to_bytes().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_path_takes_an_in_flight_slot_even_one_spelled_as_a_quota_stream() {
    // An upstream that never answers holds the gateway's one slot.
    let silent_port = silent_upstream();
    let port = free_port();
    let rules = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 100 }\n";
    let config = format!(
        "listeners: {{ max_requests_in_flight: 1 }}\n{}",
        gateway_yaml(port, silent_port)
    );
    let serve = ready_gateway("gwslots", rules, &config);
    let holder = std::thread::spawn(move || get(port, "holder"));
    std::thread::sleep(Duration::from_millis(500));
    // The RLQS streams' path is the gRPC listener's to exempt, not a gateway client's to spell:
    // normalized, this is `/upload`, and it waits for the slot like any other request.
    let r = raw(
        port,
        b"GET /envoy.service.rate_limit_quota.v3.RateLimitQuotaService/../upload HTTP/1.1\r\nHost: t\r\nx-user-id: u\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status(&r), 503, "{r}");
    assert_eq!(status(&get(port, "other")), 503);
    // Refusals the admission makes are answers of the gateway, counted as such.
    let (_, metrics) = common::http_call(serve.admin, "GET", "/metrics", "");
    let shed = r#"sluice_requests_total{door="gateway",result="shed"} 2"#;
    assert!(metrics.contains(shed), "{shed} in\n{metrics}");
    drop(holder);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_whose_body_never_starts_ends_at_the_request_timeout() {
    // An upstream that sends a head promising a body, then nothing.
    let stalling = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let stalling_port = stalling.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for mut stream in stalling.incoming().flatten() {
            let mut head = [0u8; 4096];
            let _ = stream.read(&mut head);
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n");
            held.push(stream);
        }
    });
    let port = free_port();
    let rules = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 100 }\n";
    // The gateway's request timeout is the listeners' or the upstream's timeout and a second,
    // whichever is longer: 1.3 s here. The head comes within the upstream timeout; the body's
    // first frame is read under the request timeout (then the response is sent on).
    let config = format!(
        "listeners: {{ request_timeout: 500ms }}\n{}",
        gateway_yaml(port, stalling_port).replace(
            "    headers: both\n",
            "    headers: both\n    upstream_timeout: 300ms\n"
        )
    );
    let serve = ready_gateway("gwstall", rules, &config);
    let timed = tokio::time::Instant::now();
    let r = tokio::task::spawn_blocking(move || get(port, "u"))
        .await
        .unwrap();
    assert_eq!(status(&r), 408, "{r}");
    assert!(
        timed.elapsed() < Duration::from_secs(4),
        "{:?}",
        timed.elapsed()
    );
    let (_, metrics) = common::http_call(serve.admin, "GET", "/metrics", "");
    let counted = r#"sluice_requests_total{door="gateway",result="client_error"} 1"#;
    assert!(metrics.contains(counted), "{counted} in\n{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_workers_share_one_engine_hold_the_port_and_stop_cleanly() {
    let (up, upstream_hits) = upstream();
    let port = free_port();
    let rules = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 40 }\n";
    let yaml = gateway_yaml(port, up)
        .replace("    headers: both\n", "    headers: both\n    workers: 4\n");
    let mut gw = Serve::start_with("gwworkers", "memory://", &[("edge.yaml", rules)], &yaml);
    assert_eq!(
        common::threads(gw.pid(), "gateway-"),
        ["gateway-0", "gateway-1", "gateway-2", "gateway-3"],
        "one thread per configured worker"
    );
    // 120 requests for one user, each on its own connection, from 6 client threads: the kernel
    // spreads the connections over the 4 workers, which count in one engine.
    let clients: Vec<_> = (0..6)
        .map(|_| {
            std::thread::spawn(move || {
                (0..20)
                    .map(|_| status(&get(port, "alice")))
                    .collect::<Vec<u16>>()
            })
        })
        .collect();
    let statuses: Vec<u16> = clients
        .into_iter()
        .flat_map(|c| c.join().expect("client thread"))
        .collect();
    let ok = statuses.iter().filter(|&&s| s == 200).count();
    let denied = statuses.iter().filter(|&&s| s == 429).count();
    assert_eq!((ok, denied), (40, 80), "statuses: {statuses:?}");
    assert_eq!(upstream_hits.load(Ordering::Relaxed), 40);

    // A second process cannot take the port the workers share.
    let dir = std::env::temp_dir().join(format!("sluice-gw-clash-{}", free_port()));
    std::fs::create_dir_all(dir.join("rules")).unwrap();
    std::fs::write(dir.join("rules/edge.yaml"), rules).unwrap();
    let (h, g, a) = (free_port(), free_port(), free_port());
    std::fs::write(
        dir.join("sluice.yaml"),
        format!("store: memory://\nlisten:\n  http: 127.0.0.1:{h}\n  grpc: 127.0.0.1:{g}\n  admin: 127.0.0.1:{a}\nrules: [rules/]\n{yaml}"),
    )
    .unwrap();
    let clash = common::serve_to_end(&dir.join("sluice.yaml"));
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&clash.stderr);
    assert!(!clash.status.success(), "the second process must not start");
    assert!(
        stderr.contains(&format!("cannot listen on 127.0.0.1:{port} (gateway)")),
        "{stderr}"
    );
    assert_eq!(status(&get(port, "bob")), 200, "the first one still serves");

    // SIGTERM stops every worker and the process exits cleanly.
    assert!(gw.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_applies_header_styles_routes_and_refunds_and_names_what_needs_a_restart() {
    let rules = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 3 }\n";
    let (port, dead) = (free_port(), free_port());
    let config = gateway_yaml(port, dead).replace("headers: both", "headers: ietf");
    let serve = Serve::start_with("gwreload", "memory://", &[("edge.yaml", rules)], &config);
    let r = tokio::task::spawn_blocking(move || get(port, "a"))
        .await
        .unwrap();
    assert_eq!(status(&r), 502, "{r}");
    let lower = r.to_ascii_lowercase();
    assert!(lower.contains("ratelimit-policy:"), "{r}");
    assert!(!lower.contains("x-ratelimit-limit:"), "{r}");

    // Both header styles, another header for the user, refunds on upstream failures, and a
    // listener change that only a restart can apply.
    let file = serve.dir().join("sluice.yaml");
    let text = std::fs::read_to_string(&file).unwrap();
    let moved = free_port();
    let text = text
        .replace(
            "headers: ietf",
            "headers: both\n    refund_upstream_failures: true",
        )
        .replace("header_name: x-user-id", "header_name: x-api-user")
        .replace(
            &format!("http: 127.0.0.1:{}", serve.http),
            &format!("http: 127.0.0.1:{moved}"),
        );
    std::fs::write(&file, text).unwrap();
    let admin = serve.admin;
    let (code, answer) =
        tokio::task::spawn_blocking(move || common::http_call(admin, "POST", "/reload", ""))
            .await
            .unwrap();
    assert_eq!(code, 200, "{answer}");
    assert!(
        answer.contains("NOT applied, read only at start (restart to apply): listen.http"),
        "{answer}"
    );
    // The file watcher may have reloaded first; either way one reload applied the gateway.
    assert!(
        wait_until(Duration::from_secs(5), || serve.log_tail().contains(
            &format!(
                "applied: gateway 127.0.0.1:{port} (headers, routes, refund_upstream_failures)"
            )
        )),
        "{answer}\n{}",
        serve.log_tail()
    );
    let user = move |who: &'static str| {
        raw(
            port,
            format!(
                "GET /api HTTP/1.1\r\nHost: t\r\nx-api-user: {who}\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        )
    };
    let statuses = tokio::task::spawn_blocking(move || {
        let first = user("z");
        let lower = first.to_ascii_lowercase();
        assert!(lower.contains("x-ratelimit-limit: 3"), "{first}");
        assert!(lower.contains("ratelimit-policy:"), "{first}");
        let mut statuses = vec![status(&first)];
        statuses.extend((0..4).map(|_| status(&user("z"))));
        statuses
    })
    .await
    .unwrap();
    // Refunded: a dead upstream never uses up the user's 3 per minute (before the reload the
    // fourth request was a 429).
    assert_eq!(statuses, [502; 5]);
    // The old header builds no descriptor any more: not limited, no rate-limit headers.
    let r = tokio::task::spawn_blocking(move || get(port, "a"))
        .await
        .unwrap();
    assert!(!r.to_ascii_lowercase().contains("ratelimit"), "{r}");
    // The HTTP API still listens where it started.
    let http = serve.http;
    let (code, _) = tokio::task::spawn_blocking(move || {
        common::http_call(
            http,
            "POST",
            "/json",
            r#"{"domain":"edge","descriptors":[{"entries":[{"key":"user","value":"q"}]}]}"#,
        )
    })
    .await
    .unwrap();
    assert_eq!(code, 200);

    // Another upstream: the requests after the reload reach it (connections to the old one are
    // not reused for it).
    let (live, live_hits) = upstream();
    let text = std::fs::read_to_string(&file)
        .unwrap()
        .replace(&format!("127.0.0.1:{dead}"), &format!("127.0.0.1:{live}"));
    std::fs::write(&file, text).unwrap();
    let (code, answer) =
        tokio::task::spawn_blocking(move || common::http_call(admin, "POST", "/reload", ""))
            .await
            .unwrap();
    assert_eq!(code, 200, "{answer}");
    assert!(
        wait_until(Duration::from_secs(5), || serve
            .log_tail()
            .contains(&format!("applied: gateway 127.0.0.1:{port} (upstream)"))),
        "{answer}\n{}",
        serve.log_tail()
    );
    let r = tokio::task::spawn_blocking(move || user("y"))
        .await
        .unwrap();
    assert_eq!(status(&r), 200, "{r}");
    assert_eq!(live_hits.load(Ordering::Relaxed), 1);
}

/// An upstream that answers each request with its head as the body.
fn echo_upstream() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let (mut buf, mut pending) = ([0u8; 16384], Vec::new());
                while let Ok(n @ 1..) = stream.read(&mut buf) {
                    pending.extend_from_slice(&buf[..n]);
                    while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head: Vec<u8> = pending.drain(..end + 4).collect();
                        let reply = format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nKeep-Alive: timeout=5\r\nx-upstream-secret: s\r\nConnection: x-upstream-secret\r\n\r\n",
                            head.len()
                        );
                        if stream.write_all(reply.as_bytes()).is_err()
                            || stream.write_all(&head).is_err()
                        {
                            return;
                        }
                    }
                }
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_headers_are_appended_and_hop_by_hop_headers_stay_on_their_hop() {
    let port = free_port();
    let rules = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 100 }\n";
    let _gw = Serve::start_with(
        "gwheaders",
        "memory://",
        &[("edge.yaml", rules)],
        &gateway_yaml(port, echo_upstream()),
    );
    let r = raw(
        port,
        b"GET /api?q=1 HTTP/1.1\r\nHost: t\r\nx-user-id: u\r\nx-forwarded-for: 192.0.2.1\r\nx-forwarded-for: 192.0.2.2\r\nforwarded: for=192.0.2.3\r\nx-forwarded-proto: https\r\nx-secret: s\r\nconnection: x-secret, close\r\nte: trailers\r\nkeep-alive: timeout=9\r\nproxy-connection: keep-alive\r\n\r\n",
    );
    assert_eq!(status(&r), 200, "{r}");
    let (response_head, upstream_saw) = r.split_once("\r\n\r\n").unwrap();
    let seen: Vec<String> = upstream_saw.lines().map(str::to_ascii_lowercase).collect();
    let has = |line: &str| seen.iter().any(|l| l == line);
    assert!(
        seen[0].starts_with("get /api?q=1 http/1.1"),
        "{upstream_saw}"
    );
    // Every earlier line of X-Forwarded-For, then the peer, on one line; Forwarded appended.
    assert!(
        has("x-forwarded-for: 192.0.2.1, 192.0.2.2, 127.0.0.1"),
        "{upstream_saw}"
    );
    assert!(has("forwarded: for=192.0.2.3"), "{upstream_saw}");
    assert!(has("forwarded: for=127.0.0.1;proto=http"), "{upstream_saw}");
    assert!(has("x-forwarded-proto: http"), "{upstream_saw}");
    // Hop-by-hop headers, and those the client's Connection names, are not forwarded.
    for name in [
        "x-secret",
        "te",
        "keep-alive",
        "proxy-connection",
        "connection",
    ] {
        assert!(
            !seen.iter().any(|l| l.starts_with(&format!("{name}:"))),
            "{name} reached the upstream:\n{upstream_saw}"
        );
    }
    // Nor are the upstream's on the way back.
    let back = response_head.to_ascii_lowercase();
    assert!(!back.contains("x-upstream-secret"), "{response_head}");
    assert!(!back.contains("keep-alive: timeout=5"), "{response_head}");
}
