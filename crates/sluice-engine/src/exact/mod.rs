//! Decisions taken at the store: `exact` mode and the calls a synced rule with a small limit
//! makes (`decisions.rs`), under the store's circuit breaker (`breaker.rs`).

pub(crate) mod breaker;
pub(crate) mod decisions;
