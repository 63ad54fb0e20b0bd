//! The flush loop on tokio's paused time: a clock that reads it, a memory store whose
//! announcements can be slow, and a running loop over an engine a test can swap (a reload).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_config::RuleSet;
use sluice_core::{Clock, Decision, Nanos};
use sluice_engine::{Engine, EngineOptions, FlushReport};
use sluice_store::{
    CounterKey, CounterStore, ExactRequest, FlushItem, FlushReceipt, FlushReply, FlushTime,
    MemoryStore, Presence, StoreFuture,
};

use super::T0;

/// Tokio's (paused) time, counted from `T0` when the clock was made.
pub struct PausedClock {
    start: tokio::time::Instant,
}

impl PausedClock {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            start: tokio::time::Instant::now(),
        })
    }

    /// The tokio instant at which this clock reads `T0 + offset`.
    pub fn at(&self, offset: Duration) -> tokio::time::Instant {
        self.start + offset
    }
}

impl Clock for PausedClock {
    fn now(&self) -> Nanos {
        T0 + self.start.elapsed().as_nanos() as u64
    }
}

/// A memory store whose announcements take [`SlowAnnounce::set_delay`] (tokio time) before
/// they are answered; every other call is the memory store's.
pub struct SlowAnnounce {
    pub inner: MemoryStore,
    delay_ns: AtomicU64,
}

impl SlowAnnounce {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            inner: MemoryStore::new(clock),
            delay_ns: AtomicU64::new(0),
        }
    }

    /// Announcements that start from now on take `delay`.
    pub fn set_delay(&self, delay: Duration) {
        self.delay_ns
            .store(delay.as_nanos() as u64, Ordering::Relaxed);
    }
}

impl CounterStore for SlowAnnounce {
    fn flush_timed<'a>(
        &'a self,
        items: &'a [FlushItem],
        receipt: Option<&'a FlushReceipt>,
        time: FlushTime,
    ) -> StoreFuture<'a, FlushReply> {
        self.inner.flush_timed(items, receipt, time)
    }

    fn landed<'a>(
        &'a self,
        items: &'a [FlushItem],
        receipt: &'a FlushReceipt,
    ) -> StoreFuture<'a, Vec<Option<bool>>> {
        self.inner.landed(items, receipt)
    }

    fn exact<'a>(&'a self, request: &'a ExactRequest) -> StoreFuture<'a, Decision> {
        self.inner.exact(request)
    }

    fn time(&self) -> StoreFuture<'_, Nanos> {
        self.inner.time()
    }

    fn announce<'a>(&'a self, node: &'a str, live_for: Duration) -> StoreFuture<'a, Presence> {
        let delay = Duration::from_nanos(self.delay_ns.load(Ordering::Relaxed));
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            self.inner.announce(node, live_for).await
        })
    }

    fn describe(&self) -> String {
        "memory, slow announcements".into()
    }
}

/// An engine for `rules` on `store` whose only clock is `clock` (the store's is not followed),
/// expecting two instances: a new key keeps to its cold share, half the limit's share of a span.
pub fn engine(
    rules: &RuleSet,
    store: Arc<dyn CounterStore>,
    clock: Arc<PausedClock>,
) -> Arc<Engine> {
    Arc::new(Engine::new(
        rules,
        &Default::default(),
        store,
        clock as Arc<dyn Clock>,
        EngineOptions {
            follow_store_clock: false,
            expected_instances: 2,
            ..EngineOptions::default()
        },
    ))
}

/// `sluice_engine::run_flush_loop` running over the engine in `current` (a test swaps it to
/// reload), until [`Looping::stop`].
pub struct Looping {
    pub current: Arc<Mutex<Arc<Engine>>>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<FlushReport>,
}

impl Looping {
    pub fn start(engine: Arc<Engine>) -> Self {
        let current = Arc::new(Mutex::new(engine));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let shown = current.clone();
        let task = tokio::spawn(sluice_engine::run_flush_loop(
            move || shown.lock().unwrap().clone(),
            || {},
            async {
                stopped.await.ok();
            },
        ));
        Self {
            current,
            stop,
            task,
        }
    }

    /// Swaps the engine the loop flushes for `engine` (a reload).
    pub fn swap(&self, engine: Arc<Engine>) {
        *self.current.lock().unwrap() = engine;
    }

    pub async fn stop(self) {
        self.stop.send(()).ok();
        self.task.await.unwrap();
    }
}

/// The store's count of `user` for rule `d/user` in the window of `at` (window `window_ns`).
pub fn stored(store: &MemoryStore, user: &str, at: Nanos, window_ns: u64) -> u64 {
    let key = CounterKey::new("d/user", &[user]);
    store.total(key.as_str(), at / window_ns)
}
