//! The [`Flusher`]: the flush, above the rule table. It takes each synced rule's counts at
//! its span boundary, sends them over the [`StoreLink`] with a receipt (settling earlier
//! flushes in doubt first), applies the replies to the keys, sweeps idle keys of every rule,
//! spills and replays what the store did not take, and reports the flush metrics. What the
//! flush learns of the store (its clock, health, the fleet) it leaves in the link, where the
//! request path reads it. One flusher is shared by an engine and the engines its reloads
//! build, so flushes never overlap and nothing it knows is lost.

mod delivery;
mod record;
mod replay;
mod retired;
mod spill;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use metrics::{counter, gauge, histogram};
use sluice_core::Nanos;
use sluice_store::{FlushItem, FlushTime, StoreError};

pub use record::FlushSummary;
pub use spill::{Spill, StateDir, StateError};

use crate::health::StoreHealth;
use crate::link::{PROBE_EVERY_NS, StoreLink, count_store_error};
use crate::rule::{RuleEngine, RuleKind};
use crate::synced::{PendingFlush, SyncedRule};
use crate::table::RuleTable;
use delivery::{Delivery, ItemResult};
use replay::Replay;
pub(crate) use retired::Retired;
use retired::RetiredRules;

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

/// The flush of an engine (see the module documentation).
pub(crate) struct Flusher {
    link: Arc<StoreLink>,
    /// When the store's clock was last probed (raw local time).
    last_probe: AtomicU64,
    /// Held for a whole flush: one at a time.
    delivery: tokio::sync::Mutex<Delivery>,
    /// Items per pipeline (`EngineOptions::flush_chunk_items`).
    chunk: usize,
    /// Synced rules reloads removed, swept until they are done.
    retired: RetiredRules,
    /// An earlier run's spill still to deliver; taken out for a step, under `delivery`'s lock.
    replay: parking_lot::Mutex<Option<Replay>>,
    /// The flushes as the status page shows them.
    record: record::FlushRecord,
}

impl Flusher {
    pub(crate) fn new(link: Arc<StoreLink>, chunk: usize) -> Self {
        Self {
            link,
            last_probe: AtomicU64::new(0),
            delivery: tokio::sync::Mutex::new(Delivery::new()),
            chunk: chunk.max(1),
            retired: RetiredRules::default(),
            replay: parking_lot::Mutex::new(None),
            record: record::FlushRecord::default(),
        }
    }

    /// The flushes so far, for the status page.
    pub(crate) fn flush_summary(&self) -> FlushSummary {
        self.record.summary()
    }

    /// Keeps flushing a synced rule a reload removed (see [`Retired`]).
    pub(crate) fn retire(&self, rule: Retired) {
        self.retired.push(rule);
    }

    /// The shortest span among the removed rules still swept (`None`: none).
    pub(crate) fn retired_min_span_ns(&self) -> Option<Nanos> {
        self.retired.min_span_ns()
    }

    /// Delivers `spill` (an earlier run's) with the next flushes, keeping its file in `state`.
    pub(crate) fn replay(&self, spill: Spill, state: Arc<StateDir>) {
        let mut slot = self.replay.lock();
        match slot.as_mut() {
            Some(replay) => replay.add(spill),
            None => *slot = Some(Replay::new(state, self.link.node(), spill)),
        }
    }

    /// Counts of an earlier run's spill not yet delivered.
    pub(crate) fn replay_pending(&self) -> u64 {
        self.replay.lock().as_ref().map_or(0, Replay::counts)
    }

    /// One flush over `table`'s rules (and the rules reloads removed): sweep every rule, send
    /// the synced counts that are due, apply the replies; then, with the store answering, a
    /// step of an earlier run's spill. With nothing to send, probe the store instead when it
    /// is due.
    pub(crate) async fn flush(&self, table: &RuleTable, due: Due) -> FlushReport {
        let mut delivery = self.delivery.lock().await;
        let mut report = FlushReport::default();
        let link = &*self.link;
        if due == Due::Early {
            link.early.take();
            let now = link.now();
            let (mut items, mut pending) = (Vec::new(), Vec::new());
            for rule in table.rules() {
                if let RuleKind::Synced(synced) = &*rule.kind {
                    let mut mine = Vec::new();
                    synced.prepare_early(now, link.node(), &mut items, &mut mine);
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
        let now = link.now();
        let retired = self.retired.live();
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
        if link.health().answering() {
            self.replay_step(&mut report).await;
        }
        // After the counts: a slow store delays what the instance learns of the fleet, not
        // the counts' delivery.
        link.announce_if_due(table.announces()).await;
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
        let link = &*self.link;
        let (node, clock) = (link.node(), link.raw_clock());
        let now = link.now();
        report.items = items.len();
        let sent_at = clock.now();
        let result = delivery
            .send(link.store(), node, (items, time), self.chunk, clock)
            .await;
        let received_at = clock.now();
        let took = received_at.saturating_sub(sent_at);
        histogram!("sluice_flush_duration_seconds").record(took as f64 / 1e9);
        let error = result.as_ref().err().map(ToString::to_string);
        self.record.record(received_at, took, error);
        counter!("sluice_flush_items_total").increment(items.len() as u64);
        match result {
            Ok(sent) => {
                if sent.asked {
                    link.set_health(StoreHealth::Answering);
                }
                report.round_trips = sent.round_trips;
                if let Some(t) = sent.store_time {
                    link.observe_store_time(t.sent_at, t.received_at, t.store);
                }
                self.count_item_results(&sent.results);
                let (now, view) = (link.now(), link.view());
                report.failed += off_the_request_path(|| {
                    let outcome = |i: usize| sent.results.get(i).and_then(ItemResult::outcome);
                    pending
                        .iter()
                        .filter(|(synced, p)| !synced.apply(p, outcome, node, (now, view)))
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
                    link.early.wake_at(at);
                }
                counter!("sluice_flushes_total", "result" => "ok").increment(1);
            }
            Err(e) => {
                let began = link.set_health(StoreHealth::Unreachable);
                count_store_error(&e);
                counter!("sluice_flushes_total", "result" => "error").increment(1);
                // One line per burst of failures; the next ones only at debug level.
                if began {
                    tracing::warn!(store = %link.store().describe(), error = %e, "flush failed; counts are kept and local fallback limits apply until the store answers");
                } else {
                    tracing::debug!(store = %link.store().describe(), error = %e, "flush failed again");
                }
                let view = link.view();
                off_the_request_path(|| {
                    for (synced, p) in pending {
                        synced.apply(p, |_| None, node, (now, view));
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
            .step(self.link.store(), self.chunk, self.link.now() / 1_000_000)
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
        let now = self.link.now();
        let retired = self.retired.live();
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
                let (id, node) = (&rule.id, self.link.node());
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
                sweep_synced(
                    &rule.id,
                    synced,
                    now,
                    self.link.node(),
                    items,
                    pending,
                    true,
                )
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
        let link = &*self.link;
        let raw_now = link.raw_clock().now();
        let last = self.last_probe.load(Ordering::Relaxed);
        let wanted = (!link.reached() && table.has_synced())
            || (link.follows_store_clock() && table.decides_at_store(link.view()));
        if !wanted || raw_now.saturating_sub(last) < PROBE_EVERY_NS {
            return;
        }
        self.last_probe.store(raw_now, Ordering::Relaxed);
        if let Err(e) = link.probe().await {
            report.error = Some(e.to_string());
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
