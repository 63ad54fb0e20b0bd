//! Flush receipts and doubts: nothing lost, nothing counted twice.
//!
//! A flush that times out, or whose connection breaks after sending, may have been applied:
//! its counts go back to their keys (nothing is lost), and before they are sent again the
//! flush's receipt tells whether they arrived (nothing is counted twice).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures_util::StreamExt as _;
use futures_util::stream::FuturesOrdered;
use metrics::counter;
use sluice_core::{Clock, Nanos};
use sluice_store::{
    CounterStore, FlushItem, FlushOutcome, FlushReceipt, FlushReply, FlushTime, StoreError,
};

use super::spill::{Spill, SpilledCount, SpilledDoubt};

/// What became of one item of a flush.
#[derive(Debug)]
pub(crate) enum ItemResult {
    /// The store applied it and answered.
    Landed(FlushOutcome),
    /// The store did not apply it (or its outcome is unknown: it is then in doubt).
    Failed(StoreError),
    /// Not sent: an earlier flush of the same key and window is not settled yet. The key
    /// keeps the count until it is.
    Held,
    /// Not sent: an earlier chunk of this flush found the store unreachable. The key keeps
    /// the count for the next flush.
    NotSent,
}

impl ItemResult {
    pub(crate) fn outcome(&self) -> Option<&FlushOutcome> {
        match self {
            ItemResult::Landed(outcome) => Some(outcome),
            _ => None,
        }
    }
}

/// A flush's answer, lined up with the items the engine asked to send.
#[derive(Debug, Default)]
pub(crate) struct Sent {
    pub results: Vec<ItemResult>,
    /// The store's clock when it ran the flush's first answered chunk, with the local (raw)
    /// times that chunk was sent and answered.
    pub store_time: Option<StoreTime>,
    pub round_trips: usize,
    /// Whether the store answered (a chunk of) the flush; not when every item was held back.
    pub asked: bool,
}

impl Sent {
    /// Takes the store's `reply` to `part` (sent at `sent_at`, answered at `received_at`):
    /// each item's result into `answers`, in order, and the store's clock if it is the first
    /// reading. A store that answers fewer items than it was sent is broken: those items fail.
    fn take(
        &mut self,
        reply: FlushReply,
        part: &[FlushItem],
        (sent_at, received_at): (Nanos, Nanos),
        answers: &mut Vec<ItemResult>,
    ) {
        self.asked = true;
        self.round_trips += reply.round_trips;
        let reading = reply.store_time.map(|store| StoreTime {
            store,
            sent_at,
            received_at,
        });
        self.store_time = self.store_time.or(reading);
        let mut results = reply.results.into_iter();
        answers.extend(part.iter().map(|item| match results.next() {
            Some(Ok(outcome)) => ItemResult::Landed(outcome),
            Some(Err(e)) => ItemResult::Failed(e),
            None => ItemResult::Failed(StoreError::BadReply {
                key: item.key.to_string(),
                detail: "the store answered fewer items than were sent".into(),
            }),
        }));
    }
}

/// A reading of the store's clock and the round trip it came in.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StoreTime {
    pub store: Nanos,
    pub sent_at: Nanos,
    pub received_at: Nanos,
}

/// What the engine knows about counts whose arrival in the store is uncertain.
#[derive(Default)]
pub(crate) struct Delivery {
    /// Flushes whose outcome is not (entirely) known.
    doubt: Vec<Doubt>,
    /// Counts the store is known to hold while their keys still have them as unsent (a flush in
    /// doubt that did arrive), per store key and window: taken off the next flush's deltas.
    landed: HashMap<(Arc<str>, u64), u64>,
    /// The next flush's receipt token.
    next_token: u64,
}

/// A flush whose outcome is unknown for some of its items.
struct Doubt {
    receipt: FlushReceipt,
    /// The items exactly as sent (entries left out): the store finds each pipeline's marker
    /// from them.
    sent: Vec<FlushItem>,
    /// Per item of `sent`: whether its outcome is still unknown.
    unknown: Vec<bool>,
}

