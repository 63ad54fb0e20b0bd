//! Load for the hostile-input figures in docs/RELIABILITY.md (driven by
//! `scripts/bench-hostile.sh`, which starts the servers and reads their memory):
//!
//! - `spray DOOR ADDR KEYS`: sends KEYS distinct values of descriptor `victim` (padded to `PAD`
//!   bytes when that is set) through one
//!   front door (`grpc` and `json`: 64 descriptors per request; `batch`: 1,000 acquires per
//!   request; `adhoc`: 1,000 acquires per request, each with an ad-hoc `limit` of one of 1,000
//!   shapes; `gateway`: one `x-victim` header per request), 16 connections at once.
//! - `probe DOOR ADDR`: six requests for one fresh `user` of a rule allowing 5 per minute, which
//!   no spray touches: prints `probe ok` when exactly the first five are allowed.
//! - `upstream ADDR`: a minimal upstream for the gateway (200 `ok`).
//! - `watch GRPC SECONDS`: one gRPC check every 2 ms (one connection, a fixed key) for
//!   SECONDS; prints a line per second of wall-clock time: `unix_second requests p99_ms max_ms
//!   over_10ms` (the request path's latency while something else happens).
//! - `slow HTTP ADMIN CONNS SECONDS`: the p99 of a well-behaved client's `/v1/acquire` and of
//!   admin `/healthz`, first alone, then while CONNS connections trickle a request head one
//!   byte a second (reconnecting when closed) or sit idle, for SECONDS.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::Instant;

const CONNECTIONS: u64 = 16;

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(addr: SocketAddr) -> Sender {
    let stream = TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).ok();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    sender
}

type Grpc = RateLimitServiceClient<tonic::transport::Channel>;

/// A gRPC client for the `grpc` door, a keep-alive HTTP connection for the others.
async fn clients(door: &str, addr: SocketAddr) -> (Option<Grpc>, Option<Sender>) {
    if door == "grpc" {
        let client = RateLimitServiceClient::connect(format!("http://{addr}"))
            .await
            .expect("grpc");
        (Some(client), None)
    } else {
        (None, Some(connect(addr).await))
    }
}

/// One request on a keep-alive connection: the status.
async fn send(
    sender: &mut Sender,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: String,
) -> u16 {
    exchange(sender, method, path, headers, body).await.0
}

/// One request on a keep-alive connection: the status and the body.
async fn exchange(
    sender: &mut Sender,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: String,
) -> (u16, Bytes) {
    let mut request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "bench");
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let request = request.body(Full::new(Bytes::from(body))).unwrap();
    sender.ready().await.expect("ready");
    let response = sender.send_request(request).await.expect("response");
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.expect("body");
    (status, body.to_bytes())
}

fn descriptor(key: &str, value: String) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: vec![Entry {
            key: key.to_owned(),
            value,
        }],
        ..Default::default()
    }
}

/// The `i`th sprayed value, padded with `x` to `PAD` bytes when that is set.
fn padded(i: u64) -> String {
    let pad: usize = std::env::var("PAD")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    let mut value = format!("k{i}-");
    while value.len() < pad {
        value.push('x');
    }
    value
}

fn json_body(values: impl Iterator<Item = u64>) -> String {
    let descriptors: Vec<String> = values
        .map(|i| {
            format!(
                r#"{{"entries":[{{"key":"victim","value":"{}"}}]}}"#,
                padded(i)
            )
        })
        .collect();
    format!(
        r#"{{"domain":"edge","descriptors":[{}]}}"#,
        descriptors.join(",")
    )
}

