//! `sluice serve` on an etcd store: two real processes on one real etcd hold a shared limit
//! together, keep answering while etcd is down (local fallback), and count again once it is
//! back.

mod common;

use std::time::Duration;

use common::{Serve, http_call};
use sluice_core::{Clock, SystemClock};
use sluice_testkit::EtcdCluster;

/// 30 per 2 s window, synced in 2 spans (a flush a second).
const RULES: &str = "domain: edge
descriptors:
  - key: user
    rate_limit: { window: 2s, requests_per_unit: 30, spans: 2 }
";

fn check(port: u16, user: &str) -> bool {
    let body = format!(
        r#"{{"domain":"edge","descriptors":[{{"entries":[{{"key":"user","value":"{user}"}}]}}]}}"#
    );
    let (status, text) = http_call(port, "POST", "/json", &body);
    assert!(status == 200 || status == 429, "{status}: {text}");
    status == 200
}

/// 45 requests a second (1.5x the limit) for `secs`, alternately to the two instances;
/// returns the admitted count per 2 s window.
async fn drive(ports: [u16; 2], user: &str, secs: u64) -> Vec<usize> {
    let clock = SystemClock::new();
    let start = clock.now();
    let mut admitted = vec![0; (secs / 2) as usize];
    for n in 0..45 * secs {
        let due = start + n * 1_000_000_000 / 45;
        tokio::time::sleep(Duration::from_nanos(due.saturating_sub(clock.now()))).await;
        let w = ((clock.now() - start) / 2_000_000_000) as usize;
        if check(ports[(n % 2) as usize], user) && w < admitted.len() {
            admitted[w] += 1;
        }
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_etcd_share_a_limit_and_survive_its_outage() {
    let mut etcd = EtcdCluster::start();
    let store = format!("etcd://{}", etcd.endpoints().join(","));
    let a = Serve::start("etcd-a", &store, &[("edge.yaml", RULES)]);
    let b = Serve::start("etcd-b", &store, &[("edge.yaml", RULES)]);
    let ports = [a.http, b.http];
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let _windows = common::align_to_window(Duration::from_secs(2)).await;
    let shared = drive(ports, "alice", 8).await;
    eprintln!("admitted per 2 s window, etcd up: {shared:?}");
    // Alone, each instance would admit its whole limit: 60 a window together. Sharing the
    // count through etcd holds the fleet near 30 (the first window of a new key may run over
    // while it learns it is shared).
    for (w, n) in shared.iter().enumerate().skip(1) {
        assert!(
            (24..=33).contains(n),
            "window {w}: {n} of 30 ({shared:?})\nA: {}\nB: {}",
            a.log_tail(),
            b.log_tail()
        );
    }
    assert!(shared[0] <= 45, "first window {shared:?}");

    // etcd goes away: every request is still answered (the fallback share), none waits.
    etcd.kill(0);
    let down = drive(ports, "bob", 4).await;
    eprintln!("admitted per 2 s window, etcd down: {down:?}");
    assert!(
        down.iter().all(|&n| n > 0),
        "requests answered with etcd down: {down:?}"
    );
    let (_, status) = http_call(a.admin, "GET", "/status.json", "");
    assert!(status.contains(r#""health":"unreachable""#), "{status}");

    // Back (with its data): sharing resumes, but not yet exactly: for a few seconds after
    // the restart the fleet runs over (seen: 36 to 38 of 30 in the second to fourth window;
    // a known gap, docs/SERVICE.md "etcd"). It never falls back to no sharing (60 a window).
    etcd.restart(0);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let _windows = common::align_to_window(Duration::from_secs(2)).await;
    let again = drive(ports, "carol", 8).await;
    eprintln!("admitted per 2 s window, etcd back: {again:?}");
    for (w, n) in again.iter().enumerate() {
        assert!(
            (24..=42).contains(n),
            "after the outage, window {w}: {n} ({again:?})"
        );
    }
}
