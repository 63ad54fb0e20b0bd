//! For unit tests: an engine over a rule file, on the memory store and a manual clock.

use std::path::Path;
use std::sync::Arc;

use arc_swap::ArcSwap;
use sluice_core::{Clock, ManualClock};
use sluice_rls::SharedEngine;

/// An engine over the rule file `rules` (memory store, a manual clock at 60,000 s), and its
/// clock.
pub(crate) fn engine(rules: &str) -> (SharedEngine, Arc<dyn Clock>) {
    let rules = sluice_config::RuleSet::new(vec![
        sluice_config::parse_domain(Path::new("rules.yaml"), rules).unwrap(),
    ])
    .unwrap();
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(60_000_000_000_000));
    let store = Arc::new(sluice_store::MemoryStore::new(clock.clone()));
    let engine = sluice_engine::Engine::new(
        &rules,
        &Default::default(),
        store,
        clock.clone(),
        Default::default(),
    );
    (Arc::new(ArcSwap::from_pointee(engine)), clock)
}
