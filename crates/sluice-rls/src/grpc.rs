//! The Envoy RLS v3 gRPC service.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use prost::Message as _;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use sluice_engine::{Outcome, RuleStatus, Verdict};

use crate::error::{RequestError, check_entries};
use crate::{RlsOptions, SharedEngine, SharedOptions};

/// `ShouldRateLimit` over the engine.
#[derive(Clone)]
pub struct RateLimitGrpc {
    engine: SharedEngine,
    options: SharedOptions,
    answers: Arc<Answers>,
}

/// `sluice_requests_total{door="grpc"}` by result, looked up once rather than per call (a
/// registry lookup per call was 2.5% of the gRPC listener's time).
struct Answers {
    ok: metrics::Counter,
    over_limit: metrics::Counter,
    client_error: metrics::Counter,
}

impl Answers {
    fn new() -> Self {
        let count = |result: &'static str| metrics::counter!("sluice_requests_total", "door" => "grpc", "result" => result);
        Self {
            ok: count("ok"),
            over_limit: count("over_limit"),
            client_error: count("client_error"),
        }
    }
}

impl RateLimitGrpc {
    /// The service's handler, for calling `should_rate_limit` without a transport.
    pub fn new(engine: SharedEngine, options: RlsOptions) -> Self {
        Self::shared(engine, Arc::new(arc_swap::ArcSwap::from_pointee(options)))
    }

    /// The handler with options the caller may swap while it serves. Its answers are counted
    /// by the metrics recorder installed when it is made.
    pub fn shared(engine: SharedEngine, options: SharedOptions) -> Self {
        Self {
            engine,
            options,
            answers: Arc::new(Answers::new()),
        }
    }
}

/// The gRPC service, ready for `tonic::transport::Server::add_service`.
pub fn grpc_service(
    engine: SharedEngine,
    options: RlsOptions,
) -> RateLimitServiceServer<RateLimitGrpc> {
    RateLimitServiceServer::new(RateLimitGrpc::new(engine, options))
}

/// [`grpc_service`] with options the caller may swap while it serves.
pub fn grpc_service_shared(
    engine: SharedEngine,
    options: SharedOptions,
) -> RateLimitServiceServer<RateLimitGrpc> {
    RateLimitServiceServer::new(RateLimitGrpc::shared(engine, options))
}

#[tonic::async_trait]
impl RateLimitService for RateLimitGrpc {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        Ok(tonic::Response::new(
            self.answer(request.into_inner()).await?,
        ))
    }
}

/// The path of `ShouldRateLimit` on the wire.
pub const SHOULD_RATE_LIMIT_PATH: &str =
    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

impl RateLimitGrpc {
    /// The answer to one request, counted in `sluice_requests_total`.
    async fn answer(&self, request: RateLimitRequest) -> Result<RateLimitResponse, tonic::Status> {
        tracing::debug!(?request, "ShouldRateLimit");
        let answer = decide(&self.engine, &self.options.load(), &request).await;
        let counter = match &answer {
            Ok(r) if r.overall_code == Code::OverLimit as i32 => &self.answers.over_limit,
            Ok(_) => &self.answers.ok,
            // Every refusal of `decide` is about the request (unknown domain, bad cost, ...).
            Err(_) => &self.answers.client_error,
        };
        counter.increment(1);
        Ok(answer?)
    }

    /// `ShouldRateLimit` for a request message already read (its protobuf bytes, without the
    /// 5-byte gRPC prefix): the answer as a whole gRPC message (prefix included), or the
    /// status, as the service answers through tonic.
    pub async fn answer_message(&self, message: &[u8]) -> Result<Bytes, tonic::Status> {
        let request = RateLimitRequest::decode(message)
            .map_err(|e| tonic::Status::internal(e.to_string()))?;
        let response = self.answer(request).await?;
        let len = response.encoded_len();
        let prefix = u32::try_from(len)
            .map_err(|_| tonic::Status::internal("the answer is too large for one message"))?;
        let mut framed = Vec::with_capacity(5 + len);
        framed.push(0);
        framed.extend_from_slice(&prefix.to_be_bytes());
        response
            .encode(&mut framed)
            .map_err(|e| tonic::Status::internal(e.to_string()))?;
        Ok(Bytes::from(framed))
    }
}

