//! Synced flushing through Redis Sentinel (with a forced failover) and Redis Cluster (with a
//! master killed), against real servers started by the test.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use sluice_engine::FlushReport;
use sluice_store::{CounterKey, CounterStore, FlushItem, RedisStore, RedisStoreOptions};
use sluice_testkit::{RedisCluster, RedisSentinel, conformance};

fn options() -> RedisStoreOptions {
    RedisStoreOptions {
        timeout: Duration::from_millis(2000),
        connect_timeout: Duration::from_millis(500),
        max_backoff: Duration::from_millis(200),
        ..RedisStoreOptions::default()
    }
}

/// Reads each user's window total through the store (a flush of zero).
async fn totals(store: &dyn CounterStore, users: &[String], window: u64) -> u64 {
    let items: Vec<FlushItem> = users
        .iter()
        .map(|u| conformance::item(&CounterKey::new("d/user", &[u.as_str()]), window, 0, None))
        .collect();
    let reply = store.flush(&items, None).await.expect("read totals");
    reply
        .results
        .iter()
        .map(|r| r.as_ref().expect("total").total)
        .sum()
}

/// One span of traffic: `per_user` checks for each user on the fleet's only instance.
fn traffic(fleet: &Fleet, users: &[String], per_user: usize) -> u64 {
    let mut admitted = 0;
    for u in users {
        for _ in 0..per_user {
            if fleet.check(0, u).allowed {
                admitted += 1;
            }
        }
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_while_flushing() {
    failover_while_flushing(RedisSentinel::start(), None).await;
}

/// The same with `requirepass` on the Sentinels and (another one) on the data nodes: the
/// resolver and the `+switch-master` watcher log in to the Sentinels. Without the Sentinels'
/// password the store fails with a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_with_passwords() {
    let sentinel = RedisSentinel::start_with_passwords(Some("s-pass"), Some("d-pass"));
    let mut no_login = sentinel.target();
    if let sluice_store::RedisTarget::Sentinel(sluice_store::SentinelTarget {
        sentinel_auth, ..
    }) = &mut no_login
    {
        *sentinel_auth = None;
    }
    let refused = RedisStore::connect(no_login, options()).unwrap();
    let item = conformance::item(&CounterKey::new("d/user", &["u"]), 1, 1, None);
    let error = refused
        .flush(&[item], None)
        .await
        .expect_err("no Sentinel login");
    let text = error.to_string();
    eprintln!("without the Sentinels' password: {text}");
    assert!(
        text.contains("NOAUTH") || text.to_ascii_lowercase().contains("auth"),
        "the error names the missing login: {text}"
    );
    failover_while_flushing(sentinel, Some("d-pass")).await;
}

/// The same over TLS: TLS to the Sentinels (resolving, `+switch-master`) and to the data nodes,
/// which replicate over TLS and are named by their TLS ports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_over_tls() {
    failover_while_flushing(RedisSentinel::start_tls(), None).await;
}

