//! RLQS fault drills with real processes: Envoy 1.40 (the `rate_limit_quota` filter) in front
//! of a plain upstream, `sluice serve` handing out its assignments, and what happens when one
//! of them fails or the rules change: Sluice killed (Envoy keeps its last assignment until its
//! TTL, then fails open, then comes back to Sluice), an Envoy restarted (the window keeps what
//! the old one admitted), and a reload that removes the rule (its buckets are abandoned).

mod common;
#[path = "common/envoy.rs"]
mod envoy;
#[path = "common/rlqs_envoy.rs"]
mod rlqs_envoy;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{Serve, http_call, upstream};
use envoy::get;
use rlqs_envoy::{metric, start_envoy};
use sluice_core::{Clock, SystemClock};
use sluice_testkit::wait_until;

const TOKEN_BUCKETS: &str = "sluice_rlqs_assignments_total{strategy=\"token_bucket\"}";
const COUNTED: &str = "sluice_rlqs_usage_total{result=\"counted\"}";
const UNCOUNTED: &str = "sluice_rlqs_usage_total{result=\"uncounted\"}";

/// Sends `n` requests of `user` to Envoy's `port` one after another: (admitted, denied).
fn burst(port: u16, user: &str, n: usize) -> (usize, usize) {
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
fn hammer(port: u16, user: &str, more: impl Fn() -> bool) -> (usize, usize) {
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
fn wait_metric(sluice: &Serve, series: &str, at_least: f64, within: Duration) {
    assert!(
        wait_until(within, || metric(sluice, series) >= at_least),
        "{series} is {} after {within:?}, not {at_least}; sluice log: {}",
        metric(sluice, series),
        sluice.log_tail()
    );
}

/// Seconds since `start` on `clock`.
fn since(clock: &SystemClock, start: u64) -> f64 {
    clock.now().saturating_sub(start) as f64 / 1e9
}

/// Sluice killed: Envoy keeps enforcing its last token bucket until the assignment's TTL runs
/// out, then applies `expired_assignment_behavior` (`ALLOW_ALL`: every request through);
/// Sluice started again on the same port: Envoy reconnects on its 5 s report timer and the
/// limit holds again.
///
/// When the kill comes, the assignment in force has at least one report interval (5 s) of
/// its TTL left (Sluice renews assignments before they have less) and at most its whole TTL
/// (15 s; the bounds below hold up to 20 s).
#[test]
fn sluice_killed_envoy_keeps_its_assignment_until_the_ttl_then_fails_open_and_comes_back() {
    let rules = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { window: 20s, requests_per_unit: 20 }\n";
    let mut sluice = Serve::start("rlqs-kill", "memory://", &[("edge.yaml", rules)]);
    let (upstream_port, hits) = upstream();
    let (_envoy, listen, _) = start_envoy(sluice.dir(), &sluice, upstream_port);
    // At a window's start, so that the assignment's rate is the window's pace over its whole
    // report intervals (late in a window it is the pace of what is left in its last ones).
    let clock = SystemClock::new();
    let window = 20 * 1_000_000_000;
    std::thread::sleep(Duration::from_nanos(
        window - clock.now() % window + 20_000_000,
    ));
    assert_eq!(get(listen, "/", "alice").0, 200);
    wait_metric(&sluice, TOKEN_BUCKETS, 1.0, Duration::from_secs(10));
    // Enforced: a token bucket refilled at the pace (about 1.3 requests a second) that saves
    // up to half the room: a burst takes at most half the room and a report interval's pace.
    let (before, _) = burst(listen, "alice", 60);
    assert!(before <= 17, "admitted {before} of 60 with Sluice up");
    let mut admitted = 1 + before;

    sluice.kill();
    let killed = clock.now();
    // Still enforced with Sluice gone, right after the kill and 4 s later.
    let (gone, _) = burst(listen, "alice", 30);
    assert!(gone <= 3, "admitted {gone} of 30 right after the kill");
    admitted += gone;
    std::thread::sleep(
        Duration::from_secs(4).saturating_sub(Duration::from_secs_f64(since(&clock, killed))),
    );
    let (later, _) = burst(listen, "alice", 20);
    assert!(later <= 6, "admitted {later} of 20 4 s after the kill");
    admitted += later;
    // Then the assignment expires and `ALLOW_ALL` lets everything through.
    let mut open_after = None;
    while since(&clock, killed) < 30.0 {
        let (ok, _) = burst(listen, "alice", 10);
        admitted += ok;
        if ok == 10 {
            open_after = Some(since(&clock, killed));
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let open_after = open_after.expect("the assignment never expired (30 s after the kill)");
    assert!(
        (5.0..=22.0).contains(&open_after),
        "failed open {open_after:.1} s after the kill: not within the last assignment's TTL"
    );
    eprintln!("failed open {open_after:.1} s after the kill");
    let (open, denied) = burst(listen, "alice", 30);
    assert_eq!((open, denied), (30, 0), "with the assignment expired");
    admitted += open;

    // Sluice back on the same port: Envoy reconnects on its report timer and gets a new
    // assignment (this process starts with empty counters: the memory store).
    sluice.restart();
    // A token bucket, or `DENY_ALL` when what Envoy reported on reconnecting (its usage since
    // the last report it built, failed open) is over this window's limit already.
    let assigned = || {
        metric(&sluice, TOKEN_BUCKETS)
            + metric(
                &sluice,
                "sluice_rlqs_assignments_total{strategy=\"deny_all\"}",
            )
    };
    assert!(
        wait_until(Duration::from_secs(15), || assigned() >= 1.0),
        "no assignment 15 s after Sluice came back; sluice log: {}",
        sluice.log_tail()
    );
    let (again, _) = burst(listen, "alice", 60);
    assert!(again <= 22, "admitted {again} of 60 after Sluice came back");
    admitted += again;
    assert_eq!(hits.load(Ordering::Relaxed) as usize, admitted);
}

/// An Envoy restarted: the new process reconnects, its first request follows
/// `no_assignment_behavior` (`ALLOW_ALL`), and what the old process admitted still counts in
/// the window (same Sluice): both together stay within the limit, where a new Envoy on a
/// Sluice that forgot would get the whole limit again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_envoy_gets_what_is_left_of_the_window() {
    const LIMIT: usize = 40;
    let window = Duration::from_secs(40);
    let rules = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { window: 40s, requests_per_unit: 40 }\n";
    let sluice = Serve::start("rlqs-envoy-restart", "memory://", &[("edge.yaml", rules)]);
    let (upstream_port, hits) = upstream();
    let (old, port_a, _) = start_envoy(sluice.dir(), &sluice, upstream_port);
    let window_of = common::align_to_window(window).await;
    let clock = SystemClock::new();
    let start = clock.now();
    // The first Envoy for 14 s of the window; its usage all reported before it goes.
    let (a, _) = hammer(port_a, "alice", || since(&clock, start) < 14.0);
    assert!(a >= 8, "the first Envoy admitted {a}");
    let reported = || metric(&sluice, COUNTED) + metric(&sluice, UNCOUNTED);
    assert!(
        wait_until(Duration::from_secs(8), || reported() >= a as f64),
        "Sluice heard of {} of the {a} requests the first Envoy admitted",
        reported()
    );
    drop(old);

    let (_new, port_b, _) = start_envoy(sluice.dir(), &sluice, upstream_port);
    let reports = metric(&sluice, "sluice_rlqs_reports_total");
    // Its first request: no assignment yet, let through; then Sluice's assignment.
    assert_eq!(get(port_b, "/", "alice").0, 200);
    wait_metric(
        &sluice,
        "sluice_rlqs_reports_total",
        reports + 1.0,
        Duration::from_secs(5),
    );
    let (b, _) = hammer(port_b, "alice", || since(&clock, start) < 39.0);
    let b = b + 1;
    assert_eq!(window_of(), 0, "the test ran past its window");
    eprintln!("first Envoy {a}, restarted Envoy {b}, limit {LIMIT}");
    // The room left after the first Envoy, the last partial interval's pace (what is admitted
    // in it lands in the next window: 5 s of the limit) and the request before the
    // assignment.
    let most = LIMIT.saturating_sub(a) + LIMIT / 8 + 1;
    assert!(
        b <= most,
        "the restarted Envoy admitted {b}, after {a} by the first: at most {most}"
    );
    assert!(a + b >= LIMIT * 3 / 4, "both admitted {} of {LIMIT}", a + b);
    assert_eq!(hits.load(Ordering::Relaxed) as usize, a + b);
}

/// A reload that removes the rule of a bucket: Sluice abandons the bucket at the Envoy's next
/// report, Envoy forgets it, and the user's requests go through without limit.
#[test]
fn a_reload_that_removes_the_rule_abandons_its_buckets() {
    let limited = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 60 }\n  - key: path\n    rate_limit: { unit: minute, requests_per_unit: 60 }\n";
    let sluice = Serve::start("rlqs-reload", "memory://", &[("edge.yaml", limited)]);
    let (upstream_port, hits) = upstream();
    let (_envoy, listen, _) = start_envoy(sluice.dir(), &sluice, upstream_port);
    assert_eq!(get(listen, "/", "alice").0, 200);
    wait_metric(&sluice, TOKEN_BUCKETS, 1.0, Duration::from_secs(10));
    // 60 at once: Envoy admits at most half the room left before its next report.
    let (before, _) = burst(listen, "alice", 60);
    assert!(before <= 32, "admitted {before} of 60 under the rule");

    let unlimited = "domain: edge\ndescriptors:\n  - key: path\n    rate_limit: { unit: minute, requests_per_unit: 60 }\n";
    std::fs::write(sluice.rules_dir().join("edge.yaml"), unlimited).unwrap();
    let (status, body) = http_call(sluice.admin, "POST", "/reload", "");
    assert_eq!(status, 200, "{body}");
    // The next report (within 5 s) is answered with an abandon.
    wait_metric(
        &sluice,
        "sluice_rlqs_assignments_total{strategy=\"abandon\"}",
        1.0,
        Duration::from_secs(10),
    );
    // Envoy starts the bucket again (no assignment: allowed), Sluice allows it all.
    let (after, denied) = burst(listen, "alice", 30);
    assert_eq!((after, denied), (30, 0), "after the rule was removed");
    wait_metric(
        &sluice,
        "sluice_rlqs_assignments_total{strategy=\"allow_all\"}",
        1.0,
        Duration::from_secs(5),
    );
    let (allowed, denied) = burst(listen, "alice", 30);
    assert_eq!((allowed, denied), (30, 0), "with the allow-all assignment");
    assert_eq!(
        hits.load(Ordering::Relaxed) as usize,
        1 + before + after + allowed
    );
}
