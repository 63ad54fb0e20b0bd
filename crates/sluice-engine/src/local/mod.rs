//! Decisions taken in this process alone: a `local` rule's keyed limiter (`limiter.rs`) and the
//! fixed-memory sketch that decides the keys beyond a rule's cap (`sketch.rs`).

pub(crate) mod limiter;
pub(crate) mod sketch;
