//! How `sluice serve` starts and stops: the state directory's spill from the last run, the
//! termination signals, and what is kept when the store cannot take the last counts.

use std::sync::Arc;

use sluice_engine::{Engine, FlushReport, Spill, StateDir};

/// Takes `state_dir`'s lock and hands the engine what the last run could not deliver.
pub(crate) fn open_state(
    lifecycle: &sluice_config::Lifecycle,
    engine: &Engine,
) -> Result<Option<Arc<StateDir>>, crate::ServerError> {
    let Some(dir) = &lifecycle.state_dir else {
        return Ok(None);
    };
    let state = Arc::new(StateDir::open(dir)?);
    if let Some(spill) = state.read_spill()? {
        tracing::info!(
            counts = spill.counts(),
            file = %state.spill_path().display(),
            "delivering the counts the last run could not, with the next flushes"
        );
        engine.replay(spill, state.clone());
    }
    Ok(Some(state))
}

/// After the final flush: what the store did not take goes to the state directory (or is
/// reported lost without one).
pub(crate) fn keep_spill(state: Option<&StateDir>, spill: &Spill, report: &FlushReport) {
    let counts = spill.counts();
    match state {
        Some(state) => match state.save(spill) {
            Ok(()) if counts > 0 => tracing::warn!(
                counts,
                file = %state.spill_path().display(),
                "counts the store did not take are kept for the next start to deliver"
            ),
            Ok(()) => {}
            Err(e) => tracing::error!(counts, error = %e, "counts the store did not take are lost"),
        },
        None if counts > 0 => tracing::error!(
            counts,
            "counts the store did not take are lost; set state_dir to keep them for the next start"
        ),
        None => {}
    }
    tracing::info!(
        items = report.items,
        failed = report.failed,
        "final flush done; bye"
    );
}

pub(crate) async fn wait_for_termination() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let term = async {
        match term.as_mut() {
            Some(t) => {
                t.recv().await;
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}
