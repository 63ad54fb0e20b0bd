//! Sluice for HTTP services: [`RateLimitLayer`], a `tower` layer that builds Envoy-style
//! descriptors from each request (headers, client address, masked address, constants, header
//! matches, query parameters, method, path template, country and ASN), asks the Sluice engine, and answers
//! `429 Too Many Requests` with `Retry-After` and rate-limit headers when a rule denies.
//! It works in an axum router, a tonic server, or any hyper service.

mod actions;
mod client_ip;
mod gateway;
mod geo;
mod headers;
mod layer;
mod method_override;
mod path;
mod query;
mod route;
mod single_value;
mod value;

pub use actions::{Descriptor, RequestParts, descriptors};
pub use client_ip::{canonical_ip, client_address};
pub use gateway::{
    GatewayHandle, GatewayService, Proxy, gateway_router, gateway_service, reloadable_gateway,
};
pub use geo::{GeoError, GeoIp, MAX_DATABASE_BYTES};
pub use headers::{RateLimitFields, add_rate_limit_headers, rate_limit_fields, retry_after_secs};
pub use layer::{LimitPolicy, RateLimit, RateLimitLayer, UpstreamFailed};
pub use method_override::check_method_override;
pub use path::{InvalidPath, normalize_path};
pub use query::QueryReading;
pub use route::{RoutePath, find_route, route_matches};
pub use single_value::{AmbiguousInput, check_single_inputs};
pub use value::{MAX_VALUE_LEN, descriptor_value, query_value};