impl Delivery {
    pub(crate) fn new() -> Self {
        // Tokens stay unique across restarts of an instance with the same id: they start at a
        // random number (std's hasher keys come from the OS).
        use std::hash::BuildHasher as _;
        Self {
            next_token: std::collections::hash_map::RandomState::new().hash_one(0u8),
            ..Self::default()
        }
    }

    /// The store keys and windows whose counts are in an unsettled flush.
    fn held(&self) -> HashSet<(Arc<str>, u64)> {
        self.doubt
            .iter()
            .flat_map(|d| d.sent.iter().zip(&d.unknown))
            .filter(|(_, unknown)| **unknown)
            .map(|(item, _)| (item.key.clone(), item.window))
            .collect()
    }

    /// Takes the counts known to have arrived off `items`; returns what each item lost.
    fn take_landed(&self, items: &mut [FlushItem]) -> Vec<u64> {
        if self.landed.is_empty() {
            return Vec::new();
        }
        items
            .iter_mut()
            .map(|item| {
                let known = self
                    .landed
                    .get(&(item.key.clone(), item.window))
                    .map_or(0, |&n| n.min(item.delta));
                item.delta -= known;
                known
            })
            .collect()
    }

    /// After a flush: the counts taken off items that failed (`failed(i)`) are still known to
    /// have arrived (their keys have them back as unsent); the rest is forgotten (sent, or
    /// dropped by their keys).
    fn keep_landed(&mut self, items: &[FlushItem], taken: &[u64], failed: impl Fn(usize) -> bool) {
        if taken.is_empty() {
            self.landed.clear();
            return;
        }
        let mut landed = HashMap::new();
        for (i, item) in items.iter().enumerate() {
            if let Some(&known) = taken.get(i).filter(|&&n| n > 0 && failed(i)) {
                landed.insert((item.key.clone(), item.window), known);
            }
        }
        self.landed = landed;
    }

    /// Settles the flushes whose outcome was unknown: counts that arrived are remembered (and
    /// taken off the next items of their key and window), lost ones are sent again by their
    /// keys. What cannot be settled (the store did not answer) stays in doubt. Returns the
    /// first error.
    async fn settle(&mut self, store: &dyn CounterStore) -> Option<StoreError> {
        for doubt in &mut self.doubt {
            let arrived = match store.landed(&doubt.sent, &doubt.receipt).await {
                Ok(arrived) => arrived,
                // After one failure the store is not asked again in this flush.
                Err(e) => return Some(e).inspect(|_| self.doubt.retain(|d| d.open())),
            };
            for (i, item) in doubt.sent.iter().enumerate() {
                let known = arrived.get(i).copied().flatten();
                let Some(arrived) = known.filter(|_| doubt.unknown[i]) else {
                    continue;
                };
                doubt.unknown[i] = false;
                if arrived {
                    *self
                        .landed
                        .entry((item.key.clone(), item.window))
                        .or_default() += item.delta;
                }
                let outcome = if arrived { "landed" } else { "lost" };
                counter!("sluice_flush_doubts_settled_total", "outcome" => outcome).increment(1);
            }
        }
        self.doubt.retain(Doubt::open);
        None
    }

