//! The `RateLimitQuotaService` gRPC service: one task per stream, bounded per peer, ended on
//! the server's stop signal.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::{
    RateLimitQuotaService, RateLimitQuotaServiceServer,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use tokio::sync::{mpsc, watch};

use super::demand::DemandBook;
use super::limits::{PeerStreams, ReportPace, RlqsLimits, StreamSlot};
use super::shared::Shared;
use super::stream::{QuotaStream, paced};
use crate::{SharedEngine, SharedOptions};

/// Responses a stream may have waiting for its peer to read them.
const RESPONSES_WAITING: usize = 2;

/// `StreamRateLimitQuotas` over the engine.
#[derive(Clone)]
pub struct RateLimitQuotaGrpc {
    shared: Arc<Shared>,
}

impl RateLimitQuotaGrpc {
    /// The handler. Its streams end (cleanly, status OK) when `stop` turns true.
    pub fn new(
        engine: SharedEngine,
        options: SharedOptions,
        limits: RlqsLimits,
        stop: watch::Receiver<bool>,
    ) -> Self {
        let demand = DemandBook::new(limits.max_tracked_buckets);
        Self {
            shared: Arc::new(Shared {
                engine,
                options,
                limits,
                peers: Arc::new(PeerStreams::default()),
                demand,
                stop,
                next_id: AtomicU64::new(1),
            }),
        }
    }

    /// Streams open now.
    pub fn open_streams(&self) -> usize {
        self.shared.peers.total()
    }
}

/// The RLQS gRPC service, ready for `tonic::transport::Server::add_service`, its messages
/// bounded by `limits.max_message_bytes`.
pub fn rlqs_service(
    engine: SharedEngine,
    options: SharedOptions,
    limits: RlqsLimits,
    stop: watch::Receiver<bool>,
) -> RateLimitQuotaServiceServer<RateLimitQuotaGrpc> {
    let max = limits.max_message_bytes;
    RateLimitQuotaServiceServer::new(RateLimitQuotaGrpc::new(engine, options, limits, stop))
        .max_decoding_message_size(max)
}

/// The responses of one stream.
#[derive(Debug)]
pub struct ResponseStream(mpsc::Receiver<Result<RateLimitQuotaResponse, tonic::Status>>);

impl tonic::codegen::tokio_stream::Stream for ResponseStream {
    type Item = Result<RateLimitQuotaResponse, tonic::Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

#[tonic::async_trait]
impl RateLimitQuotaService for RateLimitQuotaGrpc {
    type StreamRateLimitQuotasStream = ResponseStream;

    async fn stream_rate_limit_quotas(
        &self,
        request: tonic::Request<tonic::Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<tonic::Response<ResponseStream>, tonic::Status> {
        let shared = &self.shared;
        if *shared.stop.borrow() {
            return Err(tonic::Status::unavailable("sluice is shutting down"));
        }
        let peer = request.remote_addr().map(|a| a.ip());
        let max = shared.limits.max_streams_per_peer;
        let Some(slot) = shared.peers.enter(peer, max) else {
            metrics::counter!("sluice_rlqs_refused_total", "reason" => "streams_per_peer")
                .increment(1);
            return Err(tonic::Status::resource_exhausted(format!(
                "this peer holds {max} rate limit quota streams already"
            )));
        };
        let (tx, rx) = mpsc::channel(RESPONSES_WAITING);
        tokio::spawn(run(shared.clone(), request.into_inner(), tx, slot));
        Ok(tonic::Response::new(ResponseStream(rx)))
    }
}

/// Resolves when `stop` turns true (never, once its sender is gone without saying so).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    if stop.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Reads a stream's reports and answers them until the peer ends it, an error, a peer that
/// reads nothing for `send_timeout`, or the stop signal.
async fn run(
    shared: Arc<Shared>,
    mut reports: tonic::Streaming<RateLimitQuotaUsageReports>,
    tx: mpsc::Sender<Result<RateLimitQuotaResponse, tonic::Status>>,
    _slot: StreamSlot,
) {
    let mut stream = QuotaStream::new(shared.next_id.fetch_add(1, Ordering::Relaxed));
    let mut stop = shared.stop.clone();
    let mut pace = ReportPace::new(shared.limits.usages_per_second);
    loop {
        let message = tokio::select! {
            biased;
            () = stopped(&mut stop) => break,
            m = reports.message() => m,
        };
        let report = match message {
            Ok(Some(r)) => r,
            Ok(None) => break,
            Err(status) => {
                tracing::debug!(%status, "rlqs stream ended by its peer");
                break;
            }
        };
        if !paced(pace.take(report.bucket_quota_usages.len()), &mut stop).await {
            break;
        }
        let item = match stream.answer(&shared, report).await {
            Ok(None) => continue,
            Ok(Some(response)) => Ok(response),
            Err(status) => Err(status),
        };
        let last = item.is_err();
        match tokio::time::timeout(shared.limits.send_timeout, tx.send(item)).await {
            Ok(Ok(())) if !last => {}
            Ok(_) => break,
            Err(_) => {
                metrics::counter!("sluice_rlqs_refused_total", "reason" => "send_timeout")
                    .increment(1);
                tracing::warn!("rlqs stream's peer reads no responses; stream ended");
                break;
            }
        }
    }
    let (id, domain, keys) = stream.into_parts();
    if let Some(domain) = domain {
        shared.demand.forget(&domain, id, keys);
    }
}
