//! A flush larger than a chunk goes in several pipelines; a store that dies between them keeps
//! what landed, and only the rest is sent again.

mod common;

use std::sync::Arc;

use common::watched::Watched;
use common::{SECOND, T0, now_or_never, synced_rule};
use sluice_core::{Clock, ManualClock};
use sluice_engine::{Engine, EngineOptions};
use sluice_store::{CounterKey, CounterStore, MemoryStore};

const KEYS: usize = 10;

fn setup(chunk: usize) -> (Engine, Arc<MemoryStore>) {
    let shared: Arc<dyn Clock> = Arc::new(ManualClock::new(T0 + SECOND));
    let store = Arc::new(MemoryStore::new(shared.clone()));
    (engine_with(store.clone(), shared, chunk), store)
}

/// An engine on `store` that flushes in chunks of `chunk` items, each of its `KEYS` keys
/// counted once.
fn engine_with(store: Arc<dyn CounterStore>, shared: Arc<dyn Clock>, chunk: usize) -> Engine {
    let options = EngineOptions {
        follow_store_clock: false,
        flush_chunk_items: chunk,
        ..EngineOptions::default()
    };
    let rules = synced_rule(1000, "60s", 6, "predictive", "fixed_window");
    let engine = Engine::new(&rules, &Default::default(), store, shared, options);
    for k in 0..KEYS {
        let user = format!("u{k}");
        let verdict = now_or_never(engine.check("d", &[[("user", user.as_str())]], 1));
        assert!(verdict.unwrap().unwrap().allowed);
    }
    engine
}

fn totals(store: &MemoryStore) -> Vec<u64> {
    let window = (T0 + SECOND) / (60 * SECOND);
    (0..KEYS)
        .map(|k| {
            let key = CounterKey::new("d/user", &[&format!("u{k}")]);
            store.total(key.as_str(), window)
        })
        .collect()
}

#[tokio::test]
async fn a_flush_larger_than_a_chunk_goes_in_several_and_every_count_lands() {
    let (engine, store) = setup(4);
    let report = engine.flush().await;
    assert_eq!(
        (report.items, report.round_trips, report.failed),
        (KEYS, 3, 0)
    );
    assert_eq!(
        store.operations(),
        4,
        "one round trip per chunk of at most 4, then the instance's announcement"
    );
    assert_eq!(totals(&store), vec![1; KEYS]);
}

#[tokio::test]
async fn a_store_that_dies_between_chunks_keeps_what_landed_and_gets_only_the_rest_again() {
    let (engine, store) = setup(4);
    // The first chunk lands; the store dies before the second; the third is not sent.
    store.fail_after(1);
    let report = engine.flush().await;
    assert_eq!(
        (report.items, report.round_trips, report.failed),
        (KEYS, 1, 6)
    );
    assert!(
        engine.store_ok(),
        "a chunk answered: the rules are not all put on their fallback"
    );
    let landed = totals(&store).iter().filter(|&&n| n == 1).count();
    assert_eq!(landed, 4);
    // Back up: the six that did not land go (the failed chunk's outcome is settled by its
    // receipt first), the four that did are not sent again.
    store.set_available(true);
    let report = engine.flush().await;
    assert_eq!((report.items, report.failed), (6, 0));
    assert_eq!(totals(&store), vec![1; KEYS], "nothing lost, nothing twice");
}

#[tokio::test]
async fn one_slow_chunk_among_answered_ones_does_not_stop_the_flush() {
    let shared: Arc<dyn Clock> = Arc::new(ManualClock::new(T0 + SECOND));
    let store = Arc::new(Watched::new(MemoryStore::new(shared.clone())).failing_flush_call(1));
    let engine = engine_with(store.clone(), shared, 4);
    // Chunks of 4, 4 and 2: the second times out, the third is sent all the same.
    let report = engine.flush().await;
    assert_eq!(
        (report.items, report.round_trips, report.failed),
        (KEYS, 2, 4)
    );
    let landed = totals(&store.inner).iter().filter(|&&n| n == 1).count();
    assert_eq!(landed, 6);
    // The next flush settles the slow chunk by its receipt (it never arrived) and sends it.
    engine.flush().await;
    assert_eq!(
        totals(&store.inner),
        vec![1; KEYS],
        "nothing lost, nothing twice"
    );
}

/// A memory store that notes how many flush calls were on their way when each one started
/// (each call yields once first, so calls sent together overlap).
struct Overlapping {
    inner: MemoryStore,
    on_the_way: std::sync::atomic::AtomicUsize,
    at_start: std::sync::Mutex<Vec<usize>>,
}

impl CounterStore for Overlapping {
    fn flush_timed<'a>(
        &'a self,
        items: &'a [sluice_store::FlushItem],
        receipt: Option<&'a sluice_store::FlushReceipt>,
        time: sluice_store::FlushTime,
    ) -> sluice_store::StoreFuture<'a, sluice_store::FlushReply> {
        use std::sync::atomic::Ordering::SeqCst;
        Box::pin(async move {
            let n = self.on_the_way.fetch_add(1, SeqCst) + 1;
            self.at_start.lock().unwrap().push(n);
            tokio::task::yield_now().await;
            let reply = self.inner.flush_timed(items, receipt, time).await;
            self.on_the_way.fetch_sub(1, SeqCst);
            reply
        })
    }

    fn landed<'a>(
        &'a self,
        items: &'a [sluice_store::FlushItem],
        receipt: &'a sluice_store::FlushReceipt,
    ) -> sluice_store::StoreFuture<'a, Vec<Option<bool>>> {
        self.inner.landed(items, receipt)
    }

    fn exact<'a>(
        &'a self,
        request: &'a sluice_store::ExactRequest,
    ) -> sluice_store::StoreFuture<'a, sluice_core::Decision> {
        self.inner.exact(request)
    }

    fn time(&self) -> sluice_store::StoreFuture<'_, u64> {
        self.inner.time()
    }

    fn describe(&self) -> String {
        "overlapping".into()
    }
}

#[tokio::test]
async fn the_first_chunk_goes_alone_and_then_two_are_on_their_way_at_once() {
    let shared: Arc<dyn Clock> = Arc::new(ManualClock::new(T0 + SECOND));
    let store = Arc::new(Overlapping {
        inner: MemoryStore::new(shared.clone()),
        on_the_way: Default::default(),
        at_start: Default::default(),
    });
    let engine = engine_with(store.clone(), shared, 2);
    let report = engine.flush().await;
    assert_eq!(
        (report.items, report.round_trips, report.failed),
        (KEYS, 5, 0)
    );
    let at_start = store.at_start.lock().unwrap().clone();
    assert_eq!(at_start.len(), 5, "five chunks of 2: {at_start:?}");
    assert_eq!(at_start[0], 1, "the first chunk goes alone: {at_start:?}");
    assert_eq!(at_start.iter().max(), Some(&2), "{at_start:?}");
    assert_eq!(totals(&store.inner), vec![1; KEYS], "every count once");
}
