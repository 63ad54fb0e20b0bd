//! Envoy ratelimit's `/json` endpoint: the gRPC request and response as JSON, for curl.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::google::protobuf::UInt64Value;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::api::ApiState;
use crate::error::{RequestError, parse_json};
use crate::grpc::decide;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct JsonRequest {
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, alias = "hits_addend")]
    hits_addend: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
    #[serde(default, alias = "hits_addend")]
    hits_addend: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    key: String,
    #[serde(default)]
    value: String,
}

fn code_name(code: i32) -> &'static str {
    Code::try_from(code).unwrap_or(Code::Unknown).as_str_name()
}

/// `POST /json` (Envoy ratelimit's shape, field names in protobuf JSON's lowerCamelCase).
pub(crate) async fn should_rate_limit(
    State(state): State<Arc<ApiState>>,
    body: Bytes,
) -> Result<(axum::http::StatusCode, Json<Value>), RequestError> {
    let (status, out) = answer(&state, &body).await?;
    Ok((status, Json(out)))
}

/// `POST /json`'s status and answer to `body`, whichever way the request came in.
pub(crate) async fn answer(
    state: &ApiState,
    body: &[u8],
) -> Result<(axum::http::StatusCode, Value), RequestError> {
    let request: JsonRequest = parse_json(body)?;
    let grpc = RateLimitRequest {
        domain: request.domain,
        descriptors: request
            .descriptors
            .into_iter()
            .map(|d| RateLimitDescriptor {
                entries: d
                    .entries
                    .into_iter()
                    .map(|e| Entry {
                        key: e.key,
                        value: e.value,
                    })
                    .collect(),
                hits_addend: d.hits_addend.map(|value| UInt64Value { value }),
                ..Default::default()
            })
            .collect(),
        hits_addend: request.hits_addend,
    };
    let response = decide(&state.engine, &state.options.load(), &grpc).await?;
    let statuses: Vec<Value> = response
        .statuses
        .iter()
        .map(|s| {
            let mut v = json!({ "code": code_name(s.code), "limitRemaining": s.limit_remaining });
            if let Some(limit) = &s.current_limit {
                v["currentLimit"] = json!({
                    "name": limit.name,
                    "requestsPerUnit": limit.requests_per_unit,
                    "unit": Unit::try_from(limit.unit).unwrap_or(Unit::Unknown).as_str_name(),
                });
            }
            if let Some(d) = &s.duration_until_reset {
                v["durationUntilReset"] = json!(proto_json_duration(d.seconds, d.nanos));
            }
            v
        })
        .collect();
    let mut out = json!({ "overallCode": code_name(response.overall_code), "statuses": statuses });
    if let Some(metadata) = &response.dynamic_metadata {
        out["dynamicMetadata"] = crate::metadata::to_json(metadata);
    }
    if !response.response_headers_to_add.is_empty() {
        out["responseHeadersToAdd"] = response
            .response_headers_to_add
            .iter()
            .map(|h| json!({ "key": h.key, "value": h.value }))
            .collect();
    }
    // As Envoy's ratelimit service: 429 when over the limit, 500 when the code is unknown.
    let status = match Code::try_from(response.overall_code) {
        Ok(Code::OverLimit) => axum::http::StatusCode::TOO_MANY_REQUESTS,
        Ok(Code::Ok) => axum::http::StatusCode::OK,
        _ => axum::http::StatusCode::INTERNAL_SERVER_ERROR,
    };
    Ok((status, out))
}

/// A protobuf `Duration` as protobuf's JSON mapping writes it: seconds with 0, 3, 6 or 9
/// fractional digits and an `s` (`"1s"`, `"0.250s"`). The whole seconds alone said `"0s"` while
/// a window still had most of a second to run.
fn proto_json_duration(seconds: i64, nanos: i32) -> String {
    // A time until a reset is never negative (it comes from a `std::time::Duration`).
    let (seconds, nanos) = (seconds.max(0), nanos.max(0));
    match nanos {
        0 => format!("{seconds}s"),
        n if n % 1_000_000 == 0 => format!("{seconds}.{:03}s", n / 1_000_000),
        n if n % 1_000 == 0 => format!("{seconds}.{:06}s", n / 1_000),
        n => format!("{seconds}.{n:09}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::proto_json_duration;

    #[test]
    fn durations_are_written_as_protobuf_json_writes_them() {
        assert_eq!(proto_json_duration(5, 0), "5s");
        assert_eq!(proto_json_duration(0, 250_000_000), "0.250s");
        assert_eq!(proto_json_duration(1, 500_000), "1.000500s");
        assert_eq!(proto_json_duration(0, 1), "0.000000001s");
        assert_eq!(proto_json_duration(59, 999_999_999), "59.999999999s");
    }
}