    /// Sends `items` after settling the flushes whose outcome was unknown, in pipelines of at
    /// most `chunk` items, each with its own receipt (so a flush of any size fits the store's
    /// per-call timeout, and a chunk that fails leaves the others landed). The answer's
    /// results line up with `items`. An item whose key and window are still in doubt is not
    /// sent ([`ItemResult::Held`]): its key keeps the count until the doubt is settled. Once
    /// the first chunk, or two in a row, fail as a whole (the store is unreachable), the rest
    /// are not sent ([`ItemResult::NotSent`]); if no chunk was answered, the flush fails.
    pub(crate) async fn send(
        &mut self,
        store: &dyn CounterStore,
        owner: &Arc<str>,
        (items, time): (&mut [FlushItem], FlushTime),
        chunk: usize,
        clock: &dyn Clock,
    ) -> Result<Sent, StoreError> {
        if let Some(e) = self.settle(store).await {
            // A store that could not be asked about the doubts is not sent anything either:
            // that would only wait for a second timeout.
            let taken = self.take_landed(items);
            self.keep_landed(items, &taken, |_| true);
            return Err(e);
        }
        let held = self.held();
        let is_held =
            |item: &FlushItem| !held.is_empty() && held.contains(&(item.key.clone(), item.window));
        let taken = self.take_landed(items);
        // What is sent: every item, or those not held.
        let filtered: Vec<FlushItem>;
        let sent: &[FlushItem] = if held.is_empty() {
            items
        } else {
            filtered = items.iter().filter(|i| !is_held(i)).cloned().collect();
            &filtered
        };
        let parts: Vec<&[FlushItem]> = sent.chunks(chunk.max(1)).collect();
        let progress = self.send_parts(store, owner, &parts, time, clock).await;
        let Progress {
            mut answer,
            answers,
            failure,
            ..
        } = progress;
        let result = match failure {
            Some(e) if !answer.asked => Err(e),
            _ => {
                // The answer, lined up with `items`.
                let mut answers = answers.into_iter();
                let line_up = |item: &FlushItem| match is_held(item) {
                    true => ItemResult::Held,
                    false => answers.next().unwrap_or(ItemResult::NotSent),
                };
                answer.results = items.iter().map(line_up).collect();
                Ok(answer)
            }
        };
        self.keep_landed(items, &taken, |i| match &result {
            Ok(sent) => !matches!(sent.results.get(i), Some(ItemResult::Landed(_))),
            Err(_) => true,
        });
        result
    }

    /// Sends the parts, each with its receipt, and applies each answer as it comes.
    async fn send_parts(
        &mut self,
        store: &dyn CounterStore,
        owner: &Arc<str>,
        parts: &[&[FlushItem]],
        time: FlushTime,
        clock: &dyn Clock,
    ) -> Progress {
        let mut progress = Progress {
            answers: Vec::with_capacity(parts.iter().map(|p| p.len()).sum()),
            ..Progress::default()
        };
        // Once the store has answered a part, two are in flight: the store runs one while
        // this process encodes the next or reads the last one's replies (on two CPUs the flush
        // takes about the longer of the two, not their sum). When the store goes away
        // mid-flush, the part already on its way is answered (or put in doubt) before the
        // rest is left unsent.
        let receipts: Vec<Option<FlushReceipt>> =
            parts.iter().map(|p| self.receipt_for(p, owner)).collect();
        let mut in_flight = FuturesOrdered::new();
        let mut next = 0;
        loop {
            let window = if progress.answer.asked { IN_FLIGHT } else { 1 };
            while !progress.stopped && next < parts.len() && in_flight.len() < window {
                let i = next;
                // The store's clock is read once per flush, with its first part.
                let time = if i == 0 { time } else { FlushTime::Skip };
                let sent_at = clock.now();
                let reply = store.flush_timed(parts[i], receipts[i].as_ref(), time);
                in_flight.push_back(async move { (i, sent_at, reply.await) });
                next += 1;
            }
            let Some((i, sent_at, result)) = in_flight.next().await else {
                break;
            };
            let times = (sent_at, clock.now());
            self.answered(parts[i], receipts[i].clone(), result, times, &mut progress);
        }
        for part in &parts[next..] {
            progress.not_sent(part);
        }
        progress
    }

    /// A receipt for a part that adds counts (a part that only reads, early syncs ahead of
    /// the others' flushes, adds nothing that could be counted twice: it needs none).
    fn receipt_for(&mut self, part: &[FlushItem], owner: &Arc<str>) -> Option<FlushReceipt> {
        part.iter().any(|i| i.delta > 0).then(|| {
            let token = self.next_token;
            self.next_token = self.next_token.wrapping_add(1);
            FlushReceipt {
                owner: owner.clone(),
                token,
            }
        })
    }

