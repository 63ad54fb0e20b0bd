//! The `RateLimitQuotaService` gRPC service: one task per stream, bounded per peer, ended on
//! the server's stop signal.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use tokio::sync::{mpsc, watch};

use super::demand::DemandBook;
use super::limits::{PeerStreams, ReportPace, RlqsLimits, StreamSlot};
use super::replies::{RESPONSES_WAITING, Replies, Reply, StreamEnd};
use super::shared::Shared;
use super::stream::{QuotaStream, paced};
use super::wire::WireReport;
use crate::{SharedEngine, SharedOptions};

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

    /// Buckets the demand book holds now.
    pub fn tracked_buckets(&self) -> usize {
        self.shared.demand.len()
    }

    /// The largest report its streams take, in bytes.
    pub fn max_message_bytes(&self) -> usize {
        self.shared.limits.max_message_bytes
    }

    /// Opens a stream: its own task, or a refusal when the peer (or every peer together)
    /// holds its most streams, or the server is stopping.
    pub fn open(
        &self,
        request: tonic::Request<tonic::Streaming<WireReport>>,
    ) -> Result<tonic::Response<ResponseStream>, tonic::Status> {
        let shared = &self.shared;
        if *shared.stop.borrow() {
            return Err(tonic::Status::unavailable("sluice is shutting down"));
        }
        let peer = request.remote_addr().map(|a| a.ip());
        let slot = shared.peers.enter(peer, &shared.limits).map_err(|full| {
            metrics::counter!("sluice_rlqs_refused_total", "reason" => full.reason()).increment(1);
            tonic::Status::resource_exhausted(full.to_string())
        })?;
        metrics::counter!("sluice_rlqs_streams_total").increment(1);
        let (tx, rx) = mpsc::channel(RESPONSES_WAITING);
        let replies = Replies::new(tx, shared.limits.send_timeout, shared.stop.clone());
        tokio::spawn(run(shared.clone(), request.into_inner(), replies, slot));
        Ok(tonic::Response::new(ResponseStream(rx)))
    }
}

/// The responses of one stream.
#[derive(Debug)]
pub struct ResponseStream(mpsc::Receiver<Reply>);

impl tonic::codegen::tokio_stream::Stream for ResponseStream {
    type Item = Reply;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

/// Resolves when `stop` turns true (never, once its sender is gone without saying so).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    if stop.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Reads a stream's reports and answers them until the peer ends it, an error, a peer that
/// reads nothing for `send_timeout` or sends nothing for `idle_timeout`, or the stop signal.
async fn run(
    shared: Arc<Shared>,
    mut reports: tonic::Streaming<WireReport>,
    replies: Replies,
    _slot: StreamSlot,
) {
    let mut stream = QuotaStream::new(shared.next_id.fetch_add(1, Ordering::Relaxed));
    let mut stop = shared.stop.clone();
    let mut pace = ReportPace::new(shared.limits.usages_per_second);
    loop {
        let message = tokio::select! {
            biased;
            () = stopped(&mut stop) => break,
            m = tokio::time::timeout(shared.limits.idle_timeout, reports.message()) => match m {
                Ok(m) => m,
                Err(_) => {
                    // No report for this long (Envoy reports every 5 s): a stream held open on
                    // a connection kept busy by pings or other streams, taking a slot. Ended
                    // without an answer: it may read nothing either.
                    tracing::debug!("rlqs stream ended: no report within its idle timeout");
                    break;
                }
            },
        };
        let report = match message {
            Ok(Some(r)) => r,
            Ok(None) => break,
            Err(status) => {
                // A report over the size bound or not decodable; or the peer went away (then
                // no one reads this).
                tracing::debug!(%status, "rlqs stream ended on a read error");
                let _ = replies.send(Err(status)).await;
                break;
            }
        };
        // The report waits as its wire bytes (at most `max_message_bytes`), undecoded.
        if !paced(pace.take(report.len()), &mut stop).await {
            break;
        }
        match stream.answer(&shared, report, &replies).await {
            // Engine calls beyond the usual ones are paid before the next report is read.
            Ok(extra_calls) => {
                if !paced(pace.charge(extra_calls), &mut stop).await {
                    break;
                }
            }
            Err(StreamEnd::Gone) => break,
            Err(StreamEnd::Refused(status)) => {
                let _ = replies.send(Err(status)).await;
                break;
            }
        }
    }
    let (id, domain, keys) = stream.into_parts();
    if let Some(domain) = domain {
        let now = shared.engine.load().now();
        shared.demand.ended(&domain, id, keys, now);
    }
}
