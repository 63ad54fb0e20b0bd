//! Stopping without losing a count: SIGTERM with the store unreachable (refusing, or taking
//! the flush and never answering) spills the counts to `state_dir`, and the next start
//! delivers them exactly once; a call that never finishes does not hold the exit past
//! `shutdown_timeout`.

mod common;

use std::io::Write as _;
use std::time::Duration;

use common::{Serve, http_call};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice_testkit::{RedisServer, wait_until};

/// One flush per 10 s span: the counts of a test's requests are still unflushed at SIGTERM.
const RULES: &str = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { window: 1h, requests_per_unit: 100000, spans: 360, mode: synced }\n";
const EXTRA: &str = "state_dir: state\nshutdown_timeout: 2s\n";
const ADMITTED: u64 = 50;

async fn admit(serve: &Serve, user: &str, n: u64) {
    let mut client = serve.client().await;
    for _ in 0..n {
        let request = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "user".into(),
                    value: user.into(),
                }],
                ..Default::default()
            }],
            hits_addend: 1,
        };
        let r = client
            .should_rate_limit(request)
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.overall_code, 1, "allowed");
    }
}

/// The store's count for `user`, over every window (its counter keys, not the per-instance
/// hashes or the receipts' markers).
fn stored(redis: &RedisServer, user: &str) -> u64 {
    let keys = redis.command(&format!("KEYS *{user}*"));
    keys.lines()
        .filter(|l| !l.starts_with('*') && !l.starts_with('$'))
        .filter(|k| !k.ends_with(":n") && !k.contains(":r:"))
        .map(|k| {
            let value = redis.command(&format!("GET {k}"));
            value
                .lines()
                .find(|l| !l.starts_with('$'))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum()
}

fn spill_file(serve: &Serve) -> std::path::PathBuf {
    serve.dir().join("state").join("spill.json")
}

/// Starts again on the same config and state directory, and waits until the spill is gone.
fn restart_and_replay(serve: &mut Serve) {
    serve.restart();
    let file = spill_file(serve);
    assert!(
        wait_until(Duration::from_secs(20), || !file.exists()),
        "the spill was not delivered: {}",
        serve.log_tail()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_the_store_down_spills_and_the_next_start_delivers_exactly_once() {
    let mut redis = RedisServer::start_persistent();
    let mut serve = Serve::start_with("spill-down", &redis.url(), &[("edge.yaml", RULES)], EXTRA);
    assert!(wait_until(Duration::from_secs(10), || {
        http_call(serve.admin, "GET", "/readyz", "").0 == 200
    }));
    admit(&serve, "alice", ADMITTED).await;
    redis.kill();
    let status = serve.terminate();
    assert!(status.success(), "{status:?}: {}", serve.log_tail());
    assert!(spill_file(&serve).exists(), "{}", serve.log_tail());

    redis.restart();
    assert_eq!(
        stored(&redis, "alice"),
        0,
        "nothing reached the store before"
    );
    restart_and_replay(&mut serve);
    assert_eq!(stored(&redis, "alice"), ADMITTED, "{}", serve.log_tail());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_the_store_took_but_never_answered_is_not_counted_twice_after_a_restart() {
    let redis = RedisServer::start();
    let mut serve = Serve::start_with("spill-doubt", &redis.url(), &[("edge.yaml", RULES)], EXTRA);
    assert!(wait_until(Duration::from_secs(10), || {
        http_call(serve.admin, "GET", "/readyz", "").0 == 200
    }));
    admit(&serve, "bob", ADMITTED).await;
    // Redis takes the shutdown's flush and answers nothing until after the process is gone.
    redis.pause();
    let status = serve.terminate();
    redis.resume();
    assert!(status.success(), "{status:?}: {}", serve.log_tail());
    assert!(spill_file(&serve).exists(), "{}", serve.log_tail());
    assert!(
        wait_until(Duration::from_secs(5), || stored(&redis, "bob") == ADMITTED),
        "the paused Redis ran the flush it was sent"
    );
    restart_and_replay(&mut serve);
    assert_eq!(stored(&redis, "bob"), ADMITTED, "{}", serve.log_tail());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_never_finishes_does_not_hold_the_exit_past_shutdown_timeout() {
    let mut serve = Serve::start_with(
        "stuck-call",
        "memory://",
        &[("edge.yaml", RULES)],
        "shutdown_timeout: 1s\nlisteners:\n  request_timeout: 1h\n",
    );
    // Headers sent, half of the body: the call waits for the rest.
    let mut stuck = std::net::TcpStream::connect(("127.0.0.1", serve.http)).unwrap();
    stuck
        .write_all(b"POST /json HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"domain\":")
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let status = serve.terminate();
    assert!(status.success(), "{status:?}: {}", serve.log_tail());
    drop(stuck);
}