fn batch_body(values: impl Iterator<Item = u64>) -> String {
    let requests: Vec<String> = values
        .map(|i| format!(r#"{{"user":"{}","item":"reports"}}"#, padded(i)))
        .collect();
    format!(r#"{{"requests":[{}]}}"#, requests.join(","))
}

/// Acquires of ad-hoc limits, a key each, over 1,000 shapes (1 to 1,000 an hour).
fn adhoc_body(values: impl Iterator<Item = u64>) -> String {
    let requests: Vec<String> = values
        .map(|i| {
            format!(
                r#"{{"user":"{}","item":"reports","limit":{{"requests":{},"window":"1h"}}}}"#,
                padded(i),
                1 + i % 1000
            )
        })
        .collect();
    format!(r#"{{"requests":[{}]}}"#, requests.join(","))
}

async fn spray(door: &str, addr: SocketAddr, keys: u64) {
    let per_request = match door {
        "grpc" | "json" => 64,
        "batch" | "adhoc" => 1000,
        "gateway" => 1,
        other => panic!("unknown door {other}; use grpc, json, batch, adhoc or gateway"),
    };
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CONNECTIONS {
        let next = next.clone();
        let door = door.to_owned();
        tasks.push(tokio::spawn(async move {
            let (mut grpc, mut http) = clients(&door, addr).await;
            loop {
                let first = next.fetch_add(per_request, Ordering::Relaxed);
                if first >= keys {
                    break;
                }
                let range = first..(first + per_request).min(keys);
                let ok = match (&door[..], grpc.as_mut(), http.as_mut()) {
                    ("grpc", Some(client), _) => {
                        let request = RateLimitRequest {
                            domain: "edge".into(),
                            descriptors: range.map(|i| descriptor("victim", padded(i))).collect(),
                            hits_addend: 1,
                        };
                        client.should_rate_limit(request).await.is_ok()
                    }
                    // 429: a sprayed key in the sketch shares a cell with earlier ones.
                    ("json", _, Some(h)) => matches!(
                        send(h, "POST", "/json", &[], json_body(range)).await,
                        200 | 429
                    ),
                    ("batch", _, Some(h)) => {
                        send(h, "POST", "/v1/acquire/batch", &[], batch_body(range)).await == 200
                    }
                    ("adhoc", _, Some(h)) => {
                        send(h, "POST", "/v1/acquire/batch", &[], adhoc_body(range)).await == 200
                    }
                    (_, _, Some(h)) => {
                        let value = padded(first);
                        matches!(
                            send(h, "GET", "/", &[("x-victim", &value)], String::new()).await,
                            200 | 429
                        )
                    }
                    _ => unreachable!(),
                };
                assert!(ok, "{door}: a spray request failed");
            }
        }));
    }
    for t in tasks {
        t.await.expect("spray task");
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "spray {door}: {keys} keys in {secs:.1} s ({:.0} keys/s)",
        keys as f64 / secs
    );
}

async fn probe(door: &str, addr: SocketAddr) {
    let user = format!("probe-{}", std::process::id());
    let mut allowed = Vec::new();
    let (mut grpc, mut http) = clients(door, addr).await;
    for _ in 0..6 {
        let ok = match door {
            "grpc" => {
                let request = RateLimitRequest {
                    domain: "edge".into(),
                    descriptors: vec![descriptor("user", user.clone())],
                    hits_addend: 1,
                };
                let response = grpc.as_mut().unwrap().should_rate_limit(request).await;
                response.expect("probe").into_inner().overall_code == 1
            }
            "json" => {
                let body = format!(
                    r#"{{"domain":"edge","descriptors":[{{"entries":[{{"key":"user","value":"{user}"}}]}}]}}"#
                );
                send(http.as_mut().unwrap(), "POST", "/json", &[], body).await == 200
            }
            "batch" | "adhoc" => {
                let body = format!(r#"{{"user":"{user}","item":"probe"}}"#);
                let (_, answer) =
                    exchange(http.as_mut().unwrap(), "POST", "/v1/acquire", &[], body).await;
                answer.starts_with(br#"{"allowed":true"#)
            }
            _ => {
                let headers = [("x-user-id", user.as_str())];
                send(http.as_mut().unwrap(), "GET", "/", &headers, String::new()).await == 200
            }
        };
        allowed.push(ok);
    }
    if allowed == [true, true, true, true, true, false] {
        println!("probe {door} ok: 5 allowed, the 6th denied");
    } else {
        println!("probe {door} FAILED: {allowed:?}");
        std::process::exit(1);
    }
}

async fn watch(addr: SocketAddr, seconds: u64) {
    let (mut grpc, _) = clients("grpc", addr).await;
    let client = grpc.as_mut().expect("grpc client");
    let clock = sluice_core::SystemClock::new();
    let unix = || sluice_core::Clock::now(&clock) / 1_000_000_000;
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut second = unix();
    let mut samples: Vec<Duration> = Vec::new();
    let report = |second: u64, samples: &mut Vec<Duration>| {
        if samples.is_empty() {
            return;
        }
        let over = samples
            .iter()
            .filter(|d| **d > Duration::from_millis(10))
            .count();
        let n = samples.len();
        let (_, p99, max) = percentiles(std::mem::take(samples));
        println!("{second} {n} {p99:.2} {max:.2} {over}");
    };
    while Instant::now() < until {
        let request = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![descriptor("user", "watch".into())],
            hits_addend: 1,
        };
        let t = Instant::now();
        client
            .should_rate_limit(request)
            .await
            .expect("watch request");
        let took = t.elapsed();
        let now = unix();
        if now != second {
            report(second, &mut samples);
            second = now;
        }
        samples.push(took);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    report(second, &mut samples);
}

/// p50 and p99 of `samples` in milliseconds.
fn percentiles(mut samples: Vec<Duration>) -> (f64, f64, f64) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e3;
    (at(0.5), at(0.99), at(1.0))
}

/// Latency of a well-behaved API client and of `/healthz` for `seconds`.
async fn measure(
    http: SocketAddr,
    admin: SocketAddr,
    seconds: u64,
) -> (Vec<Duration>, Vec<Duration>) {
    let until = Instant::now() + Duration::from_secs(seconds);
    let api = tokio::spawn(async move {
        let mut sender = connect(http).await;
        let mut samples = Vec::new();
        let mut i = 0u64;
        while Instant::now() < until {
            i += 1;
            let body = format!(r#"{{"user":"good-{}","item":"reports"}}"#, i % 1000);
            let t = Instant::now();
            let status = send(&mut sender, "POST", "/v1/acquire", &[], body).await;
            samples.push(t.elapsed());
            assert!(matches!(status, 200 | 429), "api answered {status}");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        samples
    });
    let health = tokio::spawn(async move {
        let mut samples = Vec::new();
        while Instant::now() < until {
            // A new connection each time, as a probe makes.
            let t = Instant::now();
            let mut sender = connect(admin).await;
            let status = send(&mut sender, "GET", "/healthz", &[], String::new()).await;
            samples.push(t.elapsed());
            assert_eq!(status, 200);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        samples
    });
    (api.await.unwrap(), health.await.unwrap())
}

async fn slow(http: SocketAddr, admin: SocketAddr, conns: usize, seconds: u64) {
    let (api, health) = measure(http, admin, 10).await;
    let (a50, a99, _) = percentiles(api);
    let (_, h99, hmax) = percentiles(health);
    println!(
        "alone: api p50 {a50:.2} ms p99 {a99:.2} ms; healthz p99 {h99:.2} ms max {hmax:.2} ms"
    );
    let stop = Arc::new(AtomicBool::new(false));
    let reconnects = Arc::new(AtomicU64::new(0));
    let mut attackers = Vec::new();
    for i in 0..conns {
        let stop = stop.clone();
        let reconnects = reconnects.clone();
        attackers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let Ok(mut s) = TcpStream::connect(http).await else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                // Half trickle a head, half connect and say nothing.
                if i % 2 == 0
                    && s.write_all(b"POST /v1/acquire HTTP/1.1\r\nHost: x\r\n")
                        .await
                        .is_err()
                {
                    continue;
                }
                loop {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let byte: &[u8] = if i % 2 == 0 { b"X" } else { b"" };
                    if s.write_all(byte).await.is_err() || peer_closed(&s) {
                        reconnects.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (api, health) = measure(http, admin, seconds).await;
    stop.store(true, Ordering::Relaxed);
    for a in attackers {
        let _ = a.await;
    }
    let (b50, b99, _) = percentiles(api);
    let (_, g99, gmax) = percentiles(health);
    println!(
        "with {conns} slow/idle connections ({} closed by the server and reopened): api p50 {b50:.2} ms p99 {b99:.2} ms ({:.2}x alone); healthz p99 {g99:.2} ms max {gmax:.2} ms",
        reconnects.load(Ordering::Relaxed),
        b99 / a99
    );
}

/// A minimal upstream for the gateway: 200 `ok` to everything.
async fn upstream(addr: SocketAddr) {
    let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        stream.set_nodelay(true).ok();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(|_req| async {
                Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                    Bytes::from_static(b"ok"),
                )))
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// Whether the server closed the connection (a read would return 0 bytes).
fn peer_closed(s: &TcpStream) -> bool {
    let mut buf = [0u8; 1];
    matches!(s.try_read(&mut buf), Ok(0))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let addr = |i: usize| -> SocketAddr { args[i].parse().expect("host:port") };
    match args.first().map(String::as_str) {
        Some("spray") => spray(&args[1], addr(2), args[3].parse().expect("keys")).await,
        Some("probe") => probe(&args[1], addr(2)).await,
        Some("upstream") => upstream(addr(1)).await,
        Some("watch") => watch(addr(1), args[2].parse().expect("seconds")).await,
        Some("slow") => {
            slow(
                addr(1),
                addr(2),
                args[3].parse().expect("connections"),
                args[4].parse().expect("seconds"),
            )
            .await
        }
        _ => {
            eprintln!(
                "usage: hostile_load spray DOOR ADDR KEYS | probe DOOR ADDR | watch GRPC SECONDS | slow HTTP ADMIN CONNS SECONDS"
            );
            std::process::exit(2);
        }
    }
}