    /// Takes one part's answer: its doubts, its items' results, and whether to go on.
    fn answered(
        &mut self,
        part: &[FlushItem],
        receipt: Option<FlushReceipt>,
        result: Result<FlushReply, StoreError>,
        (sent_at, received_at): (Nanos, Nanos),
        progress: &mut Progress,
    ) {
        if let Some(receipt) = receipt {
            self.doubt_unknown(&result, part, receipt);
        }
        let outcome = if result.is_ok() { "answered" } else { "failed" };
        counter!("sluice_flush_chunks_total", "result" => outcome).increment(1);
        match result {
            Ok(reply) => {
                progress.failed_in_a_row = 0;
                let answers = &mut progress.answers;
                progress
                    .answer
                    .take(reply, part, (sent_at, received_at), answers);
            }
            Err(e) => {
                // The store is taken for unreachable (the rest is not sent) when the first
                // part fails, or two in a row do; one slow part among answered ones does not
                // stop a spray's flush.
                progress
                    .answers
                    .extend(part.iter().map(|_| ItemResult::Failed(e.clone())));
                progress.failed_in_a_row += 1;
                progress.stopped = !progress.answer.asked || progress.failed_in_a_row >= 2;
                progress.failure.get_or_insert(e);
            }
        }
    }

    /// Everything this delivery is responsible for, as a spill (at shutdown, when the store
    /// could not take it): `items` (every key's unsent counts) less what is known to have
    /// arrived and what is in an unsettled flush, plus the unsettled flushes themselves.
    /// Empties the delivery. `now_ms` is the store-corrected time.
    pub(crate) fn spill(&mut self, items: &[FlushItem], now_ms: u64) -> Spill {
        let mut known = self.landed.clone();
        for doubt in &self.doubt {
            for (item, _) in doubt.sent.iter().zip(&doubt.unknown).filter(|(_, u)| **u) {
                *known.entry((item.key.clone(), item.window)).or_default() += item.delta;
            }
        }
        let pending = items
            .iter()
            .filter_map(|item| {
                let known = known.get(&(item.key.clone(), item.window)).copied();
                let delta = item.delta.saturating_sub(known.unwrap_or(0));
                (delta > 0).then(|| SpilledCount::of(item, delta, now_ms))
            })
            .collect();
        let doubts = self
            .doubt
            .drain(..)
            .map(|d| SpilledDoubt {
                owner: d.receipt.owner.to_string(),
                token: d.receipt.token,
                sent: d
                    .sent
                    .iter()
                    .map(|i| SpilledCount::of(i, i.delta, now_ms))
                    .collect(),
                unknown: d.unknown,
            })
            .collect();
        self.landed.clear();
        Spill::new(doubts, pending)
    }

    /// Items of `sent` whose outcome is unknown (the store became unreachable while they were
    /// on their way) start a new doubt under `receipt`.
    fn doubt_unknown(
        &mut self,
        result: &Result<FlushReply, StoreError>,
        sent: &[FlushItem],
        receipt: FlushReceipt,
    ) {
        let in_doubt = |i: usize| match result {
            Ok(reply) => reply
                .results
                .get(i)
                .is_some_and(|r| r.as_ref().is_err_and(StoreError::is_unavailable)),
            Err(e) => e.is_unavailable(),
        };
        if matches!(result, Ok(r) if r.results.iter().all(Result::is_ok)) {
            return;
        }
        let unknown: Vec<bool> = (0..sent.len())
            .map(|i| sent[i].delta > 0 && in_doubt(i))
            .collect();
        if unknown.contains(&true) {
            let sent = sent
                .iter()
                .map(|i| FlushItem {
                    entry: None,
                    ..i.clone()
                })
                .collect();
            self.doubt.push(Doubt {
                receipt,
                sent,
                unknown,
            });
        }
    }
}

/// Parts of one flush on their way to the store at once (after the first is answered).
const IN_FLIGHT: usize = 2;

/// How a flush's parts have fared so far.
#[derive(Default)]
struct Progress {
    answer: Sent,
    /// The results of the items sent so far, in order.
    answers: Vec<ItemResult>,
    failure: Option<StoreError>,
    failed_in_a_row: usize,
    /// The store is taken for unreachable: the rest is not sent.
    stopped: bool,
}

impl Progress {
    fn not_sent(&mut self, part: &[FlushItem]) {
        self.answers
            .extend(part.iter().map(|_| ItemResult::NotSent));
        counter!("sluice_flush_chunks_total", "result" => "not_sent").increment(1);
    }
}

impl Doubt {
    fn open(&self) -> bool {
        self.unknown.contains(&true)
    }
}
