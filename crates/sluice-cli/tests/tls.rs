//! TLS on every listener (`access.tls_cert_file` / `tls_key_file`), against a real
//! `sluice serve`: the HTTP API, admin, gRPC and a gateway answer over TLS (HTTP/1.1 and
//! HTTP/2 by ALPN), plain-text clients get nothing, a client that stalls the handshake is
//! dropped within the header-read timeout, and a bad key file is a clear start-up error.

mod common;

use std::io::Read;
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{Serve, http_call, upstream};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice_testkit::{free_port, make_certificates, wait_until};

const RULES: &str = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 2 }\n";

/// `curl` over TLS trusting `ca`: (HTTP status, HTTP version) or None when it failed.
fn curl(ca: &Path, url: &str, extra: &[&str]) -> Option<(u16, String)> {
    let out = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %{http_version}",
            "--cacert",
        ])
        .arg(ca)
        .args(["--max-time", "5"])
        .args(extra)
        .arg(url)
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (code, version) = text.split_once(' ')?;
    let code: u16 = code.parse().ok()?;
    (out.status.success() && code != 0).then(|| (code, version.to_owned()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_listener_speaks_tls_when_configured_and_only_tls() {
    let certs =
        std::env::temp_dir().join(format!("sluice-tls-{}-{}", std::process::id(), free_port()));
    std::fs::create_dir_all(&certs).unwrap();
    make_certificates(&certs);
    let ca = certs.join("ca.pem");
    let (up, hits) = upstream();
    let gateway = free_port();
    let extra = format!(
        "access:\n  tls_cert_file: {}\n  tls_key_file: {}\nlisteners:\n  header_read_timeout: 1s\ngateways:\n  - listen: 127.0.0.1:{gateway}\n    upstream: http://127.0.0.1:{up}\n    domain: edge\n    routes:\n      - match: {{ path_prefix: / }}\n        rate_limits:\n          - actions:\n              - request_headers: {{ header_name: x-user-id, descriptor_key: user }}\n",
        certs.join("cert.pem").display(),
        certs.join("key.pem").display()
    );
    let serve = Serve::spawn_with("tls", "memory://", &[("edge.yaml", RULES)], &extra);
    let admin = format!("https://127.0.0.1:{}", serve.admin);
    assert!(
        wait_until(Duration::from_secs(10), || curl(
            &ca,
            &format!("{admin}/healthz"),
            &[]
        )
        .is_some()),
        "admin never answered over TLS"
    );

    // Admin and the HTTP API over TLS, HTTP/1.1 and HTTP/2 (ALPN).
    assert_eq!(
        curl(&ca, &format!("{admin}/healthz"), &["--http1.1"]),
        Some((200, "1.1".into()))
    );
    assert_eq!(
        curl(&ca, &format!("{admin}/healthz"), &["--http2"]),
        Some((200, "2".into()))
    );
    let json = format!("https://127.0.0.1:{}/json", serve.http);
    let body = r#"{"domain":"edge","descriptors":[{"entries":[{"key":"user","value":"ann"}]}]}"#;
    let post = ["-X", "POST", "-d", body];
    assert_eq!(curl(&ca, &json, &post).map(|r| r.0), Some(200));
    assert_eq!(curl(&ca, &json, &post).map(|r| r.0), Some(200));
    assert_eq!(
        curl(&ca, &json, &post).map(|r| r.0),
        Some(429),
        "the limit holds over TLS"
    );

    // The gateway over TLS: two of three reach the upstream.
    let gw = format!("https://127.0.0.1:{gateway}/x");
    let codes: Vec<u16> = (0..3)
        .map(|_| curl(&ca, &gw, &["-H", "x-user-id: bo"]).map_or(0, |r| r.0))
        .collect();
    assert_eq!(codes, [200, 200, 429]);
    assert_eq!(hits.load(std::sync::atomic::Ordering::Relaxed), 2);

    // gRPC over TLS, trusting the test CA.
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(
            std::fs::read(&ca).unwrap(),
        ))
        .domain_name("127.0.0.1");
    let channel =
        tonic::transport::Channel::from_shared(format!("https://127.0.0.1:{}", serve.grpc))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .expect("gRPC over TLS");
    let mut client = RateLimitServiceClient::new(channel);
    let request = RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: "cy".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    };
    let response = client.should_rate_limit(request).await.expect("gRPC call");
    assert_eq!(response.into_inner().overall_code, 1, "OK over TLS");

    // Plain text gets no HTTP answer on any listener.
    for port in [serve.admin, serve.http, gateway] {
        assert_eq!(
            http_call(port, "GET", "/healthz", "").0,
            0,
            "plain HTTP on {port}"
        );
    }
    // A client that opens a connection and never starts the handshake is dropped within the
    // 1 s header-read timeout (its slot back), and admin still answers.
    let mut stalled = TcpStream::connect(("127.0.0.1", serve.http)).unwrap();
    stalled
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0u8; 1];
    let clock = sluice_core::SystemClock::new();
    let started = sluice_core::Clock::now(&clock);
    let read = stalled.read(&mut buf);
    let waited = Duration::from_nanos(sluice_core::Clock::now(&clock) - started);
    assert!(
        matches!(read, Ok(0) | Err(_)) && waited < Duration::from_secs(3),
        "a stalled handshake was kept {waited:?} ({read:?})"
    );
    assert_eq!(
        curl(&ca, &format!("{admin}/healthz"), &[]).map(|r| r.0),
        Some(200)
    );
    drop(serve);

    // A key file that is not a key: `sluice serve` refuses to start and says which file.
    std::fs::write(certs.join("bad.pem"), "not a key\n").unwrap();
    let bad = extra
        .replace("key.pem", "bad.pem")
        .split("gateways:")
        .next()
        .unwrap()
        .to_owned();
    let dir = certs.join("bad");
    std::fs::create_dir_all(dir.join("rules")).unwrap();
    std::fs::write(dir.join("rules/edge.yaml"), RULES).unwrap();
    std::fs::write(
        dir.join("sluice.yaml"),
        format!(
            "listen:\n  http: 127.0.0.1:{}\n  grpc: 127.0.0.1:{}\n  admin: 127.0.0.1:{}\nrules: [rules/]\n{bad}",
            free_port(),
            free_port(),
            free_port()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--config"])
        .arg(dir.join("sluice.yaml"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("access.tls_key_file") && stderr.contains("bad.pem"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&certs);
}
