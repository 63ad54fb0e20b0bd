//! One `StreamRateLimitQuotas` stream: its domain, its buckets and what it was last told.
//!
//! Each report is counted at once and answered with an action for each bucket it names whose
//! assignment, sized from the room left after counting the report (sizing.rs), changed
//! materially or is due for renewal before it lapses (renew.rs), and with an abandon when the
//! bucket's rule is gone (a reload removed it). A report whose buckets all keep their
//! assignments gets no answer.

use std::collections::HashMap;
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    self, AbandonAction, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::BucketId;
use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};
use sluice_engine::{Engine, EngineError};

use super::bucket::{Bucket, BucketKey};
use super::demand::{Answer, Asked, Reporter};
use super::renew::{self, Sent};
use super::replies::{Replies, StreamEnd};
use super::shared::Shared;
use super::sizing::{Assignment, Room};
use super::usage::{Recorded, record};
use super::wire::{WireReport, WireResponse};
use crate::error::RequestError;

/// One stream's state.
#[derive(Debug)]
pub struct QuotaStream {
    id: u64,
    domain: Option<String>,
    /// Each bucket's last assignment sent, and when.
    buckets: HashMap<BucketKey, Sent>,
    /// Usages of buckets beyond the stream's cap (logged once).
    overflowed: bool,
    /// Bucket ids refused (logged once).
    refused: bool,
}

/// Engine calls a usage usually takes (look, count, look): the pace counts one usage for
/// them, and each call beyond.
const USUAL_CALLS: u32 = 3;

/// The longest domain a stream may name: the stream keeps it and every usage looks it up, so
/// a megabyte of domain would cost a megabyte of hashing per usage.
const MAX_DOMAIN_BYTES: usize = 256;

impl QuotaStream {
    /// A new stream.
    pub fn new(id: u64) -> Self {
        Self {
            id,
            domain: None,
            buckets: HashMap::new(),
            overflowed: false,
            refused: false,
        }
    }

    /// Counts a report and answers it, in parts of at most `RESPONSE_PART_BYTES` of actions.
    /// Returns the engine calls it took beyond the usual three per usage, for the pace.
    pub async fn answer(
        &mut self,
        shared: &Shared,
        report: WireReport,
        replies: &Replies,
    ) -> Result<u64, StreamEnd> {
        // A report may name more buckets than the stream holds (an Envoy reports every bucket
        // it has, and anyone who reaches it makes buckets by sending new values): each is
        // counted and answered all the same. Ending the stream instead left the Envoy with no
        // assignment at all after a spray of 10,001 user ids, and its fallback then let every
        // request through. For the same reason a bucket id Sluice refuses is left alone and
        // the stream goes on. The report is held as its wire bytes (wire.rs), its usages
        // decoded one at a time; its cost is bounded by the pace of usages per second.
        let domain = self.domain_of(&report.domain)?;
        let engine = shared.engine.load_full();
        let options = shared.options.load();
        let mut part = WireResponse::default();
        let mut extra_calls = 0;
        for (i, usage) in report.usages().enumerate() {
            // Stopping: nothing more is counted (the last flush is near).
            if *shared.stop.borrow() {
                return Err(StreamEnd::Gone);
            }
            let usage = usage.map_err(|e| {
                tonic::Status::invalid_argument(format!("bucket_quota_usages[{i}]: {e}"))
            })?;
            let bucket = match usage
                .bucket_id
                .as_ref()
                .map(|id| Bucket::read(id, &options))
            {
                Some(Ok(bucket)) => bucket,
                Some(Err(why)) => {
                    self.refuse(&why.to_string());
                    continue;
                }
                None => {
                    self.refuse("a usage without a bucket id");
                    continue;
                }
            };
            let held = self.buckets.contains_key(&bucket.key)
                || self.buckets.len() < shared.limits.max_buckets_per_stream;
            if !held {
                self.overflow(shared);
            }
            let (action, calls) = self
                .bucket(shared, &engine, &domain, (bucket, held), &usage)
                .await?;
            extra_calls += u64::from(calls.saturating_sub(USUAL_CALLS));
            let Some(action) = action else {
                continue;
            };
            part.push(&action);
            if part.is_full() {
                replies.send(Ok(std::mem::take(&mut part))).await?;
            }
        }
        metrics::counter!("sluice_rlqs_reports_total").increment(1);
        if !part.is_empty() {
            replies.send(Ok(part)).await?;
        }
        Ok(extra_calls)
    }

