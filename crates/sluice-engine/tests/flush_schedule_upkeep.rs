//! The flush loop's other work never moves a span boundary's flush: a slow announcement
//! (at the start, or the fleet's size probed after a flush), a reload between two ticks, and
//! the rules a reload removed, whose spans may be shorter than the new rules' ticks.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::paused::{Looping, PausedClock, SlowAnnounce, engine, stored};
use common::{SECOND, T0, rules};
use sluice_engine::Engine;

/// Six seconds, six spans: a span (and a tick) is a second.
const SECOND_SPANS: &str = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: { window: 6s, requests_per_unit: 600, mode: synced, spans: 6 }\n";

async fn count(engine: &Engine, user: &str, n: usize) {
    for _ in 0..n {
        let verdict = engine.check("d", &[[("user", user)]], 1).await.unwrap();
        assert!(verdict.allowed, "{user}");
    }
}

fn slow_store(clock: &Arc<PausedClock>) -> Arc<SlowAnnounce> {
    Arc::new(SlowAnnounce::new(clock.clone()))
}

#[tokio::test(start_paused = true)]
async fn a_slow_first_announcement_does_not_skip_the_first_boundary() {
    let clock = PausedClock::new();
    let store = slow_store(&clock);
    // The loop's first announcement is answered after 1.5 s, past the first boundary (1 s).
    store.set_delay(Duration::from_millis(1500));
    let engine = engine(&rules(SECOND_SPANS), store.clone(), clock.clone());
    let looping = Looping::start(engine.clone());
    tokio::time::sleep_until(clock.at(Duration::from_millis(500))).await;
    count(&engine, "alice", 5).await;
    tokio::time::sleep_until(clock.at(Duration::from_millis(1600))).await;
    assert_eq!(
        stored(&store.inner, "alice", T0, 6 * SECOND),
        5,
        "the first span's counts waited for the next tick"
    );
    looping.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_slow_announcement_after_a_flush_does_not_skip_the_next_boundary() {
    let clock = PausedClock::new();
    let store = slow_store(&clock);
    // Half-second spans and ticks (3 s, 6 spans).
    let half_second_spans = SECOND_SPANS.replace("window: 6s", "window: 3s");
    let engine = engine(&rules(&half_second_spans), store.clone(), clock.clone());
    let looping = Looping::start(engine.clone());
    // The fleet's size is probed again a second after the first announcement: after the
    // flush at 1 s, and it takes 700 ms, past the boundary at 1.5 s.
    tokio::time::sleep_until(clock.at(Duration::from_millis(100))).await;
    store.set_delay(Duration::from_millis(700));
    tokio::time::sleep_until(clock.at(Duration::from_millis(1200))).await;
    count(&engine, "alice", 5).await;
    tokio::time::sleep_until(clock.at(Duration::from_millis(1800))).await;
    assert_eq!(
        stored(&store.inner, "alice", T0 + SECOND, 3 * SECOND),
        5,
        "the span ending at 1.5 s waited for the next tick"
    );
    looping.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_reload_between_two_ticks_flushes_the_new_rules_at_the_boundary() {
    let clock = PausedClock::new();
    let store = slow_store(&clock);
    let old = engine(&rules(SECOND_SPANS), store.clone(), clock.clone());
    let looping = Looping::start(old.clone());
    tokio::time::sleep_until(clock.at(Duration::from_millis(300))).await;
    count(&old, "alice", 5).await;
    // A reload changes the rule (a new limit: new counters) between the ticks at 0 and 1 s;
    // the new rule counts alice's next requests.
    tokio::time::sleep_until(clock.at(Duration::from_millis(500))).await;
    let changed = SECOND_SPANS.replace("requests_per_unit: 600", "requests_per_unit: 900");
    let new = Arc::new(old.reload(&rules(&changed), &Default::default()));
    looping.swap(new.clone());
    tokio::time::sleep_until(clock.at(Duration::from_millis(700))).await;
    count(&new, "alice", 3).await;
    tokio::time::sleep_until(clock.at(Duration::from_millis(1010))).await;
    assert_eq!(
        stored(&store.inner, "alice", T0, 6 * SECOND),
        8,
        "the span's counts under the new rule waited for the next tick"
    );
    looping.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_removed_rule_is_flushed_at_its_own_boundaries() {
    let clock = PausedClock::new();
    let store = slow_store(&clock);
    // 100 ms spans (600 ms, 6 spans), reloaded to 1 s spans: the new rules tick every second.
    let short = SECOND_SPANS.replace("window: 6s", "window: 600ms");
    let old = engine(&rules(&short), store.clone(), clock.clone());
    let looping = Looping::start(old.clone());
    tokio::time::sleep_until(clock.at(Duration::from_millis(250))).await;
    let changed = SECOND_SPANS.replace("key: user", "key: team");
    let new = Arc::new(old.reload(&rules(&changed), &Default::default()));
    looping.swap(new);
    // A request that took the old engine before the swap counts into the removed rule.
    tokio::time::sleep_until(clock.at(Duration::from_millis(350))).await;
    count(&old, "alice", 1).await;
    tokio::time::sleep_until(clock.at(Duration::from_millis(410))).await;
    let at = T0 + 350_000_000;
    assert_eq!(
        stored(&store.inner, "alice", at, 600_000_000),
        1,
        "the removed rule's span (ending at 400 ms) waited for the new rules' tick"
    );
    looping.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_loop_always_behind_its_ticks_still_stops_when_asked() {
    let clock = PausedClock::new();
    let store = slow_store(&clock);
    let engine = engine(&rules(SECOND_SPANS), store.clone(), clock.clone());
    let looping = Looping::start(engine.clone());
    // Every fleet probe takes 1.5 s, longer than a tick: each flush ends past the next
    // boundary, so a tick is always due when the loop looks.
    store.set_delay(Duration::from_millis(1500));
    tokio::time::sleep_until(clock.at(Duration::from_secs(6))).await;
    count(&engine, "alice", 3).await;
    let stopped = tokio::time::timeout(Duration::from_secs(10), looping.stop()).await;
    assert!(
        stopped.is_ok(),
        "the flush loop never looked at its shutdown"
    );
}
