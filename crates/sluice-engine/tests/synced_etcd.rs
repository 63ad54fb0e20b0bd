//! Several engine instances in one process, each with its own manual clock, sharing one real
//! etcd started by the test: the synced-mode tests of `synced_redis.rs` that apply to etcd
//! (exact mode is not offered on etcd).

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use sluice_core::SystemClock;
use sluice_store::{CounterKey, CounterStore, EtcdStore, EtcdStoreOptions, EtcdTarget, FlushItem};
use sluice_testkit::EtcdCluster;

fn etcd_store(etcd: &EtcdCluster) -> Arc<EtcdStore> {
    let target = EtcdTarget {
        endpoints: etcd.endpoints(),
        tls: false,
        auth: None,
    };
    let options = EtcdStoreOptions {
        timeout: Duration::from_millis(500),
        ..EtcdStoreOptions::default()
    };
    Arc::new(EtcdStore::connect(&target, options, Arc::new(SystemClock::new())).unwrap())
}

/// The global count etcd holds for `user` in the window of `t`, read by a fresh store.
async fn stored(etcd: &EtcdCluster, user: &str, t: u64) -> u64 {
    let item = FlushItem {
        key: CounterKey::new("d/user", &[user]).as_str().into(),
        window: t / (60 * SECOND),
        delta: 0,
        ttl: Duration::from_secs(120),
        entry: None,
        want_previous: false,
        first_write: false,
    };
    let reply = etcd_store(etcd).flush(&[item], None).await.unwrap();
    reply.results[0].as_ref().unwrap().total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_etcd_stay_within_five_percent() {
    let etcd = EtcdCluster::start();
    let limit = 300;
    let window_ns = 60 * SECOND;
    for policy in ["predictive", "reactive"] {
        let rules = synced_rule(limit, "60s", 6, policy, "fixed_window");
        let fleet = Fleet::new(&rules, etcd_store(&etcd), &[0, 0, 0], false);
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
            "etcd {policy}: admitted per window {:?}",
            admitted.values().collect::<Vec<_>>()
        );
        for (w, count) in &admitted {
            let bound = match policy {
                "predictive" => limit + limit / 20,
                _ => limit + 3 * limit / 6,
            };
            assert!(*count <= bound, "{policy} window {w}: {count}");
        }
        fleet.flush_all_ok().await;
        let last = *admitted.keys().last().unwrap();
        assert_eq!(
            stored(&etcd, &user, last * window_ns).await,
            admitted[&last],
            "etcd's counters hold exactly what was admitted"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_etcd_mid_window_never_blocks_and_loses_no_count() {
    let mut etcd = EtcdCluster::start();
    let limit = 600;
    let rules = synced_rule(limit, "60s", 6, "predictive", "fixed_window");
    let fleet = Fleet::new(&rules, etcd_store(&etcd), &[0, 0, 0], false);
    let step = SECOND / 10;
    let mut admitted = 0u64;
    let mut t = T0;
    for n in 0..600u64 {
        let offset = t - T0;
        if offset == 20 * SECOND {
            etcd.kill(0);
        }
        if offset == 40 * SECOND {
            etcd.restart(0);
        }
        fleet.set_time(t);
        fleet.flush_due().await;
        // `check` panics if a check does not complete at once (see common::now_or_never).
        if fleet.check((n % 3) as usize, "alice").allowed {
            admitted += 1;
        }
        t += step;
    }
    let mut total = 0;
    for _ in 0..20 {
        for i in &fleet.instances {
            i.engine.flush().await;
        }
        total = stored(&etcd, "alice", T0).await;
        if total == admitted {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        fleet.instances.iter().all(|i| i.engine.store_ok()),
        "store not back after restart"
    );
    assert_eq!(
        total, admitted,
        "global count against the true total admitted"
    );
    assert!(admitted <= limit + limit / 20, "admitted {admitted}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_that_times_out_is_settled_by_its_receipt_and_counted_once() {
    // At 20 s into the window etcd stops (SIGSTOP) during the span-end flushes: each
    // instance's transaction is sent and the call times out. Once etcd runs again, whether the
    // transaction was applied or dropped, its receipt says which and the count lands once.
    let etcd = EtcdCluster::start();
    let limit = 600;
    let rules = synced_rule(limit, "60s", 6, "predictive", "fixed_window");
    let fleet = Fleet::new(&rules, etcd_store(&etcd), &[0, 0, 0], false);
    let step = SECOND / 10;
    let mut admitted = 0u64;
    let mut t = T0;
    for n in 0..600u64 {
        fleet.set_time(t);
        if t - T0 == 20 * SECOND {
            etcd.pause(0);
            for i in &fleet.instances {
                let report = i.engine.flush_due().await;
                assert!(
                    report.failed == 1
                        && report
                            .error
                            .as_deref()
                            .is_some_and(|e| e.contains("answer")),
                    "a flush to a stopped etcd times out: {report:?}"
                );
            }
            etcd.resume(0);
        }
        fleet.flush_due().await;
        if fleet.check((n % 3) as usize, "alice").allowed {
            admitted += 1;
        }
        t += step;
    }
    fleet.flush_all_ok().await;
    assert_eq!(stored(&etcd, "alice", T0).await, admitted);
}
