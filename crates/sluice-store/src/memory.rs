//! The embedded store: one process, same semantics as Redis, plus fault injection.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_core::{Clock, Decision, Nanos, duration_to_nanos};

use crate::exact::{ExactRequest, ExactStateHandle, decide_in_memory};
use crate::window_counter::WindowCounter;
use crate::{
    CounterStore, FlushItem, FlushOutcome, FlushReceipt, FlushReply, FlushTime, NodeEntry,
    Presence, StoreError, StoreFuture,
};

#[derive(Default)]
struct State {
    counters: HashMap<String, (u64, Nanos)>,
    nodes: HashMap<String, (HashMap<Arc<str>, NodeEntry>, Nanos)>,
    exact: HashMap<Arc<str>, (ExactStateHandle, Nanos)>,
    /// Flush markers (see `FlushReceipt`): token and expiry.
    markers: HashMap<String, (u64, Nanos)>,
    /// Live instances: id and last announcement.
    fleet: HashMap<String, Nanos>,
    flushes_since_sweep: u32,
}

impl State {
    /// A window-counter decision on the counters flushes add to; a new counter lives two
    /// windows, as the Redis script sets it.
    fn window_counter(
        &mut self,
        counter: &WindowCounter,
        request: &ExactRequest,
        now: Nanos,
    ) -> Decision {
        let window = counter.window(request.now_us);
        let count = |state: &Self, w: u64| {
            state
                .counters
                .get(&format!("{}:{w}", request.key))
                .filter(|(_, exp)| *exp > now)
                .map_or(0, |(v, _)| *v)
        };
        let current = count(self, window);
        let previous = window.checked_sub(1).map_or(0, |w| count(self, w));
        let (decision, add) = counter.decide(current, previous, request.now_us, request.cost);
        if add > 0 {
            let expires = now.saturating_add(counter.window_us.saturating_mul(2_000));
            let slot = self
                .counters
                .entry(format!("{}:{window}", request.key))
                .or_insert((0, expires));
            if slot.1 <= now {
                *slot = (0, expires);
            }
            slot.0 = slot.0.saturating_add(add);
        }
        decision
    }

    fn sweep(&mut self, now: Nanos) {
        self.counters.retain(|_, (_, exp)| *exp > now);
        self.nodes.retain(|_, (_, exp)| *exp > now);
        self.exact.retain(|_, (_, exp)| *exp > now);
        self.markers.retain(|_, (_, exp)| *exp > now);
    }
}

/// The embedded store. Keys expire like Redis keys, by the store's clock.
///
/// For tests and the simulator it can be made unavailable ([`MemoryStore::set_available`]) or
/// slow ([`MemoryStore::set_latency`]); it counts the operations it serves.
pub struct MemoryStore {
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
    available: AtomicBool,
    replies_lost: AtomicBool,
    exact_replies_lost: AtomicU64,
    latency_ns: AtomicU64,
    clock_latency_ns: AtomicU64,
    operations: AtomicU64,
    commands: AtomicU64,
    /// Round trips still served before the store switches itself off (`u64::MAX`: never).
    fail_after: AtomicU64,
}

