//! Early syncs never hold back a span boundary's flush: whatever one key's early sync does
//! around a boundary (asked just before it, in flight across it, slow, one after another),
//! the other keys' counts of the span reach the store at the boundary, not a tick later.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::paused::{Looping, PausedClock, engine, stored};
use common::{SECOND, T0, rules};
use sluice_engine::Engine;
use sluice_store::MemoryStore;

/// One minute, six spans of 10 s: the loop ticks every second, spans end every tenth tick.
const WINDOW_NS: u64 = 60 * SECOND;
const SPAN: Duration = Duration::from_secs(10);
const RULES: &str = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 600, mode: synced, spans: 6 }\n";

/// Counts `n` requests for `user`, all admitted.
async fn count(engine: &Engine, user: &str, n: usize) {
    for _ in 0..n {
        let verdict = engine.check("d", &[[("user", user)]], 1).await.unwrap();
        assert!(verdict.allowed, "{user}");
    }
}

/// Spends `user`'s cold share (50 a span: 600 / 6 spans / 2 instances expected) until it asks for an
/// early sync; returns the requests counted.
async fn spend_cold_share(engine: &Engine, user: &str) -> u64 {
    let mut admitted = 0;
    for _ in 0..200 {
        let verdict = engine.check("d", &[[("user", user)]], 1).await.unwrap();
        admitted += u64::from(verdict.allowed);
        if engine.early_sync_wanted() {
            return admitted;
        }
    }
    panic!("{user} spent its cold share and asked for no early sync");
}

struct Run {
    clock: Arc<PausedClock>,
    store: Arc<MemoryStore>,
    engine: Arc<Engine>,
    looping: Looping,
}

impl Run {
    /// The flush loop over one engine on a memory store that takes `latency` per call.
    fn start(latency: Duration) -> Self {
        let clock = PausedClock::new();
        let store = Arc::new(MemoryStore::new(clock.clone()));
        store.set_latency(latency);
        let engine = engine(&rules(RULES), store.clone(), clock.clone());
        let looping = Looping::start(engine.clone());
        Self {
            clock,
            store,
            engine,
            looping,
        }
    }

    async fn sleep_until(&self, offset: Duration) {
        tokio::time::sleep_until(self.clock.at(offset)).await;
    }

    /// Counts alice's 5 in the middle of the first span.
    async fn count_the_span(&self) {
        self.sleep_until(SPAN / 2).await;
        count(&self.engine, "alice", 5).await;
    }

    /// Alice's count in the store, which must hold her 5 of the first span by `at` (after the
    /// span's boundary).
    async fn assert_the_span_landed_by(&self, at: Duration) {
        self.sleep_until(at).await;
        assert_eq!(
            stored(&self.store, "alice", T0, WINDOW_NS),
            5,
            "the first span's counts were not in the store {:?} after its boundary",
            at - SPAN
        );
    }
}

#[tokio::test(start_paused = true)]
async fn an_early_sync_asked_just_before_a_boundary_does_not_delay_its_span_flush() {
    // 5 ms a round trip.
    let run = Run::start(Duration::from_millis(5));
    run.count_the_span().await;
    // Bob's cold share runs out 1 ms before the boundary: his early sync would leave 1 ms
    // after it. It goes with the boundary's flush instead, which lands one round trip after
    // the boundary (not two: the early sync's, then its own).
    run.sleep_until(SPAN - Duration::from_millis(1)).await;
    let bob = spend_cold_share(&run.engine, "bob").await;
    run.assert_the_span_landed_by(SPAN + Duration::from_millis(7))
        .await;
    assert_eq!(stored(&run.store, "bob", T0, WINDOW_NS), bob);
    run.looping.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_early_sync_in_flight_across_a_boundary_is_followed_by_the_span_flush() {
    // 5 ms a round trip: asked 4 ms before the boundary, the early sync leaves 2 ms before
    // it and is answered 3 ms after it.
    let run = Run::start(Duration::from_millis(5));
    run.count_the_span().await;
    run.sleep_until(SPAN - Duration::from_millis(4)).await;
    spend_cold_share(&run.engine, "bob").await;
    run.assert_the_span_landed_by(SPAN + Duration::from_millis(20))
        .await;
    run.looping.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_slow_early_sync_holds_the_span_flush_only_until_it_is_answered() {
    // A slow store, 300 ms a round trip: the early sync leaves 98 ms before the boundary and
    // is answered 202 ms after it; the span flush goes then, not at the next tick.
    let run = Run::start(Duration::from_millis(300));
    run.count_the_span().await;
    run.sleep_until(SPAN - Duration::from_millis(100)).await;
    spend_cold_share(&run.engine, "bob").await;
    run.assert_the_span_landed_by(SPAN + Duration::from_millis(600))
        .await;
    run.looping.stop().await;
}

#[tokio::test(start_paused = true)]
async fn early_syncs_one_after_another_across_a_boundary_do_not_skip_its_span_flush() {
    // 2 ms a round trip. Bob's early sync leaves 6 ms before the boundary; Carol asks while
    // it is in flight, and hers leaves 2 ms before the boundary and is answered at it; Dave
    // asks while hers is in flight.
    let run = Run::start(Duration::from_millis(2));
    run.count_the_span().await;
    run.sleep_until(SPAN - Duration::from_millis(8)).await;
    spend_cold_share(&run.engine, "bob").await;
    run.sleep_until(SPAN - Duration::from_millis(5)).await;
    spend_cold_share(&run.engine, "carol").await;
    run.sleep_until(SPAN - Duration::from_millis(1)).await;
    spend_cold_share(&run.engine, "dave").await;
    run.assert_the_span_landed_by(SPAN + Duration::from_millis(20))
        .await;
    run.looping.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_early_sync_folded_into_a_span_flush_still_goes_out() {
    // Bob asks 1 ms before a tick that ends no span (the rule's spans end every tenth tick):
    // the tick's flush takes none of his counts, and his early sync follows it.
    let run = Run::start(Duration::ZERO);
    run.sleep_until(Duration::from_secs(3) - Duration::from_millis(1))
        .await;
    let bob = spend_cold_share(&run.engine, "bob").await;
    run.sleep_until(Duration::from_secs(3) + Duration::from_millis(10))
        .await;
    assert_eq!(stored(&run.store, "bob", T0, WINDOW_NS), bob);
    assert!(!run.engine.early_sync_wanted());
    run.looping.stop().await;
}
