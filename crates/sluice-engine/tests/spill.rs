//! Counts that cannot reach the store at shutdown are spilled to the state directory and
//! delivered exactly once by the next start, whatever happened to the flushes in between;
//! counts of rules a reload removed still reach the store.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::{SECOND, T0, now_or_never, rules, synced_rule};
use sluice_core::{Clock, ManualClock};
use sluice_engine::{Engine, EngineOptions, StateDir, StateError};
use sluice_store::{CounterKey, MemoryStore};

const USERS: usize = 5;

struct Run {
    engine: Engine,
    clock: ManualClock,
}

fn start(store: &Arc<MemoryStore>, node: &str, clock: ManualClock, chunk: usize) -> Run {
    let options = EngineOptions {
        node_id: Some(node.to_owned()),
        follow_store_clock: false,
        flush_chunk_items: chunk,
        ..EngineOptions::default()
    };
    let rules = synced_rule(1000, "60s", 6, "predictive", "fixed_window");
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let engine = Engine::new(&rules, &Default::default(), store.clone(), shared, options);
    Run { engine, clock }
}

/// `per_user` admitted requests for each user.
fn admit(run: &Run, per_user: u64) {
    for k in 0..USERS {
        let user = format!("u{k}");
        for _ in 0..per_user {
            let verdict = now_or_never(run.engine.check("d", &[[("user", user.as_str())]], 1));
            assert!(verdict.unwrap().unwrap().allowed);
        }
    }
}