impl MemoryStore {
    /// A store whose time (for expiry and `TIME`) comes from `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            state: Mutex::new(State::default()),
            available: AtomicBool::new(true),
            replies_lost: AtomicBool::new(false),
            exact_replies_lost: AtomicU64::new(0),
            latency_ns: AtomicU64::new(0),
            clock_latency_ns: AtomicU64::new(0),
            operations: AtomicU64::new(0),
            commands: AtomicU64::new(0),
            fail_after: AtomicU64::new(u64::MAX),
        }
    }

    /// Makes every call fail with [`StoreError::Unavailable`] (false) or succeed again (true).
    pub fn set_available(&self, available: bool) {
        self.available.store(available, Ordering::Relaxed);
    }

    /// Makes every flush apply its counts, and every exact decision be taken, and then fail
    /// with [`StoreError::Timeout`] as if the reply were lost (true), or answer again (false):
    /// a call whose outcome is unknown.
    pub fn set_replies_lost(&self, lost: bool) {
        self.replies_lost.store(lost, Ordering::Relaxed);
    }

    /// Serves `calls` more round trips, then switches itself off (as [`Self::set_available`]
    /// with false): a store that dies in the middle of a flush of several chunks. `u64::MAX`
    /// disarms it.
    pub fn fail_after(&self, calls: u64) {
        self.fail_after.store(calls, Ordering::Relaxed);
    }

    /// Delays every call by `latency` (tokio time).
    pub fn set_latency(&self, latency: Duration) {
        self.latency_ns
            .store(duration_to_nanos(latency), Ordering::Relaxed);
    }

    /// Delays the calls that start from now on by `latency` measured on the store's own clock:
    /// a call takes effect once that clock has moved half of `latency` past the moment it was
    /// first polled, and completes after the other half. For simulations that drive manual clocks and poll futures
    /// themselves (under a runtime it would spin); zero switches it off.
    pub fn set_clock_latency(&self, latency: Duration) {
        self.clock_latency_ns
            .store(duration_to_nanos(latency), Ordering::Relaxed);
    }

    /// Exact decisions taken whose reply was lost (see [`MemoryStore::set_replies_lost`]).
    pub fn exact_replies_lost(&self) -> u64 {
        self.exact_replies_lost.load(Ordering::Relaxed)
    }

    /// Round trips served so far (a flush is one, an exact decision is one).
    pub fn operations(&self) -> u64 {
        self.operations.load(Ordering::Relaxed)
    }

    /// The Redis commands the round trips served so far would have taken
    /// ([`FlushItem::redis_commands`] per item, one `TIME` per flush, one script call per exact
    /// decision, one `TIME` per clock read).
    pub fn commands(&self) -> u64 {
        self.commands.load(Ordering::Relaxed)
    }

    /// The global count of `key` in `window`, as a reader would see it.
    pub fn total(&self, key: &str, window: u64) -> u64 {
        let now = self.clock.now();
        let state = self.lock();
        state
            .counters
            .get(&format!("{key}:{window}"))
            .filter(|(_, exp)| *exp > now)
            .map_or(0, |(v, _)| *v)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits `ns` on the store's clock (simulated latency).
    async fn wait_on_clock(&self, ns: u64) {
        if ns == 0 {
            return;
        }
        let deadline = self.clock.now().saturating_add(ns);
        std::future::poll_fn(|cx| {
            if self.clock.now() >= deadline {
                std::task::Poll::Ready(())
            } else {
                cx.waker().wake_by_ref();
                std::task::Poll::Pending
            }
        })
        .await;
    }

    /// Runs `op` like a round trip: half the simulated latency out, the operation at the
    /// store, half back.
    async fn round_trip<T>(
        &self,
        op: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let simulated = self.clock_latency_ns.load(Ordering::Relaxed);
        self.wait_on_clock(simulated / 2).await;
        let result = match self.enter().await {
            Ok(()) => op(),
            Err(e) => Err(e),
        };
        self.wait_on_clock(simulated - simulated / 2).await;
        result
    }

    async fn enter(&self) -> Result<(), StoreError> {
        let latency = self.latency_ns.load(Ordering::Relaxed);
        if latency > 0 {
            tokio::time::sleep(Duration::from_nanos(latency)).await;
        }
        let left = self.fail_after.load(Ordering::Relaxed);
        if left != u64::MAX {
            if left == 0 {
                self.set_available(false);
                self.fail_after.store(u64::MAX, Ordering::Relaxed);
            } else {
                self.fail_after.store(left - 1, Ordering::Relaxed);
            }
        }
        if !self.available.load(Ordering::Relaxed) {
            return Err(StoreError::Unavailable("memory store switched off".into()));
        }
        self.operations.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn flush_now(&self, items: &[FlushItem], receipt: Option<&FlushReceipt>) -> FlushReply {
        let now = self.clock.now();
        let mut state = self.lock();
        state.flushes_since_sweep += 1;
        if state.flushes_since_sweep >= 64 {
            state.flushes_since_sweep = 0;
            state.sweep(now);
        }
        let results = items
            .iter()
            .map(|item| {
                let expires = now.saturating_add(duration_to_nanos(item.ttl));
                let counter = format!("{}:{}", item.key, item.window);
                let slot = state.counters.entry(counter).or_insert((0, expires));
                if slot.1 <= now {
                    *slot = (0, expires);
                }
                slot.0 = slot.0.saturating_add(item.delta);
                slot.1 = expires;
                let total = slot.0;
                let previous_total = item.want_previous.then(|| {
                    item.window
                        .checked_sub(1)
                        .and_then(|w| state.counters.get(&format!("{}:{w}", item.key)))
                        .filter(|(_, exp)| *exp > now)
                        .map_or(0, |(v, _)| *v)
                });
                let mut entries = Vec::new();
                if let Some(entry) = &item.entry {
                    let nodes_key = format!("{}:{}:n", item.key, item.window);
                    let slot = state
                        .nodes
                        .entry(nodes_key)
                        .or_insert_with(|| (HashMap::new(), expires));
                    if slot.1 <= now {
                        slot.0.clear();
                    }
                    slot.1 = expires;
                    slot.0.insert(entry.node.clone(), entry.clone());
                    entries = slot.0.values().cloned().collect();
                    // A stable order keeps the simulator deterministic.
                    entries.sort_by(|a: &NodeEntry, b: &NodeEntry| a.node.cmp(&b.node));
                }
                Ok(FlushOutcome {
                    total,
                    previous_total,
                    entries,
                })
            })
            .collect();
        if let (Some(receipt), Some(first)) = (receipt, items.first()) {
            let longest = items.iter().map(|i| i.ttl).max().unwrap_or_default();
            state.markers.insert(
                receipt.marker_key(first),
                (
                    receipt.token,
                    now.saturating_add(duration_to_nanos(longest)),
                ),
            );
        }
        FlushReply {
            results,
            store_time: Some(now),
            round_trips: 1,
        }
    }

    fn exact_now(&self, request: &ExactRequest) -> Result<Decision, StoreError> {
        let now = self.clock.now();
        let mut state = self.lock();
        if let Some(counter) = request.algorithm.window_counter() {
            return Ok(state.window_counter(&counter, request, now));
        }
        let previous = state
            .exact
            .get(&request.key)
            .filter(|(_, exp)| *exp > now)
            .map(|(s, _)| s.clone());
        let (decision, next) =
            decide_in_memory(request, previous).ok_or_else(|| StoreError::BadReply {
                key: request.key.to_string(),
                detail: "invalid exact-mode parameters (zero limit or window)".into(),
            })?;
        // Keep state for two windows past the last use, like the Redis scripts.
        let ttl = request.algorithm.window_us().saturating_mul(2_000);
        state
            .exact
            .insert(request.key.clone(), (next, now.saturating_add(ttl)));
        Ok(decision)
    }
}

impl CounterStore for MemoryStore {
    fn flush_timed<'a>(
        &'a self,
        items: &'a [FlushItem],
        receipt: Option<&'a FlushReceipt>,
        time: FlushTime,
    ) -> StoreFuture<'a, FlushReply> {
        Box::pin(self.round_trip(move || {
            let commands = u64::from(time == FlushTime::Read)
                + u64::from(receipt.is_some() && !items.is_empty())
                + items.iter().map(FlushItem::redis_commands).sum::<u64>();
            self.commands.fetch_add(commands, Ordering::Relaxed);
            let mut reply = self.flush_now(items, receipt);
            if time == FlushTime::Skip {
                reply.store_time = None;
            }
            if self.replies_lost.load(Ordering::Relaxed) {
                return Err(StoreError::Timeout(Duration::ZERO));
            }
            Ok(reply)
        }))
    }

    fn landed<'a>(
        &'a self,
        items: &'a [FlushItem],
        receipt: &'a FlushReceipt,
    ) -> StoreFuture<'a, Vec<Option<bool>>> {
        Box::pin(self.round_trip(move || {
            self.commands.fetch_add(1, Ordering::Relaxed);
            let now = self.clock.now();
            let landed = items.first().is_some_and(|first| {
                self.lock()
                    .markers
                    .get(&receipt.marker_key(first))
                    .is_some_and(|&(token, exp)| token == receipt.token && exp > now)
            });
            Ok(vec![Some(landed); items.len()])
        }))
    }

    fn exact<'a>(&'a self, request: &'a ExactRequest) -> StoreFuture<'a, Decision> {
        Box::pin(self.round_trip(move || {
            self.commands.fetch_add(1, Ordering::Relaxed);
            let decision = self.exact_now(request)?;
            if self.replies_lost.load(Ordering::Relaxed) {
                self.exact_replies_lost.fetch_add(1, Ordering::Relaxed);
                return Err(StoreError::Timeout(Duration::ZERO));
            }
            Ok(decision)
        }))
    }

    fn time(&self) -> StoreFuture<'_, Nanos> {
        Box::pin(self.round_trip(move || {
            self.commands.fetch_add(1, Ordering::Relaxed);
            Ok(self.clock.now())
        }))
    }

    fn announce<'a>(&'a self, node: &'a str, live_for: Duration) -> StoreFuture<'a, Presence> {
        Box::pin(self.round_trip(move || {
            self.commands.fetch_add(1, Ordering::Relaxed);
            let now = self.clock.now();
            let mut state = self.lock();
            state.fleet.insert(node.to_owned(), now);
            let since = now.saturating_sub(live_for.as_nanos() as u64);
            state.fleet.retain(|_, &mut at| at >= since);
            Ok(Presence {
                live: state.fleet.len() as u64,
                store_time: now,
            })
        }))
    }

    fn leave<'a>(&'a self, node: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(self.round_trip(move || {
            self.commands.fetch_add(1, Ordering::Relaxed);
            self.lock().fleet.remove(node);
            Ok(())
        }))
    }

    fn describe(&self) -> String {
        "memory".to_owned()
    }
}
