//! What the RLQS stream tests share: a server in the test's process over a rule file, a
//! tonic client, reports and the answers' actions.

#![allow(dead_code, unused_imports)]

use std::collections::HashMap;
use std::net::SocketAddr;
pub use std::sync::Arc;
pub use std::time::Duration;

pub use arc_swap::ArcSwap;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
pub use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
pub use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
pub use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
pub use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::google::protobuf::Duration as PbDuration;
pub use sluice_rls::rlqs::{RateLimitQuotaGrpc, RlqsLimits, RlqsServer};
pub use sluice_rls::{RateLimitGrpc, RlsOptions, SharedEngine};
pub use tokio::sync::{mpsc, watch};
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;

pub const RULES: &str = "domain: d
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 100 }
";

pub type Outbox = mpsc::Sender<RateLimitQuotaUsageReports>;
pub type Inbox = tonic::Streaming<RateLimitQuotaResponse>;

pub struct Server {
    pub addr: SocketAddr,
    pub engine: SharedEngine,
    pub stop: watch::Sender<bool>,
    pub handler: RateLimitQuotaGrpc,
}

impl Server {
    /// Waits until at most `n` streams are open; panics naming `what` after `within`.
    pub async fn wait_for_open_streams(&self, n: usize, within: Duration, what: &str) {
        let fallen = async {
            while self.handler.open_streams() > n {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(within, fallen)
            .await
            .unwrap_or_else(|_| panic!("{what} within {within:?}"));
    }
}

pub async fn server(limits: RlqsLimits) -> Server {
    server_with(RULES, limits).await
}

pub async fn server_with(rules: &str, limits: RlqsLimits) -> Server {
    server_on(crate::common::engine(rules), limits).await
}

/// An RLQS server in the test's process over `engine`.
pub async fn server_on(engine: SharedEngine, limits: RlqsLimits) -> Server {
    let options = Arc::new(ArcSwap::from_pointee(RlsOptions::default()));
    let (stop, stop_rx) = watch::channel(false);
    let handler = RateLimitQuotaGrpc::new(engine.clone(), options, limits, stop_rx);
    let service = RlqsServer::new(handler.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    Server {
        addr,
        engine,
        stop,
        handler,
    }
}

pub async fn open(addr: SocketAddr) -> Result<(Outbox, Inbox), tonic::Status> {
    let mut client = RateLimitQuotaServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let (tx, rx) = mpsc::channel(4096);
    let inbox = client
        .stream_rate_limit_quotas(ReceiverStream::new(rx))
        .await?
        .into_inner();
    Ok((tx, inbox))
}

pub fn bucket(entries: &[(&str, &str)]) -> BucketId {
    BucketId {
        bucket: entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    }
}

/// The `n`th of a series of distinct bucket ids, each of 32 entries of 1 KiB.
pub fn large_bucket(n: usize) -> BucketId {
    BucketId {
        bucket: (0..32)
            .map(|i| (format!("k{i:02}"), format!("{n}-{}", "x".repeat(1000))))
            .collect(),
    }
}

pub fn usage(id: BucketId, allowed: u64, denied: u64) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(id),
        time_elapsed: Some(PbDuration {
            seconds: 5,
            nanos: 0,
        }),
        num_requests_allowed: allowed,
        num_requests_denied: denied,
    }
}

pub fn report(domain: &str, usages: Vec<BucketQuotaUsage>) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: domain.to_owned(),
        bucket_quota_usages: usages,
    }
}

pub async fn next(inbox: &mut Inbox) -> RateLimitQuotaResponse {
    tokio::time::timeout(Duration::from_secs(10), inbox.message())
        .await
        .expect("an answer within 10 s")
        .expect("a message")
        .expect("the stream open")
}

/// A bucket id as one string, `k=v` sorted (`BucketId` holds a map: no `Hash`).
pub fn name(id: &BucketId) -> String {
    let mut entries: Vec<String> = id.bucket.iter().map(|(k, v)| format!("{k}={v}")).collect();
    entries.sort();
    entries.join(",")
}

/// Each answered bucket's strategy (`None`: abandoned) and TTL in seconds, by [`name`].
pub fn actions(response: &RateLimitQuotaResponse) -> HashMap<String, (Option<Strategy>, i64)> {
    response
        .bucket_action
        .iter()
        .map(|a| {
            let id = name(a.bucket_id.as_ref().unwrap());
            match a.bucket_action.unwrap() {
                Action::QuotaAssignmentAction(q) => (
                    id,
                    (
                        q.rate_limit_strategy.unwrap().strategy,
                        q.assignment_time_to_live.unwrap().seconds,
                    ),
                ),
                Action::AbandonAction(_) => (id, (None, 0)),
            }
        })
        .collect()
}

pub async fn rls_code(engine: &SharedEngine, user: &str) -> Code {
    rls_code_of(engine, "user", user).await
}

pub async fn rls_code_of(engine: &SharedEngine, key: &str, value: &str) -> Code {
    let rls = RateLimitGrpc::new(engine.clone(), RlsOptions::default());
    let request = RateLimitRequest {
        domain: "d".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: key.to_owned(),
                value: value.to_owned(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    };
    let response = rls.should_rate_limit(tonic::Request::new(request)).await;
    Code::try_from(response.unwrap().into_inner().overall_code).unwrap()
}

/// A token bucket's most admissions over one 5 s report interval.
pub fn per_interval(strategy: Option<Strategy>) -> f64 {
    let Some(Strategy::TokenBucket(b)) = strategy else {
        panic!("expected a token bucket, got {strategy:?}");
    };
    f64::from(b.max_tokens)
        + f64::from(b.tokens_per_fill.unwrap().value) / b.fill_interval.unwrap().seconds as f64
            * 5.0
}
