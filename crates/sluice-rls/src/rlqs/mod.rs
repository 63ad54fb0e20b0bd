//! Envoy's Rate Limit Quota Service (RLQS, `envoy.service.rate_limit_quota.v3`): Envoy's
//! `rate_limit_quota` filter enforces assignments locally and reports usage on one stream,
//! with no call per request (docs/RLQS.md).
//!
//! - `bucket.rs`: a bucket id as a descriptor (entries sorted by key);
//! - `usage.rs`: reports counted by the engine, and the room left;
//! - `demand.rs`: each stream's demand per bucket, the shares;
//! - `sizing.rs`: the assignment (token bucket, blanket rule) from the room and the share;
//! - `stream.rs`: one stream's state and answers;
//! - `limits.rs`: the door's bounds;
//! - `shared.rs`: what every stream of the service shares;
//! - `service.rs`: the gRPC service.

mod bucket;
mod demand;
mod limits;
mod service;
mod shared;
mod sizing;
mod stream;
mod usage;

pub use bucket::BucketKey;
pub use limits::RlqsLimits;
pub use service::{RateLimitQuotaGrpc, ResponseStream, rlqs_service};
pub use sizing::{
    ASSIGNMENT_TTL, Assignment, REPORT_EVERY, Room, UNLIMITED_TTL, allowance, assign,
};

/// The path prefix of the service's calls (`sluice serve` lets these streams past the
/// admission that reads unary bodies whole).
pub const RLQS_PATH_PREFIX: &str = "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/";
