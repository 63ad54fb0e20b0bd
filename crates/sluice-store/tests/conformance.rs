//! The conformance suite of `sluice-testkit` against every store: memory, Redis standalone,
//! Sentinel and Cluster (real servers started here).

use std::sync::Arc;
use std::time::Duration;

use sluice_core::ManualClock;
use sluice_store::{CounterStore, FlushItem, MemoryStore, RedisStore, RedisStoreOptions};
use sluice_testkit::{RedisCluster, RedisSentinel, RedisServer, conformance};

fn options() -> RedisStoreOptions {
    RedisStoreOptions {
        timeout: Duration::from_secs(2),
        ..RedisStoreOptions::default()
    }
}

/// [`options`] trusting the CA certificate `pem` (the TLS fixtures make their own CA).
fn trusting(pem: Vec<u8>) -> RedisStoreOptions {
    RedisStoreOptions {
        tls_root_pem: Some(pem),
        ..options()
    }
}

#[tokio::test]
async fn memory_store_conforms() {
    let store = MemoryStore::new(Arc::new(ManualClock::new(1_700_000_000_000_000_000)));
    conformance::run(&store, "mem").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_standalone_conforms() {
    let server = RedisServer::start();
    let store = RedisStore::open(&server.url(), options()).unwrap();
    conformance::run(&store, "standalone").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_with_an_acl_user_conforms_and_a_wrong_password_is_a_clear_error() {
    let server = RedisServer::start();
    // A user limited to Sluice's keys (prefix `sluice:`) and the commands it needs; the default
    // user switched off, so nothing works without logging in.
    assert!(
        server
            .command("ACL SETUSER sluice on >s3cret ~sluice:* &* +@all")
            .starts_with("+OK")
    );
    assert!(server.command("ACL SETUSER default off").starts_with("+OK"));
    let url = format!("redis://sluice:s3cret@127.0.0.1:{}/", server.port());
    let store = RedisStore::open(&url, options()).unwrap();
    conformance::run(&store, "acl").await;

    let wrong = format!("redis://sluice:nope@127.0.0.1:{}/", server.port());
    let store = RedisStore::open(&wrong, options()).unwrap();
    let err = store.time().await.unwrap_err().to_string();
    assert!(
        err.contains("WRONGPASS") || err.to_lowercase().contains("auth"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_tls_conforms() {
    let server = RedisServer::start_tls();
    let store = RedisStore::open(&server.url(), trusting(server.tls_certificate())).unwrap();
    conformance::run(&store, "tls").await;
    // Without trusting its certificate, the server is refused (verification is on).
    let store = RedisStore::open(&server.url(), options()).unwrap();
    assert!(store.time().await.is_err());
    // The same port in plain text is refused (it speaks only TLS).
    let plain = format!("redis://127.0.0.1:{}/", server.port());
    let store = RedisStore::open(&plain, options()).unwrap();
    assert!(store.time().await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_sentinel_conforms() {
    let sentinel = RedisSentinel::start();
    let target = sentinel.target();
    let store = RedisStore::connect(target, options()).unwrap();
    conformance::run(&store, "sentinel").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_sentinel_over_tls_conforms() {
    let sentinel = RedisSentinel::start_tls();
    let store =
        RedisStore::connect(sentinel.target(), trusting(sentinel.tls_certificate())).unwrap();
    conformance::run(&store, "sentinel-tls").await;
    // Without trusting the CA, the Sentinels are refused (verification is on).
    let store = RedisStore::connect(sentinel.target(), options()).unwrap();
    assert!(store.time().await.is_err());
    // Plain text to the Sentinels' TLS ports fails too: the store reached them over TLS.
    let mut plain = sentinel.target();
    if let sluice_store::RedisTarget::Sentinel(sluice_store::SentinelTarget {
        sentinel_tls, ..
    }) = &mut plain
    {
        *sentinel_tls = false;
    }
    let store = RedisStore::connect(plain, options()).unwrap();
    assert!(store.time().await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_conforms() {
    let cluster = RedisCluster::start();
    let target = cluster.target();
    let store = RedisStore::connect(target, options()).unwrap();
    conformance::run(&store, "cluster").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_over_tls_conforms_and_flushes_to_every_master() {
    let cluster = RedisCluster::start_tls();
    let store = RedisStore::connect(cluster.target(), trusting(cluster.tls_certificate())).unwrap();
    conformance::run(&store, "cluster-tls").await;
    // 300 keys with their own hash tags land on all three masters: one TLS round trip each,
    // to the TLS ports the nodes announce (the store was only given TLS ports).
    let items: Vec<FlushItem> = (0..300)
        .map(|i| FlushItem {
            key: format!("tls-spread:{{{i}}}").into(),
            window: 7,
            delta: 2,
            ttl: Duration::from_secs(60),
            entry: None,
            want_previous: false,
            first_write: true,
        })
        .collect();
    let reply = store.flush(&items, None).await.unwrap();
    assert_eq!(reply.round_trips, 3);
    for result in &reply.results {
        assert_eq!(result.as_ref().unwrap().total, 2);
    }
    // Without trusting the cluster's CA, the nodes are refused (verification is on).
    let store = RedisStore::connect(cluster.target(), options()).unwrap();
    assert!(store.time().await.is_err());
}
