//! Several engine instances in one process, each with its own manual clock, sharing one real
//! `redis-server` started by the test.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use sluice_store::{CounterKey, RedisStore, RedisStoreOptions};
use sluice_testkit::RedisServer;

fn redis_store(server: &RedisServer) -> Arc<RedisStore> {
    let options = RedisStoreOptions {
        timeout: Duration::from_millis(300),
        connect_timeout: Duration::from_millis(300),
        max_backoff: Duration::from_millis(200),
        ..RedisStoreOptions::default()
    };
    Arc::new(RedisStore::open(&server.url(), options).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_redis_stay_within_five_percent() {
    let server = RedisServer::start();
    let limit = 300;
    let window_ns = 60 * SECOND;
    for policy in ["predictive", "reactive"] {
        let rules = synced_rule(limit, "60s", 6, policy, "fixed_window");
        let fleet = Fleet::new(&rules, redis_store(&server), &[0, 0, 0], false);
        let user = format!("alice-{policy}");
        let step = window_ns / (2 * limit);
        let mut admitted: BTreeMap<u64, u64> = BTreeMap::new();
        let mut t = T0;
        for n in 0..(2 * limit * 3) {
            fleet.set_time(t);
            fleet.flush_due().await;
            if fleet.check((n % 3) as usize, &user).allowed {
                *admitted.entry(t / window_ns).or_default() += 1;
            }
            t += step;
        }
        eprintln!(
            "redis {policy}: admitted per window {:?}",
            admitted.values().collect::<Vec<_>>()
        );
        for (w, count) in &admitted {
            match policy {
                "predictive" => {
                    assert!(*count <= limit + limit / 20, "{policy} window {w}: {count}")
                }
                _ => assert!(
                    *count <= limit + 3 * limit / 6,
                    "{policy} window {w}: {count}"
                ),
            }
        }
        // The store's window counters hold exactly what was admitted.
        for i in &fleet.instances {
            i.engine.flush().await;
        }
        let key = CounterKey::new("d/user", &[user.as_str()]);
        let last = *admitted.keys().last().unwrap();
        let stored = server.command(&format!("GET {}:{last}", key.as_str()));
        assert!(
            stored.contains(&admitted[&last].to_string()),
            "store has {stored:?}, admitted {}",
            admitted[&last]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_redis_mid_window_never_blocks_and_loses_no_count() {
    let mut server = RedisServer::start_persistent();
    let limit = 600;
    let window_ns = 60 * SECOND;
    let rules = synced_rule(limit, "60s", 6, "predictive", "fixed_window");
    let fleet = Fleet::new(&rules, redis_store(&server), &[0, 0, 0], false);
    let step = SECOND / 10;
    let mut admitted = 0u64;
    let mut t = T0;
    let mut killed = false;
    for n in 0..600u64 {
        let offset = t - T0;
        if offset >= 20 * SECOND && !killed {
            server.kill();
            killed = true;
        }
        if offset == 40 * SECOND {
            server.restart();
        }
        fleet.set_time(t);
        fleet.flush_due().await;
        // `check` panics if a check does not complete at once (see common::now_or_never).
        if fleet.check((n % 3) as usize, "alice").allowed {
            admitted += 1;
        }
        t += step;
    }
    assert!(
        fleet.instances.iter().all(|i| i.engine.store_ok()),
        "store not back after restart"
    );
    let key = CounterKey::new("d/user", &["alice"]);
    let window = T0 / window_ns;
    let mut stored = String::new();
    for _ in 0..20 {
        for i in &fleet.instances {
            i.engine.flush().await;
        }
        stored = server.command(&format!("GET {}:{window}", key.as_str()));
        if stored.contains(&format!("\r\n{admitted}\r\n")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        stored.contains(&format!("\r\n{admitted}\r\n")),
        "global counter {stored:?} != true total admitted {admitted}"
    );
    assert!(admitted <= limit + limit / 20, "admitted {admitted}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_that_times_out_and_still_arrives_is_counted_once() {
    // At 20 s into the window Redis stops (SIGSTOP) during the span-end flushes: each
    // instance's pipeline is sent, the call times out, and once Redis runs again it applies
    // them. The counts went back to their keys; the next flush must find that they arrived.
    let server = RedisServer::start();
    let limit = 600;
    let rules = synced_rule(limit, "60s", 6, "predictive", "fixed_window");
    let fleet = Fleet::new(&rules, redis_store(&server), &[0, 0, 0], false);
    let step = SECOND / 10;
    let mut admitted = 0u64;
    let mut t = T0;
    for n in 0..600u64 {
        fleet.set_time(t);
        if t - T0 == 20 * SECOND {
            server.pause();
            for i in &fleet.instances {
                let report = i.engine.flush_due().await;
                // Timed out by redis-rs ("timed out") or by the store ("did not answer").
                assert!(
                    report.failed == 1
                        && report
                            .error
                            .as_deref()
                            .is_some_and(|e| e.contains("time") || e.contains("answer")),
                    "a flush to a stopped server times out: {report:?}"
                );
            }
            server.resume();
        }
        fleet.flush_due().await;
        if fleet.check((n % 3) as usize, "alice").allowed {
            admitted += 1;
        }
        t += step;
    }
    fleet.flush_all_ok().await;
    let key = CounterKey::new("d/user", &["alice"]);
    let stored = server.command(&format!("GET {}:{}", key.as_str(), T0 / (60 * SECOND)));
    assert!(
        stored.contains(&format!("\r\n{admitted}\r\n")),
        "global counter {stored:?} != true total admitted {admitted}"
    );
}

#[tokio::test]
async fn a_key_of_the_wrong_type_is_reported_and_kept_without_panic() {
    // Metrics go to a recorder local to this (single) test thread.
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let server = RedisServer::start();
    let rules = synced_rule(100, "60s", 6, "predictive", "fixed_window");
    let fleet = Fleet::new(&rules, redis_store(&server), &[0], false);
    fleet.set_time(T0);
    let window = T0 / (60 * SECOND);
    let bad = CounterKey::new("d/user", &["mallory"]);
    server.command(&format!("HSET {}:{window} x y", bad.as_str()));
    assert!(fleet.check(0, "mallory").allowed);
    assert!(fleet.check(0, "alice").allowed);
    let report = fleet.instances[0].engine.flush().await;
    assert_eq!(report.items, 2);
    assert_eq!(report.failed, 1, "{report:?}");
    assert!(report.error.is_none());
    // alice's count arrived; mallory's is kept for the next flush, not dropped.
    let good = CounterKey::new("d/user", &["alice"]);
    assert!(
        server
            .command(&format!("GET {}:{window}", good.as_str()))
            .contains("\r\n1\r\n")
    );
    let info = &fleet.instances[0]
        .engine
        .key_info("d", &[("user", "mallory")])[0];
    assert_eq!(info.unflushed, 1);
    let metrics = snapshotter.snapshot().into_vec();
    let value = |name: &str, label: (&str, &str)| {
        metrics.iter().find_map(|(key, _, _, value)| {
            let k = key.key();
            (k.name() == name
                && k.labels()
                    .any(|l| l.key() == label.0 && l.value() == label.1))
            .then(|| format!("{value:?}"))
        })
    };
    assert_eq!(
        value("sluice_store_errors_total", ("kind", "bad_reply")).as_deref(),
        Some("Counter(1)")
    );
    assert_eq!(
        value("sluice_decisions_total", ("outcome", "allowed")).as_deref(),
        Some("Counter(2)")
    );
    assert_eq!(
        value("sluice_flushes_total", ("result", "ok")).as_deref(),
        Some("Counter(1)")
    );
    assert!(value("sluice_tracked_keys", ("rule", "d/user")).is_some());
}

/// `HSET` calls the server has processed so far (`INFO commandstats`).
fn hset_calls(server: &RedisServer) -> u64 {
    let info = server.command("INFO commandstats");
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_hset:calls="))
        .and_then(|v| v.split(',').next()?.trim().parse().ok())
        .unwrap_or(0)
}

/// Three instances share a key. While it is far below its limit, only the window's first flush
/// exchanges entries (`HSET` + `HGETALL`); the others send only their count. Once the key nears
/// half its limit the entries come back, and the store's total is what was admitted throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_keys_far_below_their_limit_send_only_their_count() {
    let server = RedisServer::start();
    let rules = synced_rule(300, "60s", 6, "predictive", "fixed_window");
    let fleet = Fleet::new(&rules, redis_store(&server), &[0, 0, 0], false);
    let span = 10 * SECOND;
    let start = T0 + 60 * SECOND;
    let mut admitted = 0;
    let mut span_of_traffic = |k: u64, per_instance: usize| {
        fleet.set_time(start + k * span + SECOND);
        for i in 0..3 {
            for _ in 0..per_instance {
                if fleet.check(i, "carol").allowed {
                    admitted += 1;
                }
            }
        }
        fleet.set_time(start + (k + 1) * span);
    };
    let flush_all = async || {
        for i in &fleet.instances {
            let report = i.engine.flush().await;
            assert_eq!(report.failed, 0, "{report:?}");
        }
    };
    // A trickle: one request per instance and span.
    let before = hset_calls(&server);
    span_of_traffic(0, 1);
    flush_all().await;
    assert_eq!(
        hset_calls(&server) - before,
        3,
        "the window's first flush exchanges entries"
    );
    // The first instance to flush saw only itself: its next flush exchanges entries again to
    // settle whether the key is shared (docs/SYNCED.md); the other two already know.
    span_of_traffic(1, 1);
    flush_all().await;
    let settled = hset_calls(&server);
    assert_eq!(settled - before, 4);
    for k in 2..4 {
        span_of_traffic(k, 1);
        flush_all().await;
    }
    assert_eq!(
        hset_calls(&server),
        settled,
        "far below the limit (12 of 300), flushes send only the count"
    );
    // 80 per instance in a span: past half the limit, the entries come back.
    span_of_traffic(4, 80);
    flush_all().await;
    span_of_traffic(5, 1);
    flush_all().await;
    assert!(
        hset_calls(&server) > settled,
        "near the limit the instances exchange entries again"
    );
    // Nothing was lost on the way: the store's window total is what was admitted.
    let key = CounterKey::new("d/user", &["carol"]);
    let window = start / (60 * SECOND);
    let stored = server.command(&format!("GET {}:{window}", key.as_str()));
    assert!(
        stored.contains(&format!("\r\n{admitted}\r\n")),
        "store has {stored:?}, admitted {admitted}"
    );
}
