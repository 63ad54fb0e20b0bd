//! Envoys with the `rate_limit_quota` filter in front of an upstream, getting their
//! assignments from a `sluice serve`: their config, and reading Sluice's counters.

#![allow(dead_code)]

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use sluice_testkit::{free_port, wait_until};

use crate::common::{Serve, http_call};
use crate::envoy::{self, get};

/// Envoy with the `rate_limit_quota` filter: requests with `x-user-id` go to the bucket
/// `{user: <its value>}` of domain `edge`; before the first assignment and after one expires,
/// requests are let through (a Sluice that is down does not take the site down).
pub fn rlqs_envoy_config(listen: u16, admin: u16, upstream: u16, sluice_grpc: u16) -> String {
    let head = envoy::head(listen, admin);
    let clusters = envoy::clusters(upstream, sluice_grpc);
    format!(
        r#"
{head}                stat_prefix: ingress
                # A 429 answers at once (Envoy waits 1 s by default before closing after a
                # local reply with `Connection: close`).
                delayed_close_timeout: 0s
                route_config:
                  virtual_hosts:
                    - name: all
                      domains: ["*"]
                      routes:
                        - match: {{ prefix: "/" }}
                          route: {{ cluster: upstream }}
                http_filters:
                  - name: envoy.filters.http.rate_limit_quota
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig
                      domain: edge
                      rlqs_server: {{ envoy_grpc: {{ cluster_name: sluice }} }}
                      bucket_matchers:
                        matcher_list:
                          matchers:
                            - predicate:
                                single_predicate:
                                  input:
                                    name: user
                                    typed_config:
                                      "@type": type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput
                                      header_name: x-user-id
                                  value_match: {{ safe_regex: {{ google_re2: {{}}, regex: ".+" }} }}
                              on_match:
                                action:
                                  name: rate_limit_quota
                                  typed_config:
                                    "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings
                                    bucket_id_builder:
                                      bucket_id_builder:
                                        user:
                                          custom_value:
                                            name: user
                                            typed_config:
                                              "@type": type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput
                                              header_name: x-user-id
                                    reporting_interval: 5s
                                    no_assignment_behavior:
                                      fallback_rate_limit: {{ blanket_rule: ALLOW_ALL }}
                                    expired_assignment_behavior:
                                      fallback_rate_limit: {{ blanket_rule: ALLOW_ALL }}
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
{clusters}"#
    )
}

/// A counter of Sluice's `/metrics` (0 when absent).
pub fn metric(sluice: &Serve, series: &str) -> f64 {
    let (_, text) = http_call(sluice.admin, "GET", "/metrics", "");
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// Starts an Envoy (config above, log in `dir`) in front of `upstream`, asking `sluice` for
/// assignments: the process, its listener's port and its admin port.
pub fn start_envoy(dir: &Path, sluice: &Serve, upstream: u16) -> (envoy::Envoy, u16, u16) {
    let (listen, admin) = (free_port(), free_port());
    let config = dir.join(format!("envoy-{listen}.yaml"));
    std::fs::write(
        &config,
        rlqs_envoy_config(listen, admin, upstream, sluice.grpc),
    )
    .unwrap();
    let log_path = dir.join(format!("envoy-{listen}.log"));
    let log = std::fs::File::create(&log_path).unwrap();
    let envoy = envoy::start(&config, listen, Stdio::from(log));
    assert!(
        wait_until(Duration::from_secs(30), || get(admin, "/ready", "-").0
            == 200),
        "envoy did not become ready: {}",
        std::fs::read_to_string(&log_path).unwrap_or_default()
    );
    (envoy, listen, admin)
}

/// Sends `n` requests of `user` to Envoy's `port` one after another: (admitted, denied).
pub fn burst(port: u16, user: &str, n: usize) -> (usize, usize) {
    let codes: Vec<u16> = (0..n).map(|_| get(port, "/", user).0).collect();
    let admitted = codes.iter().filter(|&&c| c == 200).count();
    let denied = codes.iter().filter(|&&c| c == 429).count();
    assert_eq!(
        admitted + denied,
        n,
        "answers other than 200 and 429: {codes:?}"
    );
    (admitted, denied)
}

/// Sends `user`'s requests to Envoy's `port` every 50 ms while `more()` holds: (admitted,
/// denied).
pub fn hammer(port: u16, user: &str, more: impl Fn() -> bool) -> (usize, usize) {
    let (mut admitted, mut denied) = (0, 0);
    while more() {
        match get(port, "/", user).0 {
            200 => admitted += 1,
            429 => denied += 1,
            other => panic!("envoy answered {other}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    (admitted, denied)
}

/// Waits (up to `within`) until Sluice's counter `series` reaches `at_least`.
pub fn wait_metric(sluice: &Serve, series: &str, at_least: f64, within: Duration) {
    assert!(
        wait_until(within, || metric(sluice, series) >= at_least),
        "{series} is {} after {within:?}, not {at_least}; sluice log: {}",
        metric(sluice, series),
        sluice.log_tail()
    );
}