/// Decides an Envoy rate-limit request (shared by gRPC and `/json`).
pub(crate) async fn decide(
    engine: &SharedEngine,
    options: &RlsOptions,
    request: &RateLimitRequest,
) -> Result<RateLimitResponse, RequestError> {
    if request.domain.is_empty() {
        return Err(RequestError::invalid(
            "domain is empty; send the domain of a rule file",
        ));
    }
    if request.descriptors.is_empty() {
        return Err(RequestError::invalid(
            "descriptors is empty; send at least one descriptor",
        ));
    }
    if request.descriptors.len() > options.max_descriptors {
        return Err(RequestError::invalid(format!(
            "{} descriptors; at most {} are allowed",
            request.descriptors.len(),
            options.max_descriptors
        )));
    }
    let descriptors: Vec<Vec<(&str, &str)>> = request
        .descriptors
        .iter()
        .map(|d| {
            d.entries
                .iter()
                .map(|e| (e.key.as_str(), e.value.as_str()))
                .collect()
        })
        .collect();
    for (i, d) in descriptors.iter().enumerate() {
        check_entries(options, i, d.iter().copied())?;
    }
    if let Some(i) = request.descriptors.iter().position(|d| d.is_negative_hits) {
        return Err(RequestError::invalid(format!(
            "descriptors[{i}].is_negative_hits is not supported; give tokens back with POST /v1/refill"
        )));
    }
    // As Envoy's ratelimit service: the request's hits_addend 0 means 1 (proto3 cannot tell it
    // from unset); a descriptor's own hits_addend overrides it, and there 0 is a look that
    // counts nothing and answers OVER_LIMIT when the key has no room for one more request
    // (the engine's cost 0), so no spelling of 0 lets a key over its limit through.
    let default_cost = u64::from(request.hits_addend.max(1));
    let costs: Vec<u64> = request
        .descriptors
        .iter()
        .map(|d| d.hits_addend.as_ref().map_or(default_cost, |h| h.value))
        .collect();
    let engine = engine.load_full();
    let verdict = engine
        .check_each(&request.domain, &descriptors, &costs)
        .await?;
    let mut answer = response(&verdict, descriptors.len(), options.response_headers);
    answer.dynamic_metadata =
        crate::metadata::dynamic_metadata(&request.domain, &descriptors, &verdict);
    Ok(answer)
}

fn unit_of(window: Duration) -> Unit {
    match window.as_secs() {
        _ if window.subsec_nanos() != 0 => Unit::Unknown,
        1 => Unit::Second,
        60 => Unit::Minute,
        3600 => Unit::Hour,
        86_400 => Unit::Day,
        604_800 => Unit::Week,
        2_592_000 => Unit::Month,
        31_536_000 => Unit::Year,
        _ => Unit::Unknown,
    }
}

fn pb_duration(d: Duration) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: d.subsec_nanos() as i32,
    }
}

/// The status that speaks for descriptor `i`: a denying rule (longest retry) or else the
/// rule with the least quota left. Shadow-mode rules report OK.
fn descriptor_status<'a>(verdict: &'a Verdict<'_>, i: usize) -> Option<&'a RuleStatus<'a>> {
    let mine = || verdict.statuses.iter().filter(move |s| s.descriptor == i);
    mine()
        .filter(|s| matches!(s.outcome, Outcome::Denied | Outcome::CostExceedsLimit))
        .max_by_key(|s| s.retry_after)
        .or_else(|| {
            mine()
                .filter(|s| s.limit.is_some())
                .min_by_key(|s| s.remaining)
        })
        .or_else(|| mine().next())
}

pub(crate) fn response(
    verdict: &Verdict<'_>,
    descriptors: usize,
    headers: bool,
) -> RateLimitResponse {
    let statuses: Vec<DescriptorStatus> = (0..descriptors)
        .map(|i| match descriptor_status(verdict, i) {
            None => DescriptorStatus {
                code: Code::Ok as i32,
                ..Default::default()
            },
            Some(s) => {
                let over = matches!(s.outcome, Outcome::Denied | Outcome::CostExceedsLimit);
                DescriptorStatus {
                    code: if over { Code::OverLimit } else { Code::Ok } as i32,
                    current_limit: s.limit.map(|(limit, window)| RateLimit {
                        name: s.name.unwrap_or(s.rule_id).to_owned(),
                        requests_per_unit: u32::try_from(limit).unwrap_or(u32::MAX),
                        unit: unit_of(window) as i32,
                    }),
                    limit_remaining: u32::try_from(s.remaining).unwrap_or(u32::MAX),
                    duration_until_reset: s.limit.map(|_| pb_duration(s.reset_after)),
                    ..Default::default()
                }
            }
        })
        .collect();
    let mut response = RateLimitResponse {
        overall_code: if verdict.allowed {
            Code::Ok
        } else {
            Code::OverLimit
        } as i32,
        statuses,
        ..Default::default()
    };
    if headers
        && let Some(s) = verdict.most_limiting()
        && let Some((limit, window)) = s.limit
    {
        let header = |key: &str, value: String| HeaderValue {
            key: key.to_owned(),
            value,
            ..Default::default()
        };
        response.response_headers_to_add = vec![
            header(
                "x-ratelimit-limit",
                format!("{limit}, {limit};w={}", window.as_secs().max(1)),
            ),
            header("x-ratelimit-remaining", s.remaining.to_string()),
            header("x-ratelimit-reset", s.reset_after.as_secs().to_string()),
        ];
    }
    response
}
