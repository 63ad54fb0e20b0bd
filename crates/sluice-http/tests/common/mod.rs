//! What the layer and gateway tests share: an engine over a rule file of domain `edge`, on the
//! memory store and a manual clock.

use std::path::Path;
use std::sync::Arc;

use arc_swap::ArcSwap;
use sluice_core::{Clock, ManualClock};
use sluice_engine::{Engine, EngineOptions};
use sluice_store::MemoryStore;

/// An engine over the rule file `rules` with a manual clock and the memory store.
pub fn engine(rules: &str) -> Arc<ArcSwap<Engine>> {
    let domain = sluice_config::parse_domain(Path::new("edge.yaml"), rules).unwrap();
    let rules = sluice_config::RuleSet::new(vec![domain]).unwrap();
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(1_800_000_000_000_000_000));
    let engine = Engine::new(
        &rules,
        &Default::default(),
        Arc::new(MemoryStore::new(clock.clone())),
        clock,
        EngineOptions {
            shared_store: false,
            ..Default::default()
        },
    );
    Arc::new(ArcSwap::from_pointee(engine))
}
