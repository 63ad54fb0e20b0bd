//! The process's metrics recorder: Prometheus, installed once per process before anything
//! that counts is built.

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::error::{Result, ServerError};

/// The Prometheus recorder, with histograms (not summaries: buckets add up across instances)
/// and every family described and registered (see `sluice_engine::METRIC_FAMILIES`).
pub(crate) fn install() -> Result<PrometheusHandle> {
    use metrics_exporter_prometheus::Matcher;
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("sluice_flush_duration_seconds".into()),
            sluice_engine::FLUSH_BUCKETS,
        )
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full("sluice_decision_duration_seconds".into()),
                sluice_engine::DECISION_BUCKETS,
            )
        })
        .map_err(|source| ServerError::Metrics {
            what: "cannot set the metrics' histogram buckets",
            source,
        })?
        .install_recorder()
        .map_err(|source| ServerError::Metrics {
            what: "cannot install the metrics recorder",
            source,
        })?;
    sluice_engine::describe_metrics(crate::build_info::metric_labels());
    Ok(handle)
}
