//! Sluice's rate-limit engine: the rule table of every domain, and for each rule a `local`,
//! `synced` or `exact` limiter.
//!
//! The engine takes its [`sluice_core::Clock`] and its [`sluice_store::CounterStore`] as
//! parameters, and a flush is a method anyone can drive ([`Engine::flush`]): `sluice serve`
//! calls it from a timer, tests and the simulator call it directly with a manual clock.
//!
//! ```
//! use std::sync::Arc;
//! use sluice_core::{Clock, ManualClock};
//! use sluice_engine::{Engine, EngineOptions};
//! use sluice_store::MemoryStore;
//!
//! let domain = sluice_config::parse_domain(std::path::Path::new("d.yaml"),
//!     "domain: d\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 2 }\n").unwrap();
//! let rules = sluice_config::RuleSet::new(vec![domain]).unwrap();
//! let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(1_700_000_000_000_000_000));
//! let store = Arc::new(MemoryStore::new(clock.clone()));
//! let engine = Engine::new(&rules, &Default::default(), store, clock, EngineOptions::default());
//! let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
//! let request = [[("user", "alice")]];
//! assert!(rt.block_on(engine.check("d", &request, 1)).unwrap().allowed);
//! assert!(rt.block_on(engine.check("d", &request, 1)).unwrap().allowed);
//! assert!(!rt.block_on(engine.check("d", &request, 1)).unwrap().allowed);
//! ```

mod descriptor_key;
mod engine;
mod exact;
mod fleet_part;
mod flush_loop;
mod flusher;
mod health;
mod lineage;
mod link;
mod local;
mod observe;
mod options;
mod rule;
mod synced;
mod table;
mod verdict;

pub use descriptor_key::{MAX_KEY_BYTES, write_digest};
pub use engine::{Engine, EngineError};
pub use exact::breaker::BreakerState;
pub use fleet_part::FleetPart;
pub use flush_loop::{EARLY_SYNC_DELAY, run_flush_loop};
pub use flusher::{FlushReport, FlushSummary, Spill, StateDir, StateError};
pub use lineage::{Lineage, ReloadSummary};
pub use observe::detailed::{DETAILED_VALUE_BYTES, DETAILED_VALUES};
pub use observe::heavy::{DecisionCounts, HEAVY_SAMPLE, HEAVY_SLOTS, display_key};
pub use observe::status::{EngineStatus, KeyReport, RuleReport, StoreStatus};
pub use observe::telemetry::{
    BuildInfo, DECISION_BUCKETS, FLUSH_BUCKETS, METRIC_FAMILIES, MetricFamily, MetricKind,
    describe_metrics,
};
pub use options::EngineOptions;
pub use synced::READ_AHEAD_MARGIN;
pub use synced::{FLEET_PART_FLOOR, SMALL_LIMIT_SHARES};
pub use verdict::{KeyInfo, Outcome, Reason, RuleStatus, Verdict};
