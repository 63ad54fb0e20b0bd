//! The HTTP/JSON API for applications: acquire, refill, batch acquire.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use sluice_core::{Algorithm, Decision};
use sluice_engine::Outcome;

use crate::adhoc::{AdhocLimit, AdhocLimits};
use crate::error::{RequestError, check_entries, parse_json};
use crate::{SharedEngine, SharedOptions};

const MAX_AMOUNT: u64 = sluice_core::MAX_COST;
const MAX_BATCH: usize = 1000;

/// One more descriptor for `/v1/acquire` and `/v1/refill`, in `/json`'s shape
/// (`{"entries": [{"key": "item", "value": "reports"}]}`): decided with `[item, user]` in one
/// call, so a global or per-tenant limit applies next to the per-user one.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ApiDescriptor {
    /// Its entries, in order.
    pub entries: Vec<ApiEntry>,
}

/// One entry of an [`ApiDescriptor`].
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ApiEntry {
    /// Descriptor key.
    pub key: String,
    /// Descriptor value.
    pub value: String,
}

/// `POST /v1/acquire`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AcquireRequest {
    /// Who.
    pub user: String,
    /// What.
    pub item: String,
    /// How many tokens (default 1).
    #[serde(default)]
    pub amount: Option<u64>,
    /// A limit to use instead of the rules.
    #[serde(default)]
    pub limit: Option<AdhocLimit>,
    /// More descriptors decided together with `[item, user]` (rules only, not with `limit`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub descriptors: Vec<ApiDescriptor>,
}

/// The answer to an acquire. A denial is a normal answer (HTTP 200, `allowed: false`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct AcquireResponse {
    /// Whether the tokens were taken.
    pub allowed: bool,
    /// Tokens left (null when no rule limits the pair).
    pub remaining: Option<u64>,
    /// When denied: milliseconds until the same acquire can succeed (null if it never can).
    pub retry_after_ms: Option<u64>,
    /// Milliseconds until the quota is whole again.
    pub reset_after_ms: u64,
    /// Why an acquire that can never succeed is denied (the amount is more than the limit
    /// admits at once); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// `POST /v1/refill`: give back tokens acquired but not used.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RefillRequest {
    /// Who.
    pub user: String,
    /// What.
    pub item: String,
    /// How many tokens to give back.
    pub amount: u64,
    /// The ad-hoc limit the tokens were acquired under, if any.
    #[serde(default)]
    pub limit: Option<AdhocLimit>,
    /// The extra descriptors the tokens were acquired with, if any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub descriptors: Vec<ApiDescriptor>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchRequest {
    requests: Vec<serde_json::Value>,
}

pub(crate) struct ApiState {
    pub engine: SharedEngine,
    pub options: SharedOptions,
    adhoc: AdhocLimits,
}

impl ApiState {
    pub(crate) fn new(engine: SharedEngine, options: SharedOptions) -> Self {
        Self {
            engine,
            options,
            adhoc: AdhocLimits::new(),
        }
    }

    fn validate(&self, user: &str, item: &str, amount: u64) -> Result<(), RequestError> {
        for (field, v) in [("user", user), ("item", item)] {
            if v.is_empty() {
                return Err(RequestError::invalid(format!("`{field}` is empty")));
            }
            let max = self.options.load().max_value_len;
            if v.len() > max {
                return Err(RequestError::invalid(format!(
                    "`{field}` is {} bytes; at most {} are allowed",
                    v.len(),
                    max
                )));
            }
        }
        if amount == 0 || amount > MAX_AMOUNT {
            return Err(RequestError::invalid(format!(
                "`amount` must be between 1 and {MAX_AMOUNT}, found {amount}"
            )));
        }
        Ok(())
    }

    /// `[item, user]` and the request's extra descriptors, checked against the caps.
    fn descriptors<'r>(
        &self,
        user: &'r str,
        item: &'r str,
        extra: &'r [ApiDescriptor],
    ) -> Result<Vec<Vec<(&'r str, &'r str)>>, RequestError> {
        let options = self.options.load();
        if extra.len() + 1 > options.max_descriptors {
            return Err(RequestError::invalid(format!(
                "{} descriptors; at most {} are allowed besides [item, user]",
                extra.len(),
                options.max_descriptors - 1
            )));
        }
        let mut all = Vec::with_capacity(extra.len() + 1);
        all.push(vec![("item", item), ("user", user)]);
        for (i, d) in extra.iter().enumerate() {
            let entries: Vec<(&str, &str)> = d
                .entries
                .iter()
                .map(|e| (e.key.as_str(), e.value.as_str()))
                .collect();
            check_entries(&options, i, entries.iter().copied())?;
            all.push(entries);
        }
        Ok(all)
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<AcquireResponse, RequestError> {
        let amount = request.amount.unwrap_or(1);
        self.validate(&request.user, &request.item, amount)?;
        if let Some(limit) = &request.limit {
            if !request.descriptors.is_empty() {
                return Err(RequestError::invalid(
                    "`descriptors` apply the rules; they cannot be combined with an ad-hoc `limit`",
                ));
            }
            let shape = self.adhoc.limiter(limit)?;
            let key = adhoc_key(&request.user, &request.item);
            if let Some(decision) = shape.limiter().check_tracked(key.as_str(), amount) {
                return Ok(from_decision(decision));
            }
            // A new key: admitted within the key budget, then checked. An amount that can never
            // fit is answered without keeping the key.
            if amount <= shape.limiter().algorithm().capacity() {
                let max_keys = self.options.load().adhoc_max_keys;
                self.adhoc.admit_key(&shape, &key, max_keys);
            }
            return Ok(from_decision(shape.limiter().check(key.as_str(), amount)));
        }
        let descriptors = self.descriptors(&request.user, &request.item, &request.descriptors)?;
        let engine = self.engine.load_full();
        let verdict = engine
            .check(&self.options.load().api_domain, &descriptors, amount)
            .await?;
        let Some(s) = verdict.most_limiting() else {
            return Ok(AcquireResponse {
                allowed: verdict.allowed,
                remaining: None,
                retry_after_ms: None,
                reset_after_ms: 0,
                message: None,
            });
        };
        let never = verdict
            .statuses
            .iter()
            .find(|s| s.outcome == Outcome::CostExceedsLimit);
        Ok(AcquireResponse {
            allowed: verdict.allowed,
            remaining: Some(if verdict.allowed { s.remaining } else { 0 }),
            retry_after_ms: if verdict.allowed || never.is_some() {
                None
            } else {
                s.retry_after.map(millis)
            },
            reset_after_ms: millis(s.reset_after),
            message: never.map(|s| {
                let limit = s.limit.map_or_else(String::new, |(limit, window)| {
                    format!(
                        " ({limit} per {})",
                        sluice_core::format_duration(window)
                    )
                });
                format!(
                    "amount {amount} can never be acquired at once: it is more than rule `{}`{limit} admits; acquire less at a time or raise the limit",
                    s.rule_id
                )
            }),
        })
    }
}

