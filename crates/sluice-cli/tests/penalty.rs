//! A cooldown longer than the window is a penalty, and every instance of a fleet applies it:
//! two real `sluice serve` processes on one real Redis, a key taken over its limit on one of
//! them, the other hearing of it from its next flush reply, the block outliving the window on
//! both, and lifted once the cooldown is over.

mod common;

use std::time::Duration;

use common::{Serve, http_call};
use sluice_core::{Clock, SystemClock};
use sluice_testkit::RedisServer;

/// 10 per 2 s window, synced in 2 spans (a flush a second), a 6 s penalty (3 windows).
const RULES: &str = "domain: edge
descriptors:
  - key: user
    rate_limit: { window: 2s, requests_per_unit: 10, spans: 2, cooldown: 6s }
";

/// One `/json` check for `user`: true when allowed (200), false when denied (429).
fn check(port: u16, user: &str) -> bool {
    let body = format!(
        r#"{{"domain":"edge","descriptors":[{{"entries":[{{"key":"user","value":"{user}"}}]}}]}}"#
    );
    let (status, text) = http_call(port, "POST", "/json", &body);
    assert!(status == 200 || status == 429, "{status}: {text}");
    status == 200
}

/// The `global_block` denials an instance counted (its `/metrics`).
fn blocked(admin: u16) -> u64 {
    let (_, text) = http_call(admin, "GET", "/metrics", "");
    text.lines()
        .filter(|l| {
            l.starts_with("sluice_decisions_total") && l.contains("reason=\"global_block\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_penalty_outlives_the_window_on_every_instance_and_then_lifts() {
    let redis = RedisServer::start();
    let store = redis.url();
    let a = Serve::start("penalty-a", &store, &[("edge.yaml", RULES)]);
    let b = Serve::start("penalty-b", &store, &[("edge.yaml", RULES)]);
    let ports = [a.http, b.http];
    let clock = SystemClock::new();
    // Both have announced themselves; start just after a window boundary.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let _windows = common::align_to_window(Duration::from_secs(2)).await;
    let start = clock.now();
    // 20 requests a second (4x the limit), alternately to A and B, for 14 s: (time from the
    // start, instance, allowed).
    let mut log = Vec::new();
    for n in 0..280u64 {
        let due = start + n * 50_000_000;
        tokio::time::sleep(Duration::from_nanos(due.saturating_sub(clock.now()))).await;
        let i = (n % 2) as usize;
        let t = clock.now() - start;
        log.push((t, i, check(ports[i], "mallory")));
    }
    // The longest run of denials, both instances together.
    let (mut best, mut run_start) = ((0, 0), None);
    for &(t, _, allowed) in &log {
        match (allowed, run_start) {
            (false, None) => run_start = Some(t),
            (true, Some(from)) => {
                if t - from > best.1 - best.0 {
                    best = (from, t);
                }
                run_start = None;
            }
            _ => {}
        }
    }
    let secs = |ns: u64| ns as f64 / 1e9;
    let per_window: Vec<usize> = (0..7)
        .map(|w| {
            log.iter()
                .filter(|(t, _, ok)| *ok && *t / 2_000_000_000 == w)
                .count()
        })
        .collect();
    eprintln!(
        "admitted per 2 s window {per_window:?}; every request denied from {:.2} s to {:.2} s",
        secs(best.0),
        secs(best.1)
    );
    // Without the penalty every window would admit about 10 again. With it, every request
    // to either instance is refused for the cooldown (6 s, less a flush's news), across
    // window rolls, and then the key is served again.
    let denied_for = best.1 - best.0;
    assert!(
        (5_000_000_000..=8_000_000_000).contains(&denied_for),
        "denied for {:.2} s; per window {per_window:?}\nA: {}\nB: {}",
        secs(denied_for),
        a.log_tail(),
        b.log_tail()
    );
    let rolls = best.1 / 2_000_000_000 - best.0 / 2_000_000_000;
    assert!(rolls >= 2, "the block outlived {rolls} window rolls");
    assert!(
        log.iter().any(|&(t, _, ok)| ok && t >= best.1),
        "served again after the penalty"
    );
    // Both instances applied it and counted their blocked requests.
    for (name, serve) in [("A", &a), ("B", &b)] {
        let n = blocked(serve.admin);
        assert!(n >= 20, "{name} counted {n} blocked requests");
    }
    // Another user is not touched.
    assert!(check(a.http, "alice") && check(b.http, "alice"));
}
