//! Delivering an earlier run's spill: doubts settled by their receipts, then the pending
//! counts sent in chunks, each under a receipt written to the spill file before it is sent.

use std::sync::Arc;

use metrics::{counter, gauge};
use sluice_store::{CounterStore, FlushReceipt, StoreError};

use super::spill::{Spill, SpilledCount, SpilledDoubt, StateDir};

/// An earlier run's counts still to deliver, and where their file is.
pub(crate) struct Replay {
    state: Arc<StateDir>,
    /// The receipts' owner: this instance's id with a suffix, so no ordinary flush (of this
    /// instance or an earlier one with the same id) ever writes these markers.
    owner: Arc<str>,
    spill: Spill,
    next_token: u64,
}

/// What a replay step did.
#[derive(Debug, Default)]
pub(crate) struct ReplayStep {
    /// Counts known to be in the store now (settled doubts that arrived, sent counts).
    pub landed: u64,
    /// Counts dropped because their window's keys are gone from the store.
    pub expired: u64,
    /// The store error that stopped the step.
    pub error: Option<StoreError>,
}

impl Replay {
    pub(crate) fn new(state: Arc<StateDir>, node: &str, spill: Spill) -> Self {
        use std::hash::BuildHasher as _;
        let replay = Self {
            state,
            owner: format!("{node}~replay").into(),
            spill,
            next_token: std::collections::hash_map::RandomState::new().hash_one(1u8),
        };
        replay.report();
        replay
    }

    /// More counts to deliver.
    pub(crate) fn add(&mut self, spill: Spill) {
        self.spill.merge(spill);
        self.report();
    }

    pub(crate) fn is_done(&self) -> bool {
        self.spill.is_empty()
    }

    /// What is left, for the shutdown's spill.
    pub(crate) fn into_spill(self) -> Spill {
        self.spill
    }

    /// Counts left to deliver.
    pub(crate) fn counts(&self) -> u64 {
        self.spill.counts()
    }

    fn report(&self) {
        gauge!("sluice_spill_pending_counts").set(self.spill.counts() as f64);
    }

    /// Settles the doubts, then sends the pending counts in chunks of `chunk`; stops at the
    /// first store error. `now_ms` is the store-corrected time.
    pub(crate) async fn step(
        &mut self,
        store: &dyn CounterStore,
        chunk: usize,
        now_ms: u64,
    ) -> ReplayStep {
        let mut step = ReplayStep::default();
        if let Err(e) = self.settle(store, &mut step).await {
            step.error = Some(e);
        } else {
            self.drop_expired(now_ms, &mut step);
            self.send(store, chunk, &mut step).await;
        }
        self.save();
        self.report();
        counter!("sluice_spill_replayed_counts_total", "outcome" => "landed")
            .increment(step.landed);
        counter!("sluice_spill_replayed_counts_total", "outcome" => "expired")
            .increment(step.expired);
        step
    }

    /// Asks the store about every doubt: what arrived is done, what did not is pending again.
    async fn settle(
        &mut self,
        store: &dyn CounterStore,
        step: &mut ReplayStep,
    ) -> Result<(), StoreError> {
        for doubt in &mut self.spill.doubts {
            let sent: Vec<_> = doubt.sent.iter().map(SpilledCount::item).collect();
            let arrived = store.landed(&sent, &doubt.receipt()).await?;
            for (i, count) in doubt.sent.iter().enumerate() {
                match arrived.get(i).copied().flatten() {
                    Some(_) if !doubt.unknown[i] => {}
                    Some(true) => step.landed += count.delta,
                    Some(false) => self.spill.pending.push(count.clone()),
                    None => continue,
                }
                doubt.unknown[i] = false;
            }
        }
        self.spill
            .doubts
            .retain(|d| d.unknown_counts().next().is_some());
        Ok(())
    }

    fn drop_expired(&mut self, now_ms: u64, step: &mut ReplayStep) {
        self.spill.pending.retain(|c| {
            let live = c.expires_at_ms > now_ms;
            if !live {
                step.expired += c.delta;
            }
            live
        });
    }

    /// Sends the pending counts, each chunk first written down as a doubt under its receipt.
    async fn send(&mut self, store: &dyn CounterStore, chunk: usize, step: &mut ReplayStep) {
        while !self.spill.pending.is_empty() {
            let take = chunk.max(1).min(self.spill.pending.len());
            let counts: Vec<SpilledCount> = self.spill.pending.drain(..take).collect();
            let receipt = FlushReceipt {
                owner: self.owner.clone(),
                token: self.next_token,
            };
            self.next_token = self.next_token.wrapping_add(1);
            self.spill.doubts.push(SpilledDoubt {
                owner: receipt.owner.to_string(),
                token: receipt.token,
                unknown: vec![true; counts.len()],
                sent: counts,
            });
            if !self.save() {
                // Not written down, not sent: the counts stay pending.
                let doubt = self.spill.doubts.pop().expect("just pushed");
                self.spill.pending.splice(0..0, doubt.sent);
                return;
            }
            let doubt = self.spill.doubts.last_mut().expect("just pushed");
            let items: Vec<_> = doubt.sent.iter().map(SpilledCount::item).collect();
            match store.flush(&items, Some(&receipt)).await {
                Ok(reply) => {
                    let mut lost = Vec::new();
                    for (i, count) in doubt.sent.iter().enumerate() {
                        match reply.results.get(i) {
                            Some(Ok(_)) => step.landed += count.delta,
                            // Unknown whether it arrived: the receipt will tell.
                            Some(Err(e)) if e.is_unavailable() => continue,
                            _ => lost.push(count.clone()),
                        }
                        doubt.unknown[i] = false;
                    }
                    self.spill.pending.extend(lost);
                    self.spill
                        .doubts
                        .retain(|d| d.unknown_counts().next().is_some());
                }
                Err(e) => {
                    if !e.is_unavailable() {
                        // Refused as a whole: nothing arrived.
                        let doubt = self.spill.doubts.pop().expect("just pushed");
                        self.spill.pending.extend(doubt.sent);
                    }
                    step.error = Some(e);
                    return;
                }
            }
        }
    }

    /// Writes the spill file (removes it once everything is delivered); `false` when it could
    /// not be written (logged).
    fn save(&self) -> bool {
        match self.state.save(&self.spill) {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(error = %e, "cannot write the spill file; its counts are not replayed until it can be written");
                false
            }
        }
    }
}
