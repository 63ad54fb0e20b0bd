//! Held HTTP/2 streams: a client opens the most streams each connection allows, sends their
//! heads and never finishes their bodies. Before admission read bodies first, each such stream
//! held one of the listener's in-flight slots until the request timeout, and 33 connections of
//! 128 streams took all 4,096: every legitimate call got 503 / `RESOURCE_EXHAUSTED`, which
//! Envoy's fail-open turns into no limit at all. Now a request takes a slot only once its
//! body is in, so during the hold legitimate calls get their normal answers on every door.

mod common;

use std::convert::Infallible;
use std::time::Duration;

use common::{Serve, http_call, upstream};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use http_body_util::StreamBody;
use hyper::body::{Bytes, Frame};
use hyper_util::rt::{TokioExecutor, TokioIo};
use sluice_testkit::{free_port, wait_until};
use tokio::task::JoinSet;

const RULES: &str = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n";
const CONNECTIONS: usize = 33;
const STREAMS: usize = 128;

type Held = StreamBody<futures_util::stream::Pending<Result<Frame<Bytes>, Infallible>>>;

/// Opens `CONNECTIONS` HTTP/2 connections to `port` and on each `STREAMS` requests to `path`
/// whose bodies never end. Returns once every head is sent; the tasks hold them until aborted.
async fn hold_streams(port: u16, path: &'static str, grpc: bool, held: &mut JoinSet<()>) {
    for _ in 0..CONNECTIONS {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        let (sender, connection) = hyper::client::conn::http2::handshake::<_, _, Held>(
            TokioExecutor::new(),
            TokioIo::new(tcp),
        )
        .await
        .expect("h2 handshake");
        held.spawn(async move {
            let _ = connection.await;
        });
        for _ in 0..STREAMS {
            let mut sender = sender.clone();
            if sender.ready().await.is_err() {
                break;
            }
            let mut request = http::Request::post(format!("http://127.0.0.1:{port}{path}"));
            if grpc {
                request = request
                    .header("content-type", "application/grpc")
                    .header("te", "trailers");
            }
            let request = request
                .body(StreamBody::new(futures_util::stream::pending()))
                .unwrap();
            let response = sender.send_request(request);
            held.spawn(async move {
                let _ = response.await;
            });
        }
    }
    // Let the server see every head.
    tokio::time::sleep(Duration::from_millis(500)).await;
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_http2_streams_hold_no_slot_and_every_door_keeps_answering() {
    let (up, _) = upstream();
    let gateway_port = free_port();
    let extra = format!(
        "listeners:\n  body_read_timeout: 30s\ngateways:\n  - listen: 127.0.0.1:{gateway_port}\n    upstream: http://127.0.0.1:{up}\n    domain: edge\n    workers: 2\n    routes:\n      - match: {{ path_prefix: / }}\n        rate_limits:\n          - actions:\n              - request_headers: {{ header_name: x-user-id, descriptor_key: user }}\n"
    );
    let serve = Serve::start_with("held", "memory://", &[("edge.yaml", RULES)], &extra);
    assert!(wait_until(Duration::from_secs(10), || http_call(
        gateway_port,
        "GET",
        "/",
        ""
    )
    .0 == 200));
    let rss_before = rss_kib(serve.pid());
    let mut held = JoinSet::new();
    hold_streams(
        serve.grpc,
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        true,
        &mut held,
    )
    .await;
    hold_streams(serve.http, "/json", false, &mut held).await;
    hold_streams(gateway_port, "/upload", false, &mut held).await;
    let rss_during = rss_kib(serve.pid());

    // During the hold, ten legitimate calls on each door get a normal answer.
    let mut client = serve.client().await;
    let mut grpc_ok = 0;
    for i in 0..10 {
        let request = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "user".into(),
                    value: format!("grpc-{}", i % 2),
                }],
                ..Default::default()
            }],
            hits_addend: 1,
        };
        if client.should_rate_limit(request).await.is_ok() {
            grpc_ok += 1;
        }
    }
    let json_ok = (0..10)
        .filter(|i| {
            let body = format!(
                r#"{{"domain":"edge","descriptors":[{{"entries":[{{"key":"user","value":"json-{}"}}]}}]}}"#,
                i % 2
            );
            matches!(http_call(serve.http, "POST", "/json", &body).0, 200 | 429)
        })
        .count();
    let gateway_ok = (0..10)
        .filter(|_| matches!(http_call(gateway_port, "GET", "/page", "").0, 200 | 429))
        .count();
    let status = http_call(serve.admin, "GET", "/status.json", "").1;
    held.abort_all();
    eprintln!(
        "held {} streams per door; RSS {rss_before} KiB before, {rss_during} KiB during; normal answers: grpc {grpc_ok}/10, json {json_ok}/10, gateway {gateway_ok}/10",
        CONNECTIONS * STREAMS
    );
    assert!(grpc_ok >= 9, "gRPC answered {grpc_ok} of 10 normally");
    assert!(json_ok >= 9, "/json answered {json_ok} of 10 normally");
    assert!(
        gateway_ok >= 9,
        "the gateway answered {gateway_ok} of 10 normally"
    );
    assert!(
        status.contains("\"listeners\""),
        "/status.json reports the listeners: {status}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_waiting_room_drops_the_oldest_held_stream_and_readiness_says_so() {
    let serve = Serve::start_with(
        "room",
        "memory://",
        &[("edge.yaml", RULES)],
        "listeners:\n  max_bodies_waiting: 64\n  body_read_timeout: 30s\n",
    );
    assert_eq!(http_call(serve.admin, "GET", "/readyz", "").0, 200);
    let mut held = JoinSet::new();
    // 33 x 128 held streams against a room of 64: the oldest are dropped as newer ones come.
    hold_streams(serve.http, "/json", false, &mut held).await;
    let body = r#"{"domain":"edge","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}"#;
    let ok = (0..10)
        .filter(|_| matches!(http_call(serve.http, "POST", "/json", body).0, 200 | 429))
        .count();
    assert!(ok >= 9, "{ok} of 10 legitimate calls answered normally");
    let (ready, why) = http_call(serve.admin, "GET", "/readyz", "");
    assert_eq!(ready, 503, "readiness tells it is shedding: {why}");
    assert!(why.contains("http"), "{why}");
    let metrics = http_call(serve.admin, "GET", "/metrics", "").1;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("sluice_requests_shed_total{")
                && l.contains("listener=\"http\"")
                && l.contains("reason=\"waiting\"")),
        "the shed requests are counted"
    );
    held.abort_all();
}

