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
/// the same span boundaries.
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
        let wait = Duration::from_nanos(tick_ns - engine.now() % tick_ns);
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tokio::time::sleep(wait) => {
                engine.flush_due().await;
                after_flush();
            }
            _ = engine.early_sync_asked() => {
                tokio::time::sleep(EARLY_SYNC_DELAY).await;
                engine.flush_early().await;
            }
        }
    }
    current().flush().await
}
