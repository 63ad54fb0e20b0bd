//! The etcd store against real etcd servers started here: the conformance suite (plain, TLS,
//! with a user), a cluster with a dead member, increments from many instances at once, keys
//! that expire with their leases, and the live-instance count.

use std::sync::Arc;
use std::time::Duration;

use sluice_core::{Clock, SystemClock};
use sluice_store::{CounterKey, CounterStore, EtcdStore, EtcdStoreOptions, EtcdTarget, FlushItem};
use sluice_testkit::{EtcdCluster, conformance};

fn target(cluster: &EtcdCluster) -> EtcdTarget {
    EtcdTarget {
        endpoints: cluster.endpoints(),
        tls: false,
        auth: None,
    }
}

fn options() -> EtcdStoreOptions {
    EtcdStoreOptions {
        timeout: Duration::from_secs(3),
        ..EtcdStoreOptions::default()
    }
}

fn clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock::new())
}

fn store(target: &EtcdTarget, options: EtcdStoreOptions) -> EtcdStore {
    EtcdStore::connect(target, options, clock()).expect("a valid target")
}

fn item(key: &str, window: u64, delta: u64, ttl: Duration) -> FlushItem {
    FlushItem {
        key: CounterKey::new(key, &["v"]).as_str().into(),
        window,
        delta,
        ttl,
        entry: None,
        want_previous: false,
        first_write: true,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_conforms_and_refuses_exact_mode() {
    let etcd = EtcdCluster::start();
    let store = store(&target(&etcd), options());
    conformance::run_synced_only(&store, "etcd").await;
    assert_eq!(store.describe(), format!("etcd://{}", etcd.endpoints()[0]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_with_a_user_conforms_and_a_wrong_password_is_a_clear_error() {
    let mut etcd = EtcdCluster::start();
    etcd.enable_auth("sluice", "s3cret");
    let login = |password: &str| EtcdTarget {
        auth: Some(sluice_store::Credentials::new(
            Some("sluice".into()),
            password,
        )),
        ..target(&etcd)
    };
    let store = store(&login("s3cret"), options());
    conformance::run_synced_only(&store, "etcd-auth").await;
    assert!(!store.describe().contains("s3cret"));

    let wrong = store_of(&login("nope"));
    assert!(wrong.time().await.is_err(), "the probe logs in too");
    let err = wrong
        .flush(&[item("auth/wrong", 1, 1, Duration::from_secs(60))], None)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("authentication failed"), "{err}");
    assert!(!err.contains("nope"), "{err}");
    // Without a login, nothing is written.
    let anonymous = store_of(&target(&etcd));
    assert!(
        anonymous
            .flush(&[item("auth/none", 1, 1, Duration::from_secs(60))], None)
            .await
            .is_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_login_token_is_renewed_without_failing_a_flush() {
    let mut etcd = EtcdCluster::start_with_token_ttl(1);
    etcd.enable_auth("sluice", "s3cret");
    let target = EtcdTarget {
        auth: Some(sluice_store::Credentials::new(
            Some("sluice".into()),
            "s3cret",
        )),
        ..target(&etcd)
    };
    let store = store_of(&target);
    let ttl = Duration::from_secs(60);
    store
        .flush(&[item("token/k", 1, 1, ttl)], None)
        .await
        .unwrap();
    // The token expires after a second unused; the next call logs in again.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let reply = store
        .flush(&[item("token/k", 1, 1, ttl)], None)
        .await
        .unwrap();
    assert_eq!(reply.results[0].as_ref().unwrap().total, 2);
}

fn store_of(target: &EtcdTarget) -> EtcdStore {
    store(target, options())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_over_tls_conforms_and_an_untrusted_server_is_refused() {
    let etcd = EtcdCluster::start_tls();
    let tls = EtcdTarget {
        tls: true,
        ..target(&etcd)
    };
    let trusting = EtcdStoreOptions {
        tls_root_pem: Some(etcd.tls_certificate()),
        ..options()
    };
    let store = store(&tls, trusting);
    conformance::run_synced_only(&store, "etcd-tls").await;
    // Without trusting its CA (verification is on), and in plain text, nothing works.
    let untrusted = store_of(&tls);
    let one = [item("tls/untrusted", 1, 1, Duration::from_secs(60))];
    assert!(untrusted.flush(&one, None).await.is_err());
    let plain = store_of(&target(&etcd));
    assert!(plain.flush(&one, None).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn increments_from_many_instances_at_once_are_all_counted_once() {
    let etcd = EtcdCluster::start();
    let stores: Vec<Arc<EtcdStore>> = (0..4).map(|_| Arc::new(store_of(&target(&etcd)))).collect();
    let ttl = Duration::from_secs(60);
    // Four instances, each with 25 flushes in flight at once on the same key (so a store
    // races itself too, and its compare-and-set must retry), plus a second key every time.
    let mut tasks = Vec::new();
    for store in &stores {
        for n in 0..25u64 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let items = [item("race/a", 3, 1, ttl), item("race/b", 3, n % 3, ttl)];
                store.flush(&items, None).await
            }));
        }
    }
    for task in tasks {
        let reply = task.await.unwrap().expect("flush");
        assert!(reply.results.iter().all(Result::is_ok));
    }
    let read = stores[0]
        .flush(
            &[item("race/a", 3, 0, ttl), item("race/b", 3, 0, ttl)],
            None,
        )
        .await
        .unwrap();
    let totals: Vec<u64> = read
        .results
        .iter()
        .map(|r| r.as_ref().unwrap().total)
        .collect();
    // race/b: per store 9 flushes of 0, 8 of 1 and 8 of 2 = 24; four stores: 96.
    assert_eq!(totals, [100, 96]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_member_is_skipped_and_keys_expire_with_their_leases() {
    let mut etcd = EtcdCluster::start_cluster(3);
    let store = store_of(&target(&etcd));
    let ttl = Duration::from_secs(1);
    let reply = store
        .flush(&[item("cluster/k", 9, 4, ttl)], None)
        .await
        .unwrap();
    assert_eq!(reply.results[0].as_ref().unwrap().total, 4);
    // The member the store talks to first dies: the next flush goes to another one (the
    // first flush after a death may fail while the connection is found broken).
    etcd.kill(0);
    let mut total = None;
    for _ in 0..5 {
        match store.flush(&[item("cluster/k", 9, 2, ttl)], None).await {
            Ok(reply) => {
                total = Some(reply.results[0].as_ref().unwrap().total);
                break;
            }
            Err(e) => assert!(e.is_unavailable(), "{e}"),
        }
    }
    assert_eq!(total, Some(6), "the surviving members took the flush");
    // A 1 s lifetime: etcd's lease keeps the keys 2 to 3 s, then they are gone.
    let count = |etcd: &EtcdCluster| {
        etcd.etcdctl(&["get", "--prefix", "sluice:v1:e:", "--keys-only"])
            .lines()
            .filter(|l| l.starts_with("sluice:"))
            .count()
    };
    assert_eq!(count(&etcd), 1, "one counter");
    let gone = sluice_testkit::wait_until(Duration::from_secs(15), || count(&etcd) == 0);
    assert!(gone, "keys outlived their lease: {} left", count(&etcd));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_announce_themselves_and_are_counted_while_live() {
    let etcd = EtcdCluster::start();
    let a = store_of(&target(&etcd));
    let b = store_of(&target(&etcd));
    let live_for = Duration::from_secs(3);
    assert_eq!(a.announce("node-a", live_for).await.unwrap().live, 1);
    assert_eq!(b.announce("node-b", live_for).await.unwrap().live, 2);
    assert_eq!(a.announce("node-a", live_for).await.unwrap().live, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_that_lands_behind_the_stores_back_is_kept_not_overwritten() {
    // A transaction the store gave up on (it timed out) may still be applied later. The
    // store's idea of its own counter is then stale; its next write must not overwrite the
    // late count. Simulated here by writing the counter from outside.
    let etcd = EtcdCluster::start();
    let store = store_of(&target(&etcd));
    let ttl = Duration::from_secs(60);
    let reply = store
        .flush(&[item("late/k", 4, 5, ttl)], None)
        .await
        .unwrap();
    assert_eq!(reply.results[0].as_ref().unwrap().total, 5);
    let listing = etcd.etcdctl(&["get", "--prefix", "sluice:v1:e:", "--keys-only"]);
    let counter = listing
        .lines()
        .find(|l| l.contains("/4/c/"))
        .expect("the store's counter");
    // The lost transaction of 3 more lands.
    etcd.etcdctl(&["put", counter, "8"]);
    let reply = store
        .flush(&[item("late/k", 4, 2, ttl)], None)
        .await
        .unwrap();
    assert_eq!(reply.results[0].as_ref().unwrap().total, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settling_a_lost_flush_fences_it_off_so_it_can_never_land_later() {
    let etcd = EtcdCluster::start();
    let store = store_of(&target(&etcd));
    let ttl = Duration::from_secs(60);
    store
        .flush(&[item("fence/k", 4, 5, ttl)], None)
        .await
        .unwrap();
    let listing = etcd.etcdctl(&["get", "--prefix", "sluice:v1:e:", "--keys-only"]);
    let counter = listing
        .lines()
        .find(|l| l.contains("/4/c/"))
        .expect("the store's counter")
        .to_owned();
    let json = etcd.etcdctl(&["get", &counter, "-w", "json"]);
    let revision: String = json
        .split("\"mod_revision\":")
        .nth(1)
        .expect("a mod_revision")
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    // A flush of 3 more under receipt 7 was lost (it never arrived): settling says so...
    let lost = [item("fence/k", 4, 3, ttl)];
    let receipt = sluice_store::FlushReceipt {
        owner: "fence-node".into(),
        token: 7,
    };
    assert_eq!(store.landed(&lost, &receipt).await.unwrap(), [Some(false)]);
    // ...and if it turns up now (its compare names the revision the store knew), it is
    // refused: the engine is sending those 3 again, and they must not count twice.
    let late = format!("mod(\"{counter}\") = \"{revision}\"\n\nput {counter} 8\n\n\n");
    let outcome = etcd.etcdctl_with_input(&["txn"], &late);
    assert!(outcome.starts_with("FAILURE"), "{outcome}");
    let reply = store
        .flush(&[item("fence/k", 4, 3, ttl)], None)
        .await
        .unwrap();
    assert_eq!(reply.results[0].as_ref().unwrap().total, 8);
    // A flush that did arrive settles as arrived.
    let receipt = sluice_store::FlushReceipt {
        token: 8,
        ..receipt
    };
    let sent = [item("fence/k", 4, 1, ttl)];
    store.flush(&sent, Some(&receipt)).await.unwrap();
    assert_eq!(store.landed(&sent, &receipt).await.unwrap(), [Some(true)]);
    let reply = store
        .flush(&[item("fence/k", 4, 0, ttl)], None)
        .await
        .unwrap();
    assert_eq!(reply.results[0].as_ref().unwrap().total, 9);
}