    /// The stream's domain: the first report's; a later report may repeat it or leave it
    /// empty.
    fn domain_of(&mut self, sent: &str) -> Result<String, tonic::Status> {
        match &self.domain {
            None if sent.is_empty() => Err(tonic::Status::invalid_argument(
                "domain is empty; the first report must name the domain of a rule file",
            )),
            None if sent.len() > MAX_DOMAIN_BYTES => Err(tonic::Status::invalid_argument(format!(
                "domain is {} bytes; an RLQS stream's domain has at most {MAX_DOMAIN_BYTES}",
                sent.len()
            ))),
            None => {
                self.domain = Some(sent.to_owned());
                Ok(sent.to_owned())
            }
            Some(d) if sent.is_empty() || sent == d => Ok(d.clone()),
            Some(d) => Err(tonic::Status::invalid_argument(format!(
                "domain changed from `{d}` to `{sent}` within a stream; open a new stream"
            ))),
        }
    }

    fn overflow(&mut self, shared: &Shared) {
        metrics::counter!("sluice_rlqs_refused_total", "reason" => "buckets_per_stream")
            .increment(1);
        if !self.overflowed {
            self.overflowed = true;
            tracing::warn!(
                stream = self.id,
                max = shared.limits.max_buckets_per_stream,
                "rlqs stream holds its most buckets; new ones are counted and answered, not held"
            );
        }
    }

    /// A bucket id refused (`why`): neither counted nor answered, so Envoy keeps its
    /// `no_assignment_behavior` for that bucket alone.
    fn refuse(&mut self, why: &str) {
        metrics::counter!("sluice_rlqs_refused_total", "reason" => "bucket_id").increment(1);
        if !self.refused {
            self.refused = true;
            tracing::warn!(
                stream = self.id,
                why,
                "rlqs bucket id refused; the stream goes on"
            );
        }
    }

    /// Counts one bucket's usage and decides its action (`None`: Envoy keeps the one it has);
    /// a bucket the stream does not hold (`held` false: it holds its most) keeps no state, so
    /// it is never abandoned and always answered.
    async fn bucket(
        &mut self,
        shared: &Shared,
        engine: &Engine,
        domain: &str,
        (bucket, held): (Bucket, bool),
        usage: &BucketQuotaUsage,
    ) -> Result<(Option<BucketAction>, u32), tonic::Status> {
        let allowed = usage.num_requests_allowed;
        let key = bucket.key;
        let recorded = match record(engine, domain, &bucket.entries, allowed).await {
            Ok(r) => r,
            // A domain no rule file defines: nothing limits its buckets.
            Err(EngineError::UnknownDomain(_)) => Recorded {
                counted: 0,
                over: 0,
                uncounted: 0,
                room: None,
                calls: 1,
            },
            Err(e) => return Err(RequestError::from(e).into()),
        };
        metrics::counter!("sluice_rlqs_usage_total", "result" => "counted")
            .increment(recorded.counted);
        metrics::counter!("sluice_rlqs_usage_total", "result" => "over").increment(recorded.over);
        metrics::counter!("sluice_rlqs_usage_total", "result" => "uncounted")
            .increment(recorded.uncounted);
        let now = engine.now();
        let previous = if held {
            self.buckets.get(&key).copied()
        } else {
            None
        };
        // Other Sluice instances serve other Envoys from the same room: the room carries this
        // instance's part of it (`Engine::fleet_parts`), this stream's share is of this
        // instance's demand.
        let answer = match recorded.room {
            None => Answer {
                assignment: Assignment::AllowAll,
                send: renew::answer(previous, Assignment::AllowAll, now),
            },
            Some(room) => {
                let reporter = Reporter {
                    stream: self.id,
                    keep: held,
                    holds: previous,
                };
                self.assignment(shared, engine, (domain, &key), reporter, usage, room)
            }
        };
        let abandon = recorded.room.is_none()
            && previous.is_some_and(|p| p.assignment != Assignment::AllowAll);
        let sent = if abandon {
            Some(Assignment::AllowAll)
        } else {
            answer.send
        };
        tracing::debug!(
            stream = self.id, domain, bucket = ?bucket.entries, allowed,
            denied = usage.num_requests_denied, room = ?recorded.room,
            assignment = ?answer.assignment, ?sent, "rlqs assignment"
        );
        if abandon {
            self.buckets.remove(&key);
        } else if let (true, Some(assignment)) = (held, sent) {
            self.buckets.insert(
                key.clone(),
                Sent {
                    assignment,
                    at: now,
                },
            );
        }
        if recorded.room.is_none() {
            // No longer limited (or abandoned): no demand to share.
            shared
                .demand
                .forget(domain, self.id, std::iter::once(key.clone()));
        }
        let strategy = match (abandon, sent) {
            (true, _) => "abandon",
            (false, None) => "unchanged",
            (false, Some(assignment)) => strategy_name(assignment),
        };
        metrics::counter!("sluice_rlqs_assignments_total", "strategy" => strategy).increment(1);
        let action = sent.map(|a| action(usage.bucket_id.clone(), a, abandon));
        Ok((action, recorded.calls))
    }

