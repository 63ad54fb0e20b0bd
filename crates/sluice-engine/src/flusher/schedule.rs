//! The flush timer: one loop for `sluice serve`, tests and anyone embedding the engine.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::Engine;

/// How long an early sync waits for other keys to ask too: they share its round trip.
pub const EARLY_SYNC_DELAY: Duration = Duration::from_millis(2);

/// Flushes the engine `current()` returns (it may change: a reload swaps engines) at every
/// span boundary of its rules, at least once a second, calling `after_flush` after each tick,
/// until `shutdown` resolves; then flushes everything once more and returns that flush's report.
/// In between, keys that ask for an early sync are flushed [`EARLY_SYNC_DELAY`] after the
/// first of them asks (the others asking meanwhile go in the same round trip).
///
/// Ticks fall on multiples of the tick on the store-corrected clock, so instances flush at
/// the same span boundaries. A tick flushes only once the engine's clock has reached it: that
/// clock may read a little behind the timer's (`sluice serve`'s coarse clock is refreshed by a
/// thread that a busy machine can hold back; a new store-clock reading can move it back by a
/// millisecond), and a flush taken just before the boundary finds the span not over yet and
/// sends nothing, which left the span's counts unsent until the next tick, a second later.
pub async fn run_flush_loop(
    current: impl Fn() -> Arc<Engine>,
    mut after_flush: impl FnMut(),
    shutdown: impl Future<Output = ()>,
) -> crate::FlushReport {
    let mut shutdown = std::pin::pin!(shutdown);
    current().announce().await;
    loop {
        let engine = current();
        let tick = engine
            .flush_interval()
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(1));
        let tick_ns = tick.as_nanos().max(1) as u64;
        let now = engine.now();
        let boundary = now - now % tick_ns + tick_ns;
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tokio::time::sleep(Duration::from_nanos(boundary - now)) => {
                reach(&engine, boundary).await;
                engine.flush_due().await;
                after_flush();
            }
            _ = engine.early_sync_asked() => {
                tokio::time::sleep(early_delay(&engine)).await;
                engine.flush_early().await;
            }
        }
    }
    current().flush().await
}

/// How long an early sync waits: [`EARLY_SYNC_DELAY`], or until the others' span flushes
/// have landed when a key read ahead of them ([`Engine::early_sync_not_before`]).
fn early_delay(engine: &Engine) -> Duration {
    let wait = engine.early_sync_not_before().saturating_sub(engine.now());
    EARLY_SYNC_DELAY.max(Duration::from_nanos(wait))
}

/// How many times a tick waits (a millisecond or more each) for the engine's clock to reach
/// its boundary. A clock that stays behind longer went back (a clock jump): the tick flushes
/// anyway and the next one follows the clock.
const REACH_TRIES: u32 = 50;

/// Waits until `engine`'s clock reads `boundary` or later (at most [`REACH_TRIES`] waits).
async fn reach(engine: &Engine, boundary: u64) {
    for _ in 0..REACH_TRIES {
        let now = engine.now();
        if now >= boundary {
            return;
        }
        let behind = Duration::from_nanos(boundary - now).max(Duration::from_millis(1));
        tokio::time::sleep(behind).await;
    }
}
