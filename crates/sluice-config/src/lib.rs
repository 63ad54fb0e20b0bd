//! Sluice's configuration: Envoy ratelimit rule files (loaded unmodified, plus Sluice's
//! extensions) and the service file `sluice.yaml`, validated into typed values.
//!
//! Every error names the file, line and column and says what to write instead.
//!
//! ```
//! use sluice_config::parse_domain;
//! use std::path::Path;
//!
//! let yaml = "
//! domain: edge
//! descriptors:
//!   - key: user
//!     rate_limit: { unit: minute, requests_per_unit: 3 }
//!   - key: user
//!     value: admin
//!     rate_limit: { unlimited: true }
//! ";
//! let domain = parse_domain(Path::new("edge.yaml"), yaml).unwrap();
//! let rules: Vec<_> = domain.match_descriptor(&[("user", "alice")]).collect();
//! assert_eq!(rules[0].limit.to_string(), "3/1m");
//!
//! let err = parse_domain(Path::new("bad.yaml"), "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: secnd, requests_per_unit: 3 }\n").unwrap_err();
//! assert!(err.to_string().starts_with("bad.yaml:4:"));
//! assert!(err.to_string().contains("did you mean `second`?"));
//! ```

mod domain_file;
mod duration;
mod error;
mod exact_calls;
mod fields;
mod gateway;
mod geoip;
mod lifecycle;
mod limit;
mod lint;
mod load;
mod protection;
mod raw;
mod redact;
mod rlqs;
mod rules;
mod service;
mod settings;
mod store;
mod target;
mod wildcard;

pub use domain_file::{DomainSource, load_domain_file, parse_domain};
pub use error::{ConfigError, describe_yaml_error, suggestion};
pub use exact_calls::ExactCalls;
pub use fields::HeaderStyle;
pub use gateway::{
    Action, Gateway, GeoField, HeaderMatch, HeaderMatcher, MAX_TRUSTED_HOPS, PathMatching, Route,
    RouteMatch,
};
pub use geoip::{DEFAULT_GEOIP_CHECK_EVERY, GeoIpConfig, MAX_GEOIP_DATABASES};
pub use lifecycle::{DEFAULT_SHUTDOWN_TIMEOUT, Lifecycle};
pub use lint::{Warning, warnings};
pub use load::{load, parse_service};
pub use protection::{Access, ListenerLimits, TlsFiles};
pub use redact::{redact_secrets, redact_url, secrets_in};
pub use rlqs::RlqsSettings;
pub use rules::{
    AlgorithmKind, BUILTIN_SPANS, Domain, Limit, LimitSpec, Mode, OnStoreError, Policy,
    ResolvedLimit, Rule, RuleMatch, RuleMatches, RuleSet, RuleSettings, SmallLimits,
};
pub use service::{DEFAULT_ADHOC_MAX_KEYS, DEFAULT_FLUSH_CHUNK_ITEMS, Listen, ServiceConfig};
pub use target::{
    ClusterTarget, Credentials, EtcdTarget, RedisTarget, SentinelTarget, StandaloneTarget,
    StoreConfig,
};
pub use wildcard::Wildcard;
