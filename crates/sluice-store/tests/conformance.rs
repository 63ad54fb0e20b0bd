//! The conformance suite of `sluice-testkit` against every store: memory, Redis standalone,
//! Sentinel and Cluster (real servers started here).

use std::sync::Arc;
use std::time::Duration;

use sluice_core::ManualClock;
use sluice_store::{MemoryStore, RedisStore, RedisStoreOptions, RedisTarget};
use sluice_testkit::{RedisCluster, RedisSentinel, RedisServer, conformance};

fn options() -> RedisStoreOptions {
    RedisStoreOptions {
        timeout: Duration::from_secs(2),
        ..RedisStoreOptions::default()
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
async fn redis_sentinel_conforms() {
    let sentinel = RedisSentinel::start();
    let target = RedisTarget::Sentinel {
        sentinels: sentinel
            .sentinel_ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect(),
        master: RedisSentinel::MASTER.into(),
        auth: None,
        db: 0,
        tls: false,
    };
    let store = RedisStore::connect(target, options()).unwrap();
    conformance::run(&store, "sentinel").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_conforms() {
    let cluster = RedisCluster::start();
    let target = RedisTarget::Cluster {
        nodes: cluster
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect(),
        auth: None,
        tls: false,
    };
    let store = RedisStore::connect(target, options()).unwrap();
    conformance::run(&store, "cluster").await;
}
