//! The flush loop sends a span's counts at the span's boundary even when the engine's clock
//! reads a little behind the timer that woke it (`sluice serve`'s coarse clock, refreshed by a
//! thread a busy machine can hold back).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{SECOND, T0, rules};
use sluice_core::{Clock, Nanos};
use sluice_engine::{Engine, EngineOptions};
use sluice_store::MemoryStore;

/// Tokio's (paused) time from `T0`, except that the first reading at or after each `every`
/// boundary is stale: a millisecond before the boundary, as a coarse clock whose refresh came
/// late reads.
struct StaleAtBoundaries {
    start: tokio::time::Instant,
    every: u64,
    next_stale: AtomicU64,
}

impl Clock for StaleAtBoundaries {
    fn now(&self) -> Nanos {
        let now = T0 + self.start.elapsed().as_nanos() as u64;
        let boundary = now - (now - T0) % self.every;
        if boundary >= self.next_stale.load(Ordering::Relaxed) {
            self.next_stale
                .store(boundary + self.every, Ordering::Relaxed);
            return boundary - 1_000_000;
        }
        now
    }
}

#[tokio::test(start_paused = true)]
async fn a_span_is_flushed_at_its_boundary_when_the_clock_reads_behind_the_timer() {
    let span = 10 * SECOND;
    let clock = Arc::new(StaleAtBoundaries {
        start: tokio::time::Instant::now(),
        every: span,
        next_stale: AtomicU64::new(T0 + span),
    });
    let store = Arc::new(MemoryStore::new(clock.clone()));
    let rules = rules(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 1000, mode: synced, spans: 6 }\n",
    );
    let engine = Arc::new(Engine::new(
        &rules,
        &Default::default(),
        store,
        clock.clone() as Arc<dyn Clock>,
        EngineOptions {
            follow_store_clock: false,
            ..EngineOptions::default()
        },
    ));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let looping = engine.clone();
    let flusher = tokio::spawn(async move {
        looping
            .run_flusher(async {
                stopped.await.ok();
            })
            .await
    });
    let start = tokio::time::Instant::now();
    for s in 0..4u64 {
        // Counts in the middle of span `s`...
        tokio::time::sleep_until(start + Duration::from_nanos(s * span + span / 2)).await;
        for _ in 0..10 {
            assert!(engine.check("d", &[[("k", "v")]], 1).await.unwrap().allowed);
        }
        let info = &engine.key_info("d", &[("k", "v")])[0];
        assert_eq!(info.unflushed, 10, "span {s}: counted, not sent yet");
        // ...are sent at its end, not at the next tick a second later.
        tokio::time::sleep_until(start + Duration::from_nanos((s + 1) * span + 5_000_000)).await;
        let info = &engine.key_info("d", &[("k", "v")])[0];
        assert_eq!(
            info.unflushed, 0,
            "span {s}: its counts were sent at its boundary"
        );
    }
    stop.send(()).ok();
    flusher.await.unwrap();
}