    /// This stream's answer: its share of the bucket's demand on this instance, of what the
    /// other streams have not claimed of `room`.
    fn assignment(
        &self,
        shared: &Shared,
        engine: &Engine,
        bucket: (&str, &BucketKey),
        reporter: Reporter,
        usage: &BucketQuotaUsage,
        room: Room,
    ) -> Answer {
        let elapsed = usage.time_elapsed.map_or(0.0, |d| {
            d.seconds.max(0) as f64 + f64::from(d.nanos.max(0)) / 1e9
        });
        let asked = Asked::per_second(
            usage.num_requests_allowed,
            usage.num_requests_denied,
            elapsed,
            room,
        );
        shared.demand.assignment(
            bucket,
            reporter,
            (asked, room),
            engine.now(),
            shared.peers.total(),
        )
    }

    /// The stream's id and its buckets, for forgetting its demands when it ends.
    pub fn into_parts(self) -> (u64, Option<String>, impl Iterator<Item = BucketKey>) {
        (self.id, self.domain, self.buckets.into_keys())
    }
}

fn strategy_name(a: Assignment) -> &'static str {
    match a {
        Assignment::AllowAll => "allow_all",
        Assignment::DenyAll { .. } => "deny_all",
        Assignment::TokenBucket { .. } => "token_bucket",
    }
}

fn pb_duration(d: Duration) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

/// The wire form of an assignment (or of an abandon).
pub fn action(id: Option<BucketId>, assignment: Assignment, abandon: bool) -> BucketAction {
    let strategy = match assignment {
        Assignment::AllowAll => Strategy::BlanketRule(BlanketRule::AllowAll as i32),
        Assignment::DenyAll { .. } => Strategy::BlanketRule(BlanketRule::DenyAll as i32),
        Assignment::TokenBucket {
            max_tokens,
            tokens_per_fill,
            fill_interval_secs,
            ..
        } => Strategy::TokenBucket(TokenBucket {
            max_tokens,
            tokens_per_fill: Some(UInt32Value {
                value: tokens_per_fill,
            }),
            fill_interval: Some(pb_duration(Duration::from_secs(fill_interval_secs))),
        }),
    };
    let what = if abandon {
        bucket_action::BucketAction::AbandonAction(AbandonAction {})
    } else {
        bucket_action::BucketAction::QuotaAssignmentAction(QuotaAssignmentAction {
            assignment_time_to_live: Some(pb_duration(assignment.ttl())),
            rate_limit_strategy: Some(RateLimitStrategy {
                strategy: Some(strategy),
            }),
        })
    };
    BucketAction {
        bucket_id: id,
        bucket_action: Some(what),
    }
}

/// Waits `wait` unless the stream must stop first (returns false then).
pub async fn paced(wait: Duration, stop: &mut tokio::sync::watch::Receiver<bool>) -> bool {
    if wait.is_zero() {
        return true;
    }
    tokio::select! {
        () = tokio::time::sleep(wait) => true,
        _ = stop.wait_for(|s| *s) => false,
    }
}
