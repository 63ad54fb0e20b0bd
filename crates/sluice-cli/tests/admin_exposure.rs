//! What the admin listener gives away. Before: `/status.json` showed a key taken from an
//! API-key header in full, and with no admin token (the default) the admin endpoints answered
//! any `Host`, so a web page could read them through DNS rebinding.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{Serve, http_call};

const RULES: &str = "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: { unit: minute, requests_per_unit: 1000 }\n";
const SECRET: &str = "sk_live_4eC39HqLyjWDarjtT1zdp7dc";

/// GET `path` on `port` with `Host: host`; returns (status, body).
fn get_with_host(port: u16, path: &str, host: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok();
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .unwrap();
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let text = String::from_utf8_lossy(&response).to_string();
    let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    (
        status,
        text.split("\r\n\r\n").nth(1).unwrap_or("").to_owned(),
    )
}

#[test]
fn the_status_masks_secret_looking_keys_and_admin_refuses_foreign_hosts() {
    let serve = Serve::start_with(
        "exposure",
        "memory://",
        &[("edge.yaml", RULES)],
        "access:\n  admin_hosts: [sluice.internal]\n",
    );
    let body = format!(
        r#"{{"domain":"edge","descriptors":[{{"entries":[{{"key":"api_key","value":"{SECRET}"}}]}}]}}"#
    );
    for _ in 0..64 {
        assert_eq!(http_call(serve.http, "POST", "/json", &body).0, 200);
    }
    let (status, page) = get_with_host(serve.admin, "/status.json", "127.0.0.1");
    assert_eq!(status, 200);
    assert!(page.contains("sk_liv"), "the key is shown, masked: {page}");
    assert!(
        !page.contains(SECRET),
        "the API key is shown in full: {page}"
    );
    let (_, html) = get_with_host(serve.admin, "/", "localhost:1234");
    assert!(!html.contains(SECRET));

    // DNS rebinding: a page on evil.example resolved to 127.0.0.1 sends its own name.
    for path in ["/status.json", "/metrics", "/rlconfig", "/"] {
        let (status, _) = get_with_host(serve.admin, path, "evil.example:9090");
        assert_eq!(status, 421, "{path} answered a foreign Host");
    }
    let (status, _) = get_with_host(serve.admin, "/status.json", "sluice.internal:9090");
    assert_eq!(status, 200, "a listed name is answered");
    // Probes answer whatever the Host (a kubelet or load balancer may use any name).
    assert_eq!(
        get_with_host(serve.admin, "/healthz", "evil.example").0,
        200
    );
    assert_eq!(get_with_host(serve.admin, "/readyz", "evil.example").0, 200);
    // POST /reload too.
    let mut stream = TcpStream::connect(("127.0.0.1", serve.admin)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok();
    stream
        .write_all(b"POST /reload HTTP/1.1\r\nHost: evil.example\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    assert!(response.starts_with("HTTP/1.1 421"), "{response}");
}
