//! The [`Flusher`]: everything about the store round trip. It takes each synced rule's counts
//! at its span boundary, sends them with a receipt (settling earlier flushes in doubt first),
//! applies the replies to the keys, keeps the store's clock offset and health, sweeps idle
//! keys of every rule and reports the flush metrics. One flusher is shared by an engine and
//! the engines its reloads build, so flushes never overlap and nothing it knows is lost.

mod delivery;
mod fleet;
mod offset;
mod record;
mod replay;
mod retired;
mod schedule;
mod spill;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use metrics::{counter, gauge, histogram};
use sluice_core::{Clock, Nanos};
use sluice_store::{CounterStore, FlushItem, FlushTime, StoreError};

pub use record::FlushSummary;
pub use schedule::{EARLY_SYNC_DELAY, run_flush_loop};
pub use spill::{Spill, StateDir, StateError};

use crate::exact::breaker::{Breaker, BreakerState};
use crate::exact::decisions::StoreCalls;
use crate::health::{HealthCell, StoreHealth, StoreView};
use crate::rule::{RuleEngine, RuleKind};
use crate::synced::{PendingFlush, SyncedRule};
use crate::table::RuleTable;
use delivery::{Delivery, ItemResult};
use offset::ClockOffset;
use replay::Replay;
pub(crate) use retired::Retired;

/// What one flush did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlushReport {
    /// Keys (items) sent.
    pub items: usize,
    /// Round trips to the store.
    pub round_trips: usize,
    /// Items whose counts did not reach the store (kept for the next flush).
    pub failed: usize,
    /// Keys forgotten because they were idle.
    pub evicted: usize,
    /// The error, if the store failed as a whole.
    pub error: Option<String>,
}

/// Which synced rules a flush takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Due {
    /// Every rule (tests, shutdown, a rule set a reload replaced).
    All,
    /// Rules whose span ended since their last flush (the timer).
    SpanEnded,
    /// Only the keys that asked for an early sync (their span's safe share is spent).
    Early,
}

/// The store side of an engine (see the module documentation).
pub(crate) struct Flusher {
    store: Arc<dyn CounterStore>,
    clock: Arc<dyn Clock>,
    node: Arc<str>,
    /// Correct the clock by the store's `TIME` (`EngineOptions::follow_store_clock`).
    follow_store_clock: bool,
    /// Store time minus local time, as measured from trustworthy readings.
    offset: ClockOffset,
    health: HealthCell,
    /// When the store's clock was last probed (raw local time).
    last_probe: AtomicU64,
    /// Held for a whole flush: one at a time.
    delivery: tokio::sync::Mutex<Delivery>,
    /// Items per pipeline (`EngineOptions::flush_chunk_items`).
    chunk: usize,
    /// Synced rules reloads removed, swept until they are done.
    retired: parking_lot::Mutex<Vec<Retired>>,
    /// An earlier run's spill still to deliver; taken out for a step, under `delivery`'s lock.
    replay: parking_lot::Mutex<Option<Replay>>,
    /// Exact mode's breaker and time budget per request.
    breaker: Breaker,
    exact_timeout: Option<std::time::Duration>,
    /// Instances live on the store as the last announcement found them (0: not known yet).
    fleet: AtomicU64,
    /// When this instance last announced itself (raw local time), and whether the last two
    /// answers agreed on the fleet's size.
    last_announce: AtomicU64,
    fleet_steady: std::sync::atomic::AtomicBool,
    /// Keys asked for an early sync since the last early flush; wakes the flush loop.
    early_wanted: std::sync::atomic::AtomicBool,
    early_wake: tokio::sync::Notify,
    /// The engine time before which the early sync asked for should not leave (0: at once):
    /// see [`SyncedRule::read_ahead_at`].
    early_not_before: AtomicU64,
    /// The flushes as the status page shows them.
    record: record::FlushRecord,
}

/// Nanoseconds between probes of an idle store.
const PROBE_EVERY_NS: u64 = 1_000_000_000;

/// Counts a store error in `sluice_store_errors_total` (flushes, probes and exact mode alike).
pub(crate) fn count_store_error(e: &StoreError) {
    counter!("sluice_store_errors_total", "kind" => e.kind()).increment(1);
}