/// An upstream that answers every request with a 64 MiB body and counts the connections the
/// gateway closed before the body was through.
fn big_upstream() -> (u16, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    use std::io::{Read as _, Write as _};
    use std::sync::atomic::Ordering;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let closed = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = closed.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let counter = counter.clone();
            std::thread::spawn(move || {
                let mut stream = stream;
                let mut head = [0u8; 4096];
                let _ = stream.read(&mut head);
                let size = 64 << 20;
                let chunk = vec![b'x'; 1 << 16];
                let mut ok = stream
                    .write_all(
                        format!("HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n").as_bytes(),
                    )
                    .is_ok();
                let mut sent = 0;
                while ok && sent < size {
                    ok = stream.write_all(&chunk).is_ok();
                    sent += chunk.len();
                }
                if !ok {
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    (port, closed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_and_keeps_pinging_does_not_pin_the_upstream() {
    use std::sync::atomic::Ordering;
    let (up, closed) = big_upstream();
    let gateway_port = free_port();
    let extra = format!(
        "listeners:\n  idle_timeout: 2s\ngateways:\n  - listen: 127.0.0.1:{gateway_port}\n    upstream: http://127.0.0.1:{up}\n    domain: edge\n    workers: 1\n    upstream_timeout: 5s\n    routes:\n      - match: {{ path_prefix: / }}\n        rate_limits:\n          - actions:\n              - request_headers: {{ header_name: x-user-id, descriptor_key: user }}\n"
    );
    let _serve = Serve::start_with("stall", "memory://", &[("edge.yaml", RULES)], &extra);
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", gateway_port))
        .await
        .unwrap();
    // A client that PINGs every 300 ms (its connection is never idle) and opens a small window
    // it never widens: it reads nothing of the body.
    let (mut sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .timer(hyper_util::rt::TokioTimer::new())
        .keep_alive_interval(Duration::from_millis(300))
        .keep_alive_while_idle(true)
        .initial_stream_window_size(65_535)
        .adaptive_window(false)
        .handshake::<_, http_body_util::Empty<Bytes>>(TokioIo::new(tcp))
        .await
        .unwrap();
    let driver = tokio::spawn(connection);
    sender.ready().await.unwrap();
    let request = http::Request::get(format!("http://127.0.0.1:{gateway_port}/big"))
        .body(http_body_util::Empty::new())
        .unwrap();
    let response = sender.send_request(request).await.expect("response head");
    assert_eq!(response.status(), 200);
    // The gateway cuts the response after its 2 s idle timeout and so frees the upstream
    // connection; before, it stayed pinned as long as the client kept pinging.
    let freed = sluice_testkit::wait_until(Duration::from_secs(12), || {
        closed.load(Ordering::Relaxed) >= 1
    });
    drop(response);
    driver.abort();
    assert!(
        freed,
        "the upstream connection stayed pinned by a client that reads nothing"
    );
}