async fn failover_while_flushing(sentinel: RedisSentinel, data_password: Option<&str>) {
    let target = sentinel.target();
    let trusting = RedisStoreOptions {
        tls_root_pem: sentinel.tls_ports.map(|_| sentinel.tls_certificate()),
        ..options()
    };
    let store = Arc::new(RedisStore::connect(target, trusting).unwrap());
    let rules = synced_rule(1_000_000, "1h", 360, "predictive", "fixed_window");
    let fleet = Fleet::new(&rules, store.clone(), &[0], false);
    let users: Vec<String> = (0..20).map(|i| format!("user-{i}")).collect();
    let mut t = T0;
    let mut admitted = 0;
    for _ in 0..3 {
        fleet.set_time(t);
        admitted += traffic(&fleet, &users, 5);
        // Right after the fixture starts, Sentinel may still be settling the replica: a flush
        // that no replica acknowledges keeps its counts and goes again.
        let mut report = fleet.instances[0].engine.flush().await;
        for _ in 0..10 {
            if report.failed == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            report = fleet.instances[0].engine.flush().await;
        }
        assert_eq!(report.failed, 0, "{report:?}");
        t += 10 * SECOND;
    }
    let old_master = sentinel.master_port().unwrap();
    let failover = std::thread::spawn(move || {
        let new = sentinel.failover();
        (sentinel, new)
    });
    // Keep flushing every span (here: every 100 ms of real time) while the failover runs.
    let mut reports: Vec<FlushReport> = Vec::new();
    while !failover.is_finished() {
        fleet.set_time(t);
        admitted += traffic(&fleet, &users, 1);
        reports.push(fleet.instances[0].engine.flush().await);
        t += 10 * SECOND;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (sentinel, new_master) = failover.join().unwrap();
    assert_ne!(old_master, new_master);
    // The store heard Sentinel's `+switch-master` itself.
    assert!(
        sluice_testkit::wait_until(Duration::from_secs(5), || store.master_switches_seen() >= 1),
        "no +switch-master announcement reached the store"
    );
    // Within two spans after the switch, flushes succeed against the new master.
    let mut ok_after = None;
    for span in 0..2 {
        fleet.set_time(t);
        admitted += traffic(&fleet, &users, 1);
        let report = fleet.instances[0].engine.flush().await;
        t += 10 * SECOND;
        if report.failed == 0 && report.error.is_none() {
            ok_after = Some(span);
            break;
        }
    }
    assert!(
        ok_after.is_some(),
        "flushes did not resume within two spans; during failover: {reports:?}"
    );
    // Every admitted request reached the new master exactly once: nothing was written to the
    // demoted master after the switch (it would refuse with READONLY and the count be resent).
    let window = T0 / (3600 * SECOND);
    // Read on the new master itself (not through the store, whose connection is its own).
    let login = data_password.map_or_else(String::new, |p| format!(":{p}@"));
    let direct = RedisStore::open(
        &format!("redis://{login}127.0.0.1:{new_master}/"),
        options(),
    )
    .unwrap();
    let total = totals(&direct, &users, window).await;
    eprintln!(
        "admitted {admitted}, on the new master {total}; flushes during the failover: {reports:?}"
    );
    // No acknowledged count is lost; one not acknowledged is sent again and may count twice.
    assert!(
        total >= admitted,
        "counts lost in the failover: {total} < {admitted}"
    );
    assert!(
        total <= admitted + 2 * 20,
        "{total} counted for {admitted} admitted"
    );
    // Sentinel reconfigures the old master as a replica of the new one (it refuses writes).
    let demoted = sluice_testkit::wait_until(Duration::from_secs(15), || {
        sentinel.data_command(old_master, "ROLE").contains("slave")
    });
    assert!(demoted, "old master not demoted");
    drop(sentinel);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_flush_per_node_and_after_a_master_dies() {
    let mut cluster = RedisCluster::start();
    let target = cluster.target();
    let store = Arc::new(RedisStore::connect(target, options()).unwrap());
    let rules = synced_rule(1_000_000, "1h", 360, "predictive", "fixed_window");
    let fleet = Fleet::new(&rules, store.clone(), &[0], false);
    // Enough users that their hash tags land on every master.
    let users: Vec<String> = (0..300).map(|i| format!("user-{i}")).collect();
    let mut t = T0;
    fleet.set_time(t);
    let mut admitted = traffic(&fleet, &users, 2);
    let report = fleet.instances[0].engine.flush().await;
    assert_eq!(report.failed, 0, "{report:?}");
    assert_eq!(report.items, 300);
    assert_eq!(report.round_trips, 3, "one pipeline per master: {report:?}");
    admitted += traffic(&fleet, &users, 1);
    let report = fleet.instances[0].engine.flush().await;
    assert_eq!((report.items, report.failed), (300, 0), "{report:?}");
    assert_eq!(report.round_trips, 3, "one pipeline per master: {report:?}");
    for port in cluster.master_ports() {
        let keys = sluice_testkit::raw_command(port, "DBSIZE");
        assert!(
            !keys.starts_with(":0"),
            "master {port} holds no key: {keys}"
        );
    }
    let victim = cluster.master_ports()[0];
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.kill_master_and_wait_failover(victim);
        cluster
    })
    .await
    .unwrap();
    // Flushing resumes: the counts kept while the slot's master was gone arrive.
    let mut resumed = false;
    for _ in 0..20 {
        t += 10 * SECOND;
        fleet.set_time(t);
        admitted += traffic(&fleet, &users, 1);
        let report = fleet.instances[0].engine.flush().await;
        if report.failed == 0 && report.error.is_none() {
            resumed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(resumed, "flushing did not resume after the failover");
    let window = T0 / (3600 * SECOND);
    let total = totals(&*store, &users, window).await;
    // Writes acknowledged by the dead master but not yet replicated may be lost (Redis
    // replication is asynchronous); everything sent after it died arrives.
    assert!(
        total <= admitted && total >= admitted - 300 * 2,
        "total {total}, admitted {admitted}"
    );
    drop(cluster);
}