impl Flusher {
    pub(crate) fn new(
        store: Arc<dyn CounterStore>,
        clock: Arc<dyn Clock>,
        node: Arc<str>,
        follow_store_clock: bool,
        chunk: usize,
        exact: &sluice_config::ExactCalls,
        exact_budget_timer: bool,
    ) -> Self {
        Self {
            store,
            clock,
            node,
            follow_store_clock,
            offset: ClockOffset::new(),
            health: HealthCell::new(),
            last_probe: AtomicU64::new(0),
            delivery: tokio::sync::Mutex::new(Delivery::new()),
            chunk: chunk.max(1),
            retired: parking_lot::Mutex::new(Vec::new()),
            replay: parking_lot::Mutex::new(None),
            breaker: Breaker::new(exact),
            exact_timeout: exact_budget_timer.then_some(exact.timeout),
            fleet: AtomicU64::new(0),
            last_announce: AtomicU64::new(0),
            fleet_steady: std::sync::atomic::AtomicBool::new(false),
            early_wanted: std::sync::atomic::AtomicBool::new(false),
            early_wake: tokio::sync::Notify::new(),
            early_not_before: AtomicU64::new(0),
            record: record::FlushRecord::default(),
        }
    }

    /// What a synced decision knows of the store now.
    pub(crate) fn view(&self) -> StoreView {
        StoreView {
            health: self.health(),
            fleet: self.fleet.load(Ordering::Relaxed).max(1),
        }
    }

    /// The flushes so far, for the status page.
    pub(crate) fn flush_summary(&self) -> FlushSummary {
        self.record.summary()
    }

    /// A key asked for an early sync: wake the flush loop.
    pub(crate) fn wake_early_sync(&self) {
        if !self.early_wanted.swap(true, Ordering::Relaxed) {
            self.early_wake.notify_one();
        }
    }

    /// Whether keys wait for an early sync.
    pub(crate) fn early_sync_wanted(&self) -> bool {
        self.early_wanted.load(Ordering::Relaxed)
    }

    /// The engine time before which the early sync asked for should not leave (0: at once).
    pub(crate) fn early_sync_not_before(&self) -> Nanos {
        self.early_not_before.load(Ordering::Relaxed)
    }

    /// Resolves once keys have asked for an early sync.
    pub(crate) async fn early_sync_asked(&self) {
        if !self.early_sync_wanted() {
            self.early_wake.notified().await;
        }
    }

    /// Whether the store takes decisions (`exact` mode's scripts); etcd does not.
    pub(crate) fn runs_exact(&self) -> bool {
        self.store.runs_exact()
    }

