//! Envoy's Rate Limit Quota Service (RLQS, `envoy.service.rate_limit_quota.v3`): Envoy's
//! `rate_limit_quota` filter enforces assignments locally and reports usage on one stream,
//! with no call per request (docs/RLQS.md).
//!
//! - `bucket.rs`: a bucket id as a descriptor (entries sorted by key) and a bounded key;
//! - `usage.rs`: reports counted by the engine, and the room left;
//! - `demand.rs`: each stream's demand per bucket, the shares;
//! - `sizing.rs`: the assignment (token bucket, blanket rule) from the room and the share;
//! - `renew.rs`: which assignments an answer carries (changed materially, or soon to lapse);
//! - `stream.rs`: one stream's state and answers;
//! - `limits.rs`: the door's bounds;
//! - `shared.rs`: what every stream of the service shares;
//! - `wire.rs`: reports kept as wire bytes, answers written as wire bytes;
//! - `replies.rs`: a stream's queue of answers;
//! - `service.rs`: the streams' handler, a task per stream;
//! - `server.rs`: the gRPC service over the handler.

mod bucket;
mod carry;
mod demand;
mod limits;
mod renew;
mod replies;
mod server;
mod service;
mod shared;
mod sizing;
mod stream;
mod usage;
mod wire;

pub use bucket::{Bucket, BucketKey, Refused};
pub use demand::{Answer, Asked, DemandBook, Reporter};
pub use limits::RlqsLimits;
pub use renew::{MATERIAL, MATERIAL_FALL, RENEW_WITHIN, Sent, answer};
pub use server::{RlqsServer, rlqs_service};
pub use service::{RateLimitQuotaGrpc, ResponseStream};
pub use sizing::{
    ASSIGNMENT_TTL, Assignment, OF_THE_ROOM, REPORT_EVERY, Room, UNLIMITED_TTL, allowance, assign,
    pace, token_bucket_ttl,
};
pub use usage::{Recorded, record};
pub use wire::{RESPONSE_PART_BYTES, WireReport, WireResponse};

/// The path prefix of the service's calls (`sluice serve` lets these streams past the
/// admission that reads unary bodies whole).
pub const RLQS_PATH_PREFIX: &str = "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/";
