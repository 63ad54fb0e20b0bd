//! Sluice for HTTP services: [`RateLimitLayer`], a `tower` layer that builds Envoy-style
//! descriptors from each request (headers, client address, masked address, constants, header
//! matches, query parameters, method, path template, country and ASN), asks the Sluice engine, and answers
//! `429 Too Many Requests` with `Retry-After` and rate-limit headers when a rule denies.
//! It works in an axum router, a tonic server, or any hyper service.

mod actions;
mod gateway;
mod geo;
mod headers;
mod layer;
mod path;
mod value;

pub use actions::{Descriptor, RequestParts, client_address, descriptors, route_matches};
pub use gateway::{GatewayHandle, gateway_router, reloadable_gateway};
pub use geo::{GeoError, GeoIp, MAX_DATABASE_BYTES};
pub use headers::{RateLimitFields, add_rate_limit_headers, rate_limit_fields, retry_after_secs};
pub use layer::{LimitPolicy, RateLimit, RateLimitLayer, UpstreamFailed};
pub use path::{InvalidPath, normalize_path};
pub use value::{MAX_VALUE_LEN, descriptor_value, query_value};