    /// How a decision taken in the store calls it (exact rules, synced small limits).
    pub(crate) fn exact_calls(&self) -> StoreCalls<'_> {
        StoreCalls {
            store: &*self.store,
            breaker: &self.breaker,
            timeout: self.exact_timeout,
        }
    }

    pub(crate) fn breaker_state(&self) -> BreakerState {
        self.breaker.state()
    }

    /// Delivers `spill` (an earlier run's) with the next flushes, keeping its file in `state`.
    pub(crate) fn replay(&self, spill: Spill, state: Arc<StateDir>) {
        let mut slot = self.replay.lock();
        match slot.as_mut() {
            Some(replay) => replay.add(spill),
            None => *slot = Some(Replay::new(state, &self.node, spill)),
        }
    }

    /// Counts of an earlier run's spill not yet delivered.
    pub(crate) fn replay_pending(&self) -> u64 {
        self.replay.lock().as_ref().map_or(0, Replay::counts)
    }

    pub(crate) fn node(&self) -> &Arc<str> {
        &self.node
    }

    /// The current time corrected by the offset to the store's clock.
    pub(crate) fn now(&self) -> Nanos {
        let raw = self.clock.now() as i128 + i128::from(self.offset_ns());
        raw.clamp(0, i128::from(u64::MAX)) as u64
    }

    pub(crate) fn offset_ns(&self) -> i64 {
        self.offset.get()
    }

    pub(crate) fn health(&self) -> StoreHealth {
        self.health.get()
    }

    pub(crate) fn reached(&self) -> bool {
        self.health.reached()
    }

    /// Takes the store's clock as read between `sent` and `received` (raw local times), when
    /// the reading can be trusted ([`ClockOffset::observe`]).
    fn observe_store_time(&self, sent: Nanos, received: Nanos, store_time: Nanos) {
        if self.follow_store_clock {
            self.offset.observe(sent, received, store_time);
        }
    }

    /// One flush over `table`'s rules (and the rules reloads removed): sweep every rule, send
    /// the synced counts that are due, apply the replies; then, with the store answering, a
    /// step of an earlier run's spill. With nothing to send, probe the store instead when it
    /// is due.
    pub(crate) async fn flush(&self, table: &RuleTable, due: Due) -> FlushReport {
        let mut delivery = self.delivery.lock().await;
        let mut report = FlushReport::default();
        if due == Due::Early {
            self.early_wanted.store(false, Ordering::Relaxed);
            self.early_not_before.store(0, Ordering::Relaxed);
            let now = self.now();
            let (mut items, mut pending) = (Vec::new(), Vec::new());
            for rule in table.rules() {
                if let RuleKind::Synced(synced) = &*rule.kind {
                    let mut mine = Vec::new();
                    synced.prepare_early(now, &self.node, &mut items, &mut mine);
                    pending.extend(mine.into_iter().map(|p| (synced, p)));
                }
            }
            if !items.is_empty() {
                counter!("sluice_early_syncs_total").increment(items.len() as u64);
                // Moments after a span's flush: no new reading of the store's clock.
                let sending = (&pending[..], FlushTime::Skip);
                self.send(&mut delivery, &mut items, sending, &mut report)
                    .await;
            }
            return report;
        }
        let now = self.now();
        let retired = self.retired_rules();
        let (mut items, pending, evicted) =
            off_the_request_path(|| self.collect(table, &retired, now, due));
        report.evicted = evicted;
        if items.is_empty() {
            self.probe_if_due(table, &mut report).await;
        } else {
            let sending = (&pending[..], FlushTime::Read);
            self.send(&mut delivery, &mut items, sending, &mut report)
                .await;
        }
        if self.health().answering() {
            self.replay_step(&mut report).await;
        }
        // After the counts: a slow store delays what the instance learns of the fleet, not
        // the counts' delivery.
        self.announce_if_due(table).await;
        report
    }

    /// Sends a flush's items and applies the answer to their keys.
    async fn send(
        &self,
        delivery: &mut Delivery,
        items: &mut [FlushItem],
        (pending, time): (&[(&SyncedRule, PendingFlush)], FlushTime),
        report: &mut FlushReport,
    ) {
        let now = self.now();
        report.items = items.len();
        let sent_at = self.clock.now();
        let result = delivery
            .send(
                &*self.store,
                &self.node,
                (items, time),
                self.chunk,
                &*self.clock,
            )
            .await;
        let received_at = self.clock.now();
        let took = received_at.saturating_sub(sent_at);
        histogram!("sluice_flush_duration_seconds").record(took as f64 / 1e9);
        let error = result.as_ref().err().map(ToString::to_string);
        self.record.record(received_at, took, error);
        counter!("sluice_flush_items_total").increment(items.len() as u64);
        match result {
            Ok(sent) => {
                if sent.asked {
                    self.health.set(StoreHealth::Answering);
                }
                report.round_trips = sent.round_trips;
                if let Some(t) = sent.store_time {
                    self.observe_store_time(t.sent_at, t.received_at, t.store);
                }
                self.count_item_results(&sent.results);
                let (now, view) = (self.now(), self.view());
                report.failed += off_the_request_path(|| {
                    let outcome = |i: usize| sent.results.get(i).and_then(ItemResult::outcome);
                    pending
                        .iter()
                        .filter(|(synced, p)| !synced.apply(p, outcome, &self.node, (now, view)))
                        .count()
                });
                // Keys that read ahead of the others' flushes of this boundary read again
                // once those have landed.
                let read_ahead = pending
                    .iter()
                    .filter(|(synced, _)| synced.take_early_from_reply())
                    .map(|(synced, _)| synced.read_ahead_at(now))
                    .max();
                if let Some(at) = read_ahead {
                    self.early_not_before.fetch_max(at, Ordering::Relaxed);
                    self.wake_early_sync();
                }
                counter!("sluice_flushes_total", "result" => "ok").increment(1);
            }
            Err(e) => {
                let began = self.health.set(StoreHealth::Unreachable);
                count_store_error(&e);
                counter!("sluice_flushes_total", "result" => "error").increment(1);
                // One line per burst of failures; the next ones only at debug level.
                if began {
                    tracing::warn!(store = %self.store.describe(), error = %e, "flush failed; counts are kept and local fallback limits apply until the store answers");
                } else {
                    tracing::debug!(store = %self.store.describe(), error = %e, "flush failed again");
                }
                let view = self.view();
                off_the_request_path(|| {
                    for (synced, p) in pending {
                        synced.apply(p, |_| None, &self.node, (now, view));
                    }
                });
                report.failed = report.items;
                report.error = Some(e.to_string());
            }
        }
    }

    /// One step of an earlier run's spill, when there is one.
    async fn replay_step(&self, report: &mut FlushReport) {
        let Some(mut replay) = self.replay.lock().take() else {
            return;
        };
        let step = replay
            .step(&*self.store, self.chunk, self.now() / 1_000_000)
            .await;
        if let Some(e) = &step.error {
            count_store_error(e);
            report.error.get_or_insert_with(|| e.to_string());
        }
        if replay.is_done() {
            tracing::info!("every count of the last run's spill file is delivered");
        } else {
            *self.replay.lock() = Some(replay);
        }
    }

    /// Every count this instance could not deliver, for the state directory at shutdown:
    /// every key's unsent counts (less those known to have arrived, and those in an unsettled
    /// flush, which go in as doubts), plus what is left of an earlier run's spill. The keys'
    /// counts are taken: call it once, after the final flush.
    pub(crate) async fn spill(&self, table: &RuleTable) -> Spill {
        let mut delivery = self.delivery.lock().await;
        let now = self.now();
        let retired = self.retired_rules();
        let (items, _pending, _) =
            off_the_request_path(|| self.collect(table, &retired, now, Due::All));
        let mut spill = delivery.spill(&items, now / 1_000_000);
        if let Some(replay) = self.replay.lock().take() {
            spill.merge(replay.into_spill());
        }
        counter!("sluice_spilled_counts_total").increment(spill.counts());
        spill
    }

    /// Store errors of single items (one warning per flush, however many), and items held back
    /// (behind an unsettled flush, or after the store failed earlier in this flush).
    fn count_item_results(&self, results: &[ItemResult]) {
        let (mut unsettled, mut not_sent, mut failed) = (0u64, 0u64, 0u64);
        let mut first_error: Option<&StoreError> = None;
        for result in results {
            match result {
                ItemResult::Failed(e) => {
                    count_store_error(e);
                    failed += 1;
                    first_error.get_or_insert(e);
                }
                ItemResult::Held => unsettled += 1,
                ItemResult::NotSent => not_sent += 1,
                ItemResult::Landed(_) => {}
            }
        }
        if let Some(error) = first_error {
            tracing::warn!(failed, %error, "some keys' counts did not reach the store; they are kept for the next flush");
        }
        for (reason, n) in [("unsettled", unsettled), ("store_failed", not_sent)] {
            if n > 0 {
                counter!("sluice_flush_items_held_total", "reason" => reason).increment(n);
            }
        }
        if unsettled > 0 {
            tracing::debug!(
                unsettled,
                "items held back until an earlier flush of their keys is settled"
            );
        }
    }

    /// Every rule's part of a flush (and the removed rules'): the items to send, the keys
    /// waiting for them, and the keys evicted.
    fn collect<'t>(
        &self,
        table: &'t RuleTable,
        retired: &'t [Retired],
        now: Nanos,
        due: Due,
    ) -> (Vec<FlushItem>, Vec<(&'t SyncedRule, PendingFlush)>, usize) {
        let (mut items, mut pending, mut evicted) = (Vec::new(), Vec::new(), 0);
        for rule in table.rules() {
            evicted += self.sweep(rule, now, due, &mut items, &mut pending);
        }
        for rule in retired {
            if let Some(synced) = rule.synced() {
                let (id, node) = (&rule.id, &self.node);
                evicted += sweep_synced(id, synced, now, node, &mut items, &mut pending, false);
            }
        }
        (items, pending, evicted)
    }

    /// One rule's part of a flush: a synced rule whose span ended gives its counts (and drops
    /// idle keys); local and exact rules drop idle keys. Sets the rule's gauges; returns the
    /// keys evicted.
    fn sweep<'t>(
        &self,
        rule: &'t RuleEngine,
        now: Nanos,
        due: Due,
        items: &mut Vec<FlushItem>,
        pending: &mut Vec<(&'t SyncedRule, PendingFlush)>,
    ) -> usize {
        let id = || rule.id.to_string();
        match &*rule.kind {
            RuleKind::Synced(synced) => {
                let span = synced.params.span_of(now);
                if due == Due::SpanEnded && rule.flushed_span.load(Ordering::Relaxed) == span {
                    return 0;
                }
                rule.flushed_span.store(span, Ordering::Relaxed);
                sweep_synced(&rule.id, synced, now, &self.node, items, pending, true)
            }
            RuleKind::Local(local) => {
                let evicted = local.evict_idle(now);
                gauge!("sluice_tracked_keys", "rule" => id()).set(local.len() as f64);
                evicted
            }
            RuleKind::Exact(exact) => {
                let evicted = exact.evict(now);
                gauge!("sluice_blocked_keys", "rule" => id()).set(exact.blocked() as f64);
                evicted
            }
            RuleKind::Unlimited | RuleKind::Blocked => 0,
        }
    }

    /// With nothing to send: still find out whether the store answers (readiness, and the
    /// fallback decision) until it first has, and keep the clock offset fresh for the rules
    /// that ask the store for decisions (they pass their corrected time to its scripts), with
    /// the cheapest call, at most once a second.
    async fn probe_if_due(&self, table: &RuleTable, report: &mut FlushReport) {
        let raw_now = self.clock.now();
        let last = self.last_probe.load(Ordering::Relaxed);
        let wanted = (!self.reached() && table.has_synced())
            || (self.follow_store_clock && table.decides_at_store(self.view()));
        if !wanted || raw_now.saturating_sub(last) < PROBE_EVERY_NS {
            return;
        }
        self.last_probe.store(raw_now, Ordering::Relaxed);
        let sent_at = self.clock.now();
        match self.store.time().await {
            Ok(store_time) => {
                self.observe_store_time(sent_at, self.clock.now(), store_time);
                self.health.set(StoreHealth::Answering);
            }
            Err(e) => {
                if self.health.set(StoreHealth::Unreachable) {
                    tracing::warn!(store = %self.store.describe(), error = %e, "the store does not answer; local fallback limits apply until it does");
                }
                count_store_error(&e);
                report.error = Some(e.to_string());
            }
        }
    }
}

