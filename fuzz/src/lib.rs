//! What the fuzz targets share: a rule set with every mode and algorithm, and engines over the
//! memory store on a manual clock (no time passes unless a target moves it).

use std::path::Path;
use std::sync::Arc;

use arc_swap::ArcSwap;
use sluice_config::{RuleSet, parse_domain};
use sluice_core::{Clock, ManualClock};
use sluice_engine::{Engine, EngineOptions};
use sluice_store::MemoryStore;

/// A whole number of minutes since the epoch, in nanoseconds.
pub const T0: u64 = 1_800_000_000_000_000_000;

/// Rules over every mode and most algorithms, with nested descriptors, several limits on one
/// key, `replaces`, shadow mode and an unlimited value: the request targets reach all of them.
pub const RULES: &str = r#"
domain: edge
descriptors:
  - key: user
    limits:
      - { unit: minute, requests_per_unit: 5 }
      - { unit: hour, requests_per_unit: 50, mode: exact }
  - key: user
    value: vip
    rate_limit: { unlimited: true }
  - key: ip
    rate_limit: { window: 10s, requests_per_unit: 20, mode: synced, spans: 4 }
  - key: ip
    value: "10.*"
    rate_limit: { window: 10s, requests_per_unit: 2, mode: synced, policy: reactive }
  - key: route
    descriptors:
      - key: method
        rate_limit: { unit: second, requests_per_unit: 3, algorithm: token_bucket, burst: 2 }
  - key: tenant
    shadow_mode: true
    rate_limit: { unit: second, requests_per_unit: 1, algorithm: sliding_window_log }
  - key: api
    rate_limit: { unit: second, requests_per_unit: 4, algorithm: leaky_bucket }
  - key: queue
    rate_limit: { unit: second, requests_per_unit: 4, algorithm: leaky_queue, max_delay: 1s }
"#;

/// The API domain of `/v1/acquire` (its descriptor is `[item, user]`).
pub const API_RULES: &str = r#"
domain: api
descriptors:
  - key: item
    descriptors:
      - key: user
        rate_limit: { unit: minute, requests_per_unit: 10, algorithm: sliding_window }
"#;

/// The rule files above, parsed.
pub fn rules() -> RuleSet {
    RuleSet::new(vec![
        parse_domain(Path::new("edge.yaml"), RULES).expect("edge rules"),
        parse_domain(Path::new("api.yaml"), API_RULES).expect("api rules"),
    ])
    .expect("rule set")
}

/// An engine on the memory store and a manual clock, with a small key cap so sprays reach it.
pub fn engine(rules: &RuleSet, clock: &ManualClock, store: Arc<MemoryStore>) -> Engine {
    let clock: Arc<dyn Clock> = Arc::new(clock.clone());
    Engine::new(
        rules,
        &Default::default(),
        store,
        clock,
        EngineOptions {
            max_keys_per_rule: 64,
            ..EngineOptions::default()
        },
    )
}

/// [`engine`] over [`rules`], shared the way `sluice serve` shares it.
pub fn shared_engine() -> Arc<ArcSwap<Engine>> {
    let clock = ManualClock::new(T0);
    let store = Arc::new(MemoryStore::new(Arc::new(clock.clone())));
    Arc::new(ArcSwap::from_pointee(engine(&rules(), &clock, store)))
}

/// A runtime for the async entry points (a target runs one input at a time).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime")
}
