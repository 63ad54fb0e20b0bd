//! The flush timer: one loop for `sluice serve`, tests and anyone embedding the engine.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use sluice_core::Nanos;

use crate::Engine;

impl Engine {
    /// Runs the flush loop ([`run_flush_loop`]) for this engine until `shutdown` resolves,
    /// then flushes everything once more.
    pub async fn run_flusher(
        self: Arc<Self>,
        shutdown: impl Future<Output = ()>,
    ) -> crate::FlushReport {
        run_flush_loop(|| self.clone(), || {}, shutdown).await
    }
}

/// How long an early sync waits for other keys to ask too: they share its round trip.
pub const EARLY_SYNC_DELAY: Duration = Duration::from_millis(2);

/// The longest tick: rules with longer spans are still looked at every second.
const MAX_TICK_NS: Nanos = 1_000_000_000;

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
///
/// Nothing else the loop does moves a tick: the next tick is the first one on the grid whose
/// flush has not run, so a tick passed while the loop was busy (an early sync in flight, a
/// slow announcement, a slow store) is flushed as soon as that work ends, ahead of any early
/// sync, not skipped for the one after it. An early sync that would leave at or after the next
/// tick waits for that tick's flush (which takes its counts when its span ended there) and
/// leaves right after it. Flushes never overlap, so a tick that passes during an early sync in
/// flight waits for that one round trip.
pub async fn run_flush_loop(
    current: impl Fn() -> Arc<Engine>,
    mut after_flush: impl FnMut(),
    shutdown: impl Future<Output = ()>,
) -> crate::FlushReport {
    let mut shutdown = std::pin::pin!(shutdown);
    // The last tick flushed. Taken before the first announcement, so that a tick an
    // announcement slow to answer lets pass is flushed when it returns.
    let mut flushed = {
        let engine = current();
        Grid::of(&engine).passed(engine.now())
    };
    current().announce().await;
    // When an early sync folded into the next tick's flush was to leave.
    let mut folded: Option<Nanos> = None;
    loop {
        let engine = current();
        let now = engine.now();
        let tick = Grid::of(&engine).due(now, flushed);
        if tick > now {
            tokio::select! {
                biased;
                _ = &mut shutdown => break,
                _ = tokio::time::sleep(Duration::from_nanos(tick - now)) => {}
                _ = engine.early_sync_asked(), if folded.is_none() => {
                    if engine.early_sync_wanted() {
                        let delay = early_delay(&engine);
                        let leaves = engine.now().saturating_add(delay.as_nanos() as u64);
                        if leaves >= tick {
                            folded = Some(leaves);
                        } else {
                            tokio::time::sleep(delay).await;
                            current().flush_early().await;
                        }
                    }
                    continue;
                }
            }
        } else {
            // A tick already due (flushes slower than the span, a store that does not answer):
            // shutdown still comes first, or a loop that is always behind would never stop.
            tokio::select! {
                biased;
                _ = &mut shutdown => break,
                () = std::future::ready(()) => {}
            }
        }
        // The engine now, not the one the tick was planned with: a reload in between has
        // new rules whose span ends here too.
        let engine = current();
        reach(&engine, tick).await;
        engine.flush_due().await;
        after_flush();
        flushed = tick;
        // An early sync folded into this tick leaves now, unless the tick's replies asked keys
        // to read again once the others' flushes of this boundary have landed: then the loop
        // waits for that (`early_delay`), or their read would come before those flushes.
        if let Some(leaves) = folded.take()
            && engine.now() >= leaves.max(engine.early_sync_not_before())
            && engine.early_sync_wanted()
        {
            engine.flush_early().await;
        }
    }
    current().flush().await
}

/// The loop's ticks: multiples of the shortest span among the synced rules, those a reload
/// removed and still swept included, and at most a second.
struct Grid {
    tick_ns: Nanos,
}

impl Grid {
    fn of(engine: &Engine) -> Self {
        let spans = engine.flush_interval().map(|d| d.as_nanos() as Nanos);
        let retired = engine.flusher().retired_min_span_ns();
        let tick_ns = spans
            .into_iter()
            .chain(retired)
            .min()
            .unwrap_or(MAX_TICK_NS);
        Self {
            tick_ns: tick_ns.clamp(1, MAX_TICK_NS),
        }
    }

    /// The last tick at or before `now`.
    fn passed(&self, now: Nanos) -> Nanos {
        now - now % self.tick_ns
    }

    /// The tick to flush next, `flushed` being the last one flushed: the last one passed when
    /// its flush has not run (it is due at once), otherwise the one after it. A clock that
    /// went back starts again from the tick after its new reading.
    fn due(&self, now: Nanos, flushed: Nanos) -> Nanos {
        let passed = self.passed(now);
        if passed > flushed {
            passed
        } else {
            passed.saturating_add(self.tick_ns)
        }
    }
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

#[cfg(test)]
mod tests {
    use super::Grid;

    #[test]
    fn a_tick_passed_unflushed_is_due_at_once_and_a_flushed_one_is_not() {
        let grid = Grid { tick_ns: 100 };
        assert_eq!(grid.due(250, 100), 200, "the tick at 200 was not flushed");
        assert_eq!(grid.due(250, 200), 300);
        assert_eq!(grid.due(200, 200), 300);
        // Several passed while the loop was busy: one flush takes them all.
        assert_eq!(grid.due(570, 200), 500);
        // The clock went back.
        assert_eq!(grid.due(150, 400), 200);
    }
}