/// A synced rule's part of a flush: its counts into `items` (and `pending`), idle keys dropped;
/// with `gauges`, the rule's gauges set (not for a rule a reload removed). Returns the keys
/// evicted.
fn sweep_synced<'t>(
    id: &Arc<str>,
    synced: &'t SyncedRule,
    now: Nanos,
    node: &Arc<str>,
    items: &mut Vec<FlushItem>,
    pending: &mut Vec<(&'t SyncedRule, PendingFlush)>,
    gauges: bool,
) -> usize {
    let mut mine = Vec::new();
    let sweep = synced.prepare_flush(now, node, items, &mut mine);
    let id = || id.to_string();
    if sweep.evicted > 0 {
        counter!("sluice_evicted_keys_total", "rule" => id()).increment(sweep.evicted as u64);
    }
    if gauges {
        gauge!("sluice_tracked_keys", "rule" => id()).set(synced.keys.len() as f64);
        gauge!("sluice_live_instances", "rule" => id()).set(sweep.live_instances as f64);
        gauge!("sluice_blocked_keys", "rule" => id()).set(sweep.blocked as f64);
        gauge!("sluice_node_estimate", "rule" => id()).set(sweep.node_estimate as f64);
    }
    pending.extend(mine.into_iter().map(|p| (synced, p)));
    sweep.evicted
}

/// Runs a flush's work over every key (a sweep, applying the replies: millions of keys after
/// a spray) without holding up requests: on a multi-thread runtime the worker hands its queue
/// to another thread first (`block_in_place`) and the work runs on a thread of its own at a
/// lower priority (nice 10), so on a busy machine the requests' threads get the CPU first;
/// elsewhere (a current-thread runtime, the simulator) it runs in place.
fn off_the_request_path<R: Send>(work: impl FnOnce() -> R + Send) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(|| {
                std::thread::scope(|scope| {
                    let worker = scope.spawn(|| {
                        lower_priority();
                        work()
                    });
                    worker
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                })
            })
        }
        _ => work(),
    }
}

/// This thread's scheduling priority lowered to nice 10 (Linux: per thread). Best effort.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        let tid = rustix::thread::gettid();
        let _ = rustix::process::setpriority_process(Some(tid), 10);
    }
}
