//! What the engine shows of itself: decision totals and heaviest keys per rule (`heavy.rs`),
//! per-value counts (`detailed.rs`), every metric family (`telemetry.rs`) and the status view
//! (`status.rs`).

pub(crate) mod detailed;
pub(crate) mod heavy;
pub(crate) mod status;
pub(crate) mod telemetry;