/// `{len}:{user}{len}:{item}`: lengths first, so no two pairs share a key.
fn adhoc_key(user: &str, item: &str) -> String {
    let (mut u, mut i) = (itoa::Buffer::new(), itoa::Buffer::new());
    let (u, i) = (u.format(user.len()), i.format(item.len()));
    let mut key = String::with_capacity(u.len() + i.len() + user.len() + item.len() + 2);
    for part in [u, ":", user, i, ":", item] {
        key.push_str(part);
    }
    key
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn from_decision(d: Decision) -> AcquireResponse {
    let message = match d {
        Decision::InsufficientCapacity(c) => Some(format!(
            "amount {} can never be acquired at once: the limit admits at most {} at a time; acquire less at a time or raise the limit",
            c.cost, c.capacity
        )),
        _ => None,
    };
    AcquireResponse {
        message,
        allowed: d.is_allowed(),
        remaining: Some(d.remaining()),
        retry_after_ms: d.retry_after().map(millis),
        reset_after_ms: millis(d.reset_after()),
    }
}

/// `POST /v1/acquire`.
pub(crate) async fn acquire(
    State(state): State<Arc<ApiState>>,
    body: Bytes,
) -> Result<Json<AcquireResponse>, RequestError> {
    Ok(Json(acquire_answer(&state, &body).await?))
}

/// `POST /v1/acquire`'s answer to `body`, whichever way the request came in.
pub(crate) async fn acquire_answer(
    state: &ApiState,
    body: &[u8],
) -> Result<AcquireResponse, RequestError> {
    let request: AcquireRequest = parse_json(body)?;
    state.acquire(&request).await
}

/// `POST /v1/acquire/batch`: `{"requests": [acquire, ...]}` -> `{"results": [...]}`; a bad
/// entry gets `{"error": ...}` in its place and does not fail the others.
pub(crate) async fn acquire_batch(
    State(state): State<Arc<ApiState>>,
    body: Bytes,
) -> Result<Json<serde_json::Value>, RequestError> {
    let batch: BatchRequest = parse_json(&body)?;
    if batch.requests.len() > MAX_BATCH {
        return Err(RequestError::invalid(format!(
            "{} requests in one batch; at most {MAX_BATCH}",
            batch.requests.len()
        )));
    }
    let mut results = Vec::with_capacity(batch.requests.len());
    for (i, raw) in batch.requests.into_iter().enumerate() {
        let result = match serde_json::from_value::<AcquireRequest>(raw) {
            Ok(r) => state.acquire(&r).await,
            Err(e) => Err(RequestError::invalid(format!("requests[{i}]: {e}"))),
        };
        results.push(match result {
            Ok(r) => serde_json::to_value(r).unwrap_or_default(),
            Err(e) => serde_json::json!({ "error": e.to_string() }),
        });
    }
    Ok(Json(serde_json::json!({ "results": results })))
}

/// `POST /v1/refill`.
pub(crate) async fn refill(
    State(state): State<Arc<ApiState>>,
    body: Bytes,
) -> Result<Json<serde_json::Value>, RequestError> {
    let request: RefillRequest = parse_json(&body)?;
    state.validate(&request.user, &request.item, request.amount)?;
    let refilled = if let Some(limit) = &request.limit {
        if !request.descriptors.is_empty() {
            return Err(RequestError::invalid(
                "`descriptors` apply the rules; they cannot be combined with an ad-hoc `limit`",
            ));
        }
        let shape = state.adhoc.limiter(limit)?;
        let limiter = shape.limiter();
        let now = sluice_core::Clock::now(limiter.clock());
        usize::from(limiter.refill_at(
            adhoc_key(&request.user, &request.item).as_str(),
            now,
            request.amount,
        ))
    } else {
        let descriptors = state.descriptors(&request.user, &request.item, &request.descriptors)?;
        let engine = state.engine.load_full();
        let domain = &state.options.load().api_domain;
        let mut took = 0;
        for d in &descriptors {
            took += engine.refill(domain, d, request.amount)?;
        }
        took
    };
    Ok(Json(
        serde_json::json!({ "refilled": refilled > 0, "rules": refilled }),
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn adhoc_keys_lead_with_the_lengths() {
        assert_eq!(super::adhoc_key("alice", "reports"), "5:alice7:reports");
        assert_eq!(super::adhoc_key("a:1", ""), "3:a:10:");
        assert_ne!(super::adhoc_key("a", "1:b"), super::adhoc_key("a1", ":b"));
    }
}
