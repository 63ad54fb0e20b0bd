//! The gRPC plumbing of `StreamRateLimitQuotas`: the generated server decodes every report
//! whole into structs, so this one, written like it, reads reports as [`WireReport`] and
//! writes answers as [`WireResponse`] (wire.rs); the bytes on the wire are the same.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::codegen::{Body, BoxFuture, StdError, http};
use tonic::server::{Grpc, NamedService, StreamingService};

use tokio::sync::watch;

use super::limits::RlqsLimits;
use super::service::{RateLimitQuotaGrpc, ResponseStream};
use super::wire::{WireReport, WireResponse};
use crate::{SharedEngine, SharedOptions};

/// The one method's path.
const METHOD: &str =
    "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas";

/// The RLQS gRPC service, ready for `tonic::transport::Server::add_service`; reports larger
/// than `max_message_bytes` end their stream (`OUT_OF_RANGE`).
#[derive(Clone)]
pub struct RlqsServer {
    handler: Arc<RateLimitQuotaGrpc>,
    max_message_bytes: usize,
}

impl RlqsServer {
    /// The service over `handler`.
    pub fn new(handler: RateLimitQuotaGrpc) -> Self {
        Self {
            max_message_bytes: handler.max_message_bytes(),
            handler: Arc::new(handler),
        }
    }
}

/// The RLQS gRPC service over the engine, ready for `tonic::transport::Server::add_service`,
/// its reports bounded by `limits.max_message_bytes`.
pub fn rlqs_service(
    engine: SharedEngine,
    options: SharedOptions,
    limits: RlqsLimits,
    stop: watch::Receiver<bool>,
) -> RlqsServer {
    RlqsServer::new(RateLimitQuotaGrpc::new(engine, options, limits, stop))
}

impl NamedService for RlqsServer {
    const NAME: &'static str = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService";
}

struct Method(Arc<RateLimitQuotaGrpc>);

impl StreamingService<WireReport> for Method {
    type Response = WireResponse;
    type ResponseStream = ResponseStream;
    type Future = BoxFuture<tonic::Response<ResponseStream>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<tonic::Streaming<WireReport>>) -> Self::Future {
        let handler = self.0.clone();
        Box::pin(async move { handler.open(request) })
    }
}

impl<B> tonic::codegen::Service<http::Request<B>> for RlqsServer
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != METHOD {
            return Box::pin(async { Ok(tonic::Status::unimplemented("").into_http()) });
        }
        let method = Method(self.handler.clone());
        let max = self.max_message_bytes;
        Box::pin(async move {
            let codec = tonic_prost::ProstCodec::<WireResponse, WireReport>::default();
            let mut grpc = Grpc::new(codec).apply_max_message_size_config(Some(max), None);
            Ok(grpc.streaming(method, request).await)
        })
    }
}
