//! What the tests of RLQS with real Envoys share: an Envoy with the `rate_limit_quota` filter
//! in front of an upstream, getting its assignments from one `sluice serve`, a counter of
//! Sluice's metrics, and a steady load of one user's requests tallied per window.

#![allow(dead_code)]

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use sluice_testkit::{free_port, wait_until};

use crate::common::{Serve, http_call};
use crate::envoy::{self, get};

/// Envoy with the `rate_limit_quota` filter: the shipped `examples/envoy-rlqs.yaml` on these
/// ports. Requests with `x-user-id` go to the bucket `{user: <its value>}` of domain `edge`;
/// before the first assignment and after one expires, requests are let through (a Sluice that
/// is down does not take the site down).
pub fn rlqs_envoy_config(listen: u16, admin: u16, upstream: u16, sluice_grpc: u16) -> String {
    let path =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/envoy-rlqs.yaml");
    let mut config = std::fs::read_to_string(&path).expect("examples/envoy-rlqs.yaml");
    for (shipped, port) in [
        (10000, listen),
        (9901, admin),
        (3000, upstream),
        (8081, sluice_grpc),
    ] {
        let from = format!("port_value: {shipped} }}");
        assert_eq!(
            config.matches(&from).count(),
            1,
            "{from} in {}",
            path.display()
        );
        config = config.replace(&from, &format!("port_value: {port} }}"));
    }
    config
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

/// Sends `per_second` requests of `user` to Envoy's `port` until `windows` windows have
/// passed, and tallies the upstream's admissions (200s) per window of `window`.
pub fn load(
    port: u16,
    user: &'static str,
    per_second: f64,
    window: Duration,
    windows: usize,
) -> std::thread::JoinHandle<Vec<u64>> {
    load_phases(port, user, &[(per_second, windows)], window)
}

/// Like [`load`], in phases: `(per_second, windows)` each, one after the other.
pub fn load_phases(
    port: u16,
    user: &'static str,
    phases: &[(f64, usize)],
    window: Duration,
) -> std::thread::JoinHandle<Vec<u64>> {
    // The rate of each window.
    let rates: Vec<f64> = phases
        .iter()
        .flat_map(|&(rate, n)| std::iter::repeat_n(rate, n))
        .collect();
    std::thread::spawn(move || {
        use sluice_core::{Clock, SystemClock};
        let clock = SystemClock::new();
        let window_ns = window.as_nanos() as u64;
        let first = clock.now() / window_ns;
        let mut admitted = vec![0u64; rates.len()];
        let mut next = clock.now();
        let mut trace = std::env::var_os("SLUICE_TEST_TRACE").map(|dir| {
            let path = std::path::Path::new(&dir).join(format!("{port}-{user}.log"));
            std::io::BufWriter::new(std::fs::File::create(path).unwrap())
        });
        loop {
            let sent = clock.now();
            let w = (sent / window_ns - first) as usize;
            let Some(rate) = rates.get(w) else {
                return admitted;
            };
            let code = get(port, "/", user).0;
            if let Some(trace) = trace.as_mut() {
                use std::io::Write as _;
                let _ = writeln!(trace, "{sent} {} {code}", clock.now() - sent);
            }
            if code == 200 {
                admitted[w] += 1;
            }
            next += Duration::from_secs_f64(1.0 / rate).as_nanos() as u64;
            std::thread::sleep(Duration::from_nanos(next.saturating_sub(clock.now())));
        }
    })
}
