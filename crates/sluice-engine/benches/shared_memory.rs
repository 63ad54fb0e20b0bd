//! What a synced key costs on top of its 80-byte entry once other instances count it too: the
//! extension of a shared key (the others' entries, the budget) in a second map. 1M keys are
//! checked on one engine, then one flush to a store that answers as if one other instance had
//! counted every key as much as this one (it keeps nothing, so no store memory is counted);
//! the heap bytes the flush leaves behind (counted by `stats_alloc`) are the extensions.
//! Resident memory is not used here: the flush's own items and replies, freed by then, stay in
//! glibc's heap and would blur the figure. Run: `cargo bench -p sluice-engine --bench shared_memory`

mod common;

use std::alloc::System;
use std::path::Path;
use std::sync::Arc;

use common::now_or_never;
use sluice_core::{Clock, ManualClock};
use sluice_engine::{Engine, EngineOptions};
use sluice_store::{
    CounterStore, ExactRequest, FlushItem, FlushOutcome, FlushReceipt, FlushReply, FlushTime,
    MemoryStore, StoreFuture,
};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Answers every flush as if one other instance had counted each key as much as this one (its
/// entry mirrors this instance's). Keeps nothing.
struct Mirror(MemoryStore);

impl CounterStore for Mirror {
    fn flush_timed<'a>(
        &'a self,
        items: &'a [FlushItem],
        _receipt: Option<&'a FlushReceipt>,
        _time: FlushTime,
    ) -> StoreFuture<'a, FlushReply> {
        Box::pin(async move {
            let other: Arc<str> = Arc::from("other");
            let results = items
                .iter()
                .map(|item| {
                    let entries = item
                        .entry
                        .iter()
                        .flat_map(|mine| {
                            let mut theirs = mine.clone();
                            theirs.node = other.clone();
                            [mine.clone(), theirs]
                        })
                        .collect();
                    Ok(FlushOutcome {
                        total: 2 * item.delta,
                        previous_total: item.want_previous.then_some(0),
                        entries,
                    })
                })
                .collect();
            Ok(FlushReply {
                results,
                store_time: None,
                round_trips: 1,
            })
        })
    }

    fn landed<'a>(
        &'a self,
        items: &'a [FlushItem],
        receipt: &'a FlushReceipt,
    ) -> StoreFuture<'a, Vec<Option<bool>>> {
        self.0.landed(items, receipt)
    }

    fn exact<'a>(&'a self, request: &'a ExactRequest) -> StoreFuture<'a, sluice_core::Decision> {
        self.0.exact(request)
    }

    fn time(&self) -> StoreFuture<'_, u64> {
        self.0.time()
    }

    fn describe(&self) -> String {
        "mirror".into()
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let clock = ManualClock::new(1_800_000_000_000_000_000 + 1_000_000_000);
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let yaml = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 1000000, mode: synced, policy: predictive }\n";
    let rules = sluice_config::RuleSet::new(vec![
        sluice_config::parse_domain(Path::new("b.yaml"), yaml).unwrap(),
    ])
    .unwrap();
    let engine = Engine::new(
        &rules,
        &Default::default(),
        Arc::new(Mirror(MemoryStore::new(shared.clone()))),
        shared,
        EngineOptions::default(),
    );
    let keys = 1_000_000u32;
    let region = Region::new(GLOBAL);
    for i in 0..keys {
        let user = format!("u{i:07}");
        now_or_never(engine.check("d", &[[("user", user.as_str())]], 1)).unwrap();
    }
    let alone = region.change();
    let region = Region::new(GLOBAL);
    let report = now_or_never(engine.flush());
    let flush = region.change();
    // `stats_alloc` counts a reallocation's growth (or shrinkage) in the allocated (or
    // deallocated) bytes already; its `bytes_reallocated` repeats it.
    let net = |s: stats_alloc::Stats| {
        (
            s.bytes_allocated as i64 - s.bytes_deallocated as i64,
            s.allocations as i64 - s.deallocations as i64,
        )
    };
    let (alone_bytes, alone_allocs) = net(alone);
    let (shared_bytes, shared_allocs) = net(flush);
    println!(
        "shared_memory: {keys} keys alone: {:.1} bytes and {:.2} allocations per key on the heap",
        alone_bytes as f64 / f64::from(keys),
        alone_allocs as f64 / f64::from(keys)
    );
    println!(
        "shared_memory: after one flush ({} items) showing another instance on every key: +{:.1} bytes and +{:.2} allocations per key",
        report.items,
        shared_bytes as f64 / f64::from(keys),
        shared_allocs as f64 / f64::from(keys)
    );
    drop(engine);
}