fn total(store: &MemoryStore) -> u64 {
    let window = (T0 + SECOND) / (60 * SECOND);
    (0..USERS)
        .map(|k| {
            store.total(
                CounterKey::new("d/user", &[&format!("u{k}")]).as_str(),
                window,
            )
        })
        .sum()
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        use std::hash::BuildHasher as _;
        let unique = std::collections::hash_map::RandomState::new().hash_one(name);
        let dir = std::env::temp_dir().join(format!("sluice-spill-{name}-{unique:x}"));
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn setup(name: &str) -> (Arc<MemoryStore>, ManualClock, TempDir) {
    let clock = ManualClock::new(T0 + SECOND);
    let store = Arc::new(MemoryStore::new(Arc::new(clock.clone())));
    (store, clock, TempDir::new(name))
}

/// Stops `run` as `sluice serve` does: a final flush, then the spill saved.
async fn stop(run: Run, dir: &TempDir) -> u64 {
    run.engine.flush().await;
    let spill = run.engine.spill().await;
    let state = StateDir::open(&dir.0).unwrap();
    state.save(&spill).unwrap();
    spill.counts()
}

/// Starts again on the same state directory and replays what is there.
fn restart(store: &Arc<MemoryStore>, clock: &ManualClock, node: &str, dir: &TempDir) -> Run {
    let run = start(store, node, clock.clone(), 2);
    let state = Arc::new(StateDir::open(&dir.0).unwrap());
    if let Some(spill) = state.read_spill().unwrap() {
        run.engine.replay(spill, state);
    }
    run
}

#[tokio::test]
async fn counts_the_store_could_not_take_at_shutdown_are_delivered_by_the_next_start() {
    let (store, clock, dir) = setup("down");
    let run = start(&store, "a", clock.clone(), 2);
    admit(&run, 4);
    store.set_available(false);
    assert_eq!(stop(run, &dir).await, 4 * USERS as u64);
    assert!(dir.0.join("spill.json").exists());

    let run = restart(&store, &clock, "b", &dir);
    assert_eq!(run.engine.replay_pending(), 4 * USERS as u64);
    // Still down: nothing is lost, the file stays.
    run.engine.flush().await;
    assert_eq!(run.engine.replay_pending(), 4 * USERS as u64);
    store.set_available(true);
    run.clock.advance(Duration::from_secs(1));
    run.engine.flush().await;
    assert_eq!(total(&store), 4 * USERS as u64);
    assert_eq!(run.engine.replay_pending(), 0);
    assert!(
        !dir.0.join("spill.json").exists(),
        "delivered: the file is gone"
    );
    // Nothing is sent twice by later flushes.
    run.engine.flush().await;
    assert_eq!(total(&store), 4 * USERS as u64);
}

#[tokio::test]
async fn a_flush_in_doubt_at_shutdown_is_settled_by_its_receipt_not_sent_again() {
    let (store, clock, dir) = setup("doubt");
    let run = start(&store, "a", clock.clone(), 100);
    admit(&run, 3);
    // The final flush is applied, but its reply is lost: in doubt.
    store.set_replies_lost(true);
    let spilled = stop(run, &dir).await;
    assert_eq!(
        spilled,
        3 * USERS as u64,
        "the doubted counts go in the spill"
    );
    assert_eq!(total(&store), 3 * USERS as u64, "they did arrive");
    store.set_replies_lost(false);

    let run = restart(&store, &clock, "b", &dir);
    run.engine.flush().await;
    assert_eq!(run.engine.replay_pending(), 0);
    assert_eq!(
        total(&store),
        3 * USERS as u64,
        "settled as landed, not sent again"
    );
}

#[tokio::test]
async fn an_instance_killed_in_the_middle_of_a_replay_leaves_a_file_that_neither_loses_nor_doubles()
{
    let (store, clock, dir) = setup("killed");
    let run = start(&store, "a", clock.clone(), 2);
    admit(&run, 2);
    store.set_available(false);
    stop(run, &dir).await;
    store.set_available(true);

    // The replay's first chunk is applied but its answer lost; then the instance dies
    // without a shutdown (no spill of its own: SIGKILL).
    let run = restart(&store, &clock, "b", &dir);
    store.fail_after(u64::MAX);
    store.set_replies_lost(true);
    run.engine.flush().await;
    drop(run);
    store.set_replies_lost(false);
    let applied = total(&store);
    assert!(applied > 0, "the first chunk was applied");

    let run = restart(&store, &clock, "c", &dir);
    run.engine.flush().await;
    assert_eq!(run.engine.replay_pending(), 0);
    assert_eq!(total(&store), 2 * USERS as u64, "exactly once");
}

#[tokio::test]
async fn spilled_counts_whose_window_keys_expired_are_not_sent() {
    let (store, clock, dir) = setup("expired");
    let run = start(&store, "a", clock.clone(), 2);
    admit(&run, 1);
    store.set_available(false);
    stop(run, &dir).await;
    store.set_available(true);
    // Two windows (the keys' lifetime) and more go by before the next start.
    clock.advance(Duration::from_secs(121));
    let run = restart(&store, &clock, "b", &dir);
    run.engine.flush().await;
    assert_eq!(run.engine.replay_pending(), 0);
    assert_eq!(total(&store), 0);
    assert!(!dir.0.join("spill.json").exists());
}

#[test]
fn a_state_directory_serves_one_instance_at_a_time_and_a_bad_file_is_named() {
    let dir = TempDir::new("lock");
    let first = StateDir::open(&dir.0).unwrap();
    let second = StateDir::open(&dir.0).unwrap_err();
    assert!(matches!(second, StateError::InUse(_)), "{second}");
    assert!(
        second
            .to_string()
            .contains("in use by another running sluice serve")
    );
    drop(first);
    let state = StateDir::open(&dir.0).unwrap();
    assert!(state.read_spill().unwrap().is_none());
    std::fs::write(state.spill_path(), b"{not json").unwrap();
    let bad = state.read_spill().unwrap_err().to_string();
    assert!(bad.contains("spill.json is not a spill file"), "{bad}");
    assert!(bad.contains("move it away"), "{bad}");
}

#[tokio::test]
async fn counts_of_a_rule_a_reload_removed_still_reach_the_store_from_requests_in_flight() {
    let clock = ManualClock::new(T0 + SECOND);
    let store = Arc::new(MemoryStore::new(Arc::new(clock.clone())));
    let both = rules(
        "domain: d\ndescriptors:\n  - key: user\n    rate_limit: { window: 60s, requests_per_unit: 100, mode: synced }\n  - key: team\n    rate_limit: { window: 60s, requests_per_unit: 100, mode: synced }\n",
    );
    let only_user = rules(
        "domain: d\ndescriptors:\n  - key: user\n    rate_limit: { window: 60s, requests_per_unit: 100, mode: synced }\n",
    );
    let old = Arc::new(Engine::new(
        &both,
        &Default::default(),
        store.clone(),
        Arc::new(clock.clone()),
        EngineOptions {
            follow_store_clock: false,
            ..EngineOptions::default()
        },
    ));
    let new = old.reload(&only_user, &Default::default());
    // A request that took the old engine before the swap counts after it.
    for _ in 0..3 {
        let v = now_or_never(old.check("d", &[[("team", "red")]], 1));
        assert!(v.unwrap().unwrap().allowed);
    }
    let window = (T0 + SECOND) / (60 * SECOND);
    let team = CounterKey::new("d/team", &["red"]);
    new.flush().await;
    assert_eq!(store.total(team.as_str(), window), 3);
    // The request is done; one more count arrived before it finished.
    let v = now_or_never(old.check("d", &[[("team", "red")]], 1));
    assert!(v.unwrap().unwrap().allowed);
    drop(old);
    new.flush().await;
    assert_eq!(store.total(team.as_str(), window), 4);
}
