//! What the engine's benches share.

/// Runs a future that must not wait: a check, or a flush to a store that answers at once.
pub fn now_or_never<F: std::future::Future>(f: F) -> F::Output {
    futures_util::FutureExt::now_or_never(f).expect("the future waited")
}
