//! The cost of a check through the engine (matching, key encoding, the rule's limiter) for a
//! tracked key: `local` vs `synced`, manual clock, memory store. Also counts heap allocations
//! per check on tracked keys.

mod common;

use std::alloc::System;
use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::now_or_never;
use criterion::{Criterion, criterion_group};
use sluice_core::{Clock, ManualClock};
use sluice_engine::{Engine, EngineOptions};
use sluice_store::MemoryStore;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn engine(mode: &str) -> (Engine, ManualClock) {
    let yaml = format!(
        "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {{ unit: second, requests_per_unit: 1000000000, mode: {mode} }}\n"
    );
    let rules = sluice_config::RuleSet::new(vec![
        sluice_config::parse_domain(Path::new("b.yaml"), &yaml).unwrap(),
    ])
    .unwrap();
    let clock = ManualClock::new(1_800_000_000_000_000_000);
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let store = Arc::new(MemoryStore::new(shared.clone()));
    let engine = Engine::new(
        &rules,
        &Default::default(),
        store,
        shared,
        EngineOptions {
            shared_store: true,
            ..EngineOptions::default()
        },
    );
    (engine, clock)
}

fn users(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("user-{i}")).collect()
}

fn checks(c: &mut Criterion) {
    let keys = users(10_000);
    for mode in ["local", "synced"] {
        let (engine, _clock) = engine(mode);
        for k in &keys {
            now_or_never(engine.check("d", &[[("user", k.as_str())]], 1)).unwrap();
        }
        let mut i = 0usize;
        c.bench_function(&format!("engine_check/{mode}/10k_keys"), |b| {
            b.iter(|| {
                i = (i + 7919) % keys.len();
                let request = [[("user", keys[i].as_str())]];
                black_box(
                    now_or_never(engine.check("d", &request, 1))
                        .unwrap()
                        .allowed,
                )
            })
        });
    }
}

fn allocations() {
    let keys = users(1000);
    for mode in ["local", "synced"] {
        let (engine, _clock) = engine(mode);
        for k in &keys {
            now_or_never(engine.check("d", &[[("user", k.as_str())]], 1)).unwrap();
        }
        let region = Region::new(GLOBAL);
        for round in 0..100 {
            for k in &keys {
                let request = [[("user", k.as_str())]];
                black_box(now_or_never(engine.check("d", &request, round)).unwrap());
            }
        }
        let stats = region.change();
        println!(
            "engine_check/{mode}: {} allocations in 100000 checks of tracked keys",
            stats.allocations
        );
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    targets = checks
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    allocations();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
