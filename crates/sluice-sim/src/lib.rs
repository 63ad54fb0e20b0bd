//! The Sluice simulator: runs the real engine (`sluice-engine`, the same
//! code `sluice serve` runs) on many simulated nodes with manual clocks and the memory store,
//! on generated traffic, for several policies side by side, and reports how accurately each
//! enforces the limit.
//!
//! ```
//! let scenario = sluice_sim::Scenario::parse("s.yaml", "
//! duration_s: 120
//! seed: 7
//! rule: { limit: 100, window_s: 60 }
//! nodes: { count: 3 }
//! traffic:
//!   - steady: { rate: 4 }
//! policies: [predictive, exact]
//! ").unwrap();
//! let report = sluice_sim::run(&scenario);
//! assert_eq!(report.policies[1].over_max_pct, 0.0); // exact never over-admits
//! ```

pub mod classes;
mod envoy;
mod fleet;
mod plot;
mod policy;
mod report;
mod rlqs;
mod run;
mod scenario;
pub mod seeds;
mod tally;
mod traffic;

pub use plot::write_plots;
pub use policy::{ALL_POLICIES, POLICIES};
pub use report::{EstimateSample, PolicyReport, Report};
pub use run::{rule_file, run, run_with_progress};
pub use scenario::{
    Latency, NodeSpec, RlqsSpec, RuleSpec, Scenario, ScenarioError, StoreSpec, Traffic,
};
pub use traffic::{Request, requests};
