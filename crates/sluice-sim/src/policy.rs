//! The policies a scenario can compare, by the names scenario files use.

/// The policies a scenario runs when it names none, in report order. Each is a rule's mode
/// and policy as `sluice.yaml` spells them, except `split`: `mode: local` with the limit
/// divided among the nodes (limit / `nodes.expected`), the static split one would configure
/// without a shared store.
pub const POLICIES: [&str; 5] = [
    "reactive",
    "predictive",
    "predictive_sliding",
    "exact",
    "split",
];

/// Every policy a scenario may name: [`POLICIES`], `predictive_share` (`predictive` with
/// `small_limits: share`: a limit too small to share is still shared, never decided at the
/// store), `local` (`mode: local` as written: every node allows the whole limit) and `rlqs`
/// (each node an Envoy enforcing the assignments of one Sluice, or of `rlqs.instances`, over
/// RLQS; see `rlqs.rs`).
pub const ALL_POLICIES: [&str; 8] = [
    "reactive",
    "predictive",
    "predictive_sliding",
    "predictive_share",
    "exact",
    "split",
    "local",
    "rlqs",
];
