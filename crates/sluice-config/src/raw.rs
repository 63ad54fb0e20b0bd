//! The files exactly as written: serde types with source locations, before validation.

use serde::Deserialize;
use serde_saphyr::Spanned;

/// An Envoy ratelimit domain file, plus Sluice's extensions.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDomainFile {
    pub domain: Spanned<String>,
    #[serde(default)]
    pub descriptors: Vec<RawDescriptor>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDescriptor {
    pub key: Spanned<String>,
    pub value: Option<Spanned<String>>,
    pub rate_limit: Option<Spanned<RawRateLimit>>,
    pub limits: Option<Spanned<Vec<Spanned<RawRateLimit>>>>,
    #[serde(default)]
    pub descriptors: Vec<RawDescriptor>,
    pub shadow_mode: Option<bool>,
    #[serde(default)]
    pub detailed_metric: bool,
    #[serde(default)]
    pub value_to_metric: bool,
    #[serde(default)]
    pub share_threshold: Option<Spanned<bool>>,
    #[serde(default)]
    pub quota_mode: bool,
    pub metadata: Option<Spanned<serde_json::Value>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRateLimit {
    pub unit: Option<Spanned<String>>,
    pub requests_per_unit: Option<Spanned<i64>>,
    #[serde(default)]
    pub unlimited: bool,
    pub name: Option<Spanned<String>>,
    #[serde(default)]
    pub replaces: Vec<Spanned<Option<RawReplaces>>>,
    // Sluice extensions.
    pub window: Option<Spanned<String>>,
    pub algorithm: Option<Spanned<String>>,
    pub mode: Option<Spanned<String>>,
    pub burst: Option<Spanned<i64>>,
    pub max_delay: Option<Spanned<String>>,
    pub spans: Option<Spanned<i64>>,
    pub cooldown: Option<Spanned<String>>,
    pub on_store_error: Option<Spanned<String>>,
    pub policy: Option<Spanned<String>>,
    pub small_limits: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawReplaces {
    pub name: Option<Spanned<String>>,
}

/// `sluice.yaml`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawServiceFile {
    pub store: Option<Spanned<String>>,
    #[serde(default)]
    pub listen: RawListen,
    pub rules: Option<Vec<Spanned<String>>>,
    pub allow_empty_rules: Option<bool>,
    #[serde(default)]
    pub defaults: RawDefaults,
    #[serde(default)]
    pub api: RawApi,
    #[serde(default)]
    pub rls: RawRls,
    #[serde(default)]
    pub rlqs: RawRlqs,
    pub headers: Option<Spanned<String>>,
    pub expected_instances: Option<Spanned<i64>>,
    pub max_keys_per_rule: Option<Spanned<i64>>,
    pub flush_chunk_items: Option<Spanned<i64>>,
    pub store_timeout: Option<Spanned<String>>,
    pub flush_timeout_per_key: Option<Spanned<String>>,
    pub shutdown_timeout: Option<Spanned<String>>,
    pub state_dir: Option<Spanned<String>>,
    #[serde(default)]
    pub exact: crate::exact_calls::RawExactCalls,
    pub store_ca_file: Option<Spanned<String>>,
    #[serde(default)]
    pub gateways: Vec<RawGateway>,
    #[serde(default)]
    pub listeners: RawListeners,
    #[serde(default)]
    pub access: RawAccess,
    pub geoip: Option<crate::geoip::RawGeoIp>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawListeners {
    pub max_connections: Option<Spanned<i64>>,
    pub admin_max_connections: Option<Spanned<i64>>,
    pub max_requests_in_flight: Option<Spanned<i64>>,
    pub header_read_timeout: Option<Spanned<String>>,
    pub idle_timeout: Option<Spanned<String>>,
    pub request_timeout: Option<Spanned<String>>,
    pub max_header_bytes: Option<Spanned<i64>>,
    pub max_body_bytes: Option<Spanned<i64>>,
    pub http2_max_concurrent_streams: Option<Spanned<i64>>,
    pub body_read_timeout: Option<Spanned<String>>,
    pub max_bodies_waiting: Option<Spanned<i64>>,
    pub max_waiting_body_bytes: Option<Spanned<i64>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAccess {
    pub admin_token_file: Option<Spanned<String>>,
    pub api_token_file: Option<Spanned<String>>,
    pub tls_cert_file: Option<Spanned<String>>,
    pub tls_key_file: Option<Spanned<String>>,
    pub admin_hosts: Option<Vec<Spanned<String>>>,
    pub status_full_keys: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawListen {
    pub http: Option<Spanned<String>>,
    pub grpc: Option<Spanned<String>>,
    pub admin: Option<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDefaults {
    pub mode: Option<Spanned<String>>,
    pub spans: Option<Spanned<i64>>,
    pub policy: Option<Spanned<String>>,
    pub cooldown: Option<Spanned<String>>,
    pub algorithm: Option<Spanned<String>>,
    pub on_store_error: Option<Spanned<String>>,
    pub small_limits: Option<Spanned<String>>,
    pub shadow_mode: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawApi {
    pub domain: Option<Spanned<String>>,
    pub adhoc_max_keys: Option<Spanned<i64>>,
    pub workers: Option<Spanned<i64>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRls {
    pub response_headers: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRlqs {
    pub max_streams: Option<Spanned<i64>>,
    pub max_report_bytes: Option<Spanned<i64>>,
    pub max_streams_per_peer: Option<Spanned<i64>>,
    pub max_buckets_per_stream: Option<Spanned<i64>>,
    pub usages_per_second: Option<Spanned<i64>>,
    pub idle_timeout: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawGateway {
    pub listen: Spanned<String>,
    pub upstream: Spanned<String>,
    pub domain: Spanned<String>,
    pub headers: Option<Spanned<String>>,
    pub upstream_timeout: Option<Spanned<String>>,
    pub workers: Option<Spanned<i64>>,
    pub refund_upstream_failures: Option<bool>,
    pub trusted_hops: Option<Spanned<i64>>,
    pub case_sensitive_paths: Option<bool>,
    pub strict_trailing_slash: Option<bool>,
    pub strict_path_parameters: Option<bool>,
    pub strict_head: Option<bool>,
    pub strict_query_separators: Option<bool>,
    pub strict_query_names: Option<bool>,
    pub ignore_method_override: Option<bool>,
    #[serde(default)]
    pub routes: Vec<RawRoute>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRoute {
    #[serde(rename = "match")]
    pub matcher: Spanned<RawRouteMatch>,
    pub cost: Option<Spanned<i64>>,
    #[serde(default)]
    pub rate_limits: Vec<RawRateLimitEntry>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRouteMatch {
    pub path_prefix: Option<Spanned<String>>,
    pub path: Option<Spanned<String>>,
    pub path_template: Option<Spanned<String>>,
    pub method: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRateLimitEntry {
    pub actions: Spanned<Vec<Spanned<RawAction>>>,
}

/// One Envoy-style rate-limit action; each contributes one descriptor entry.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum RawAction {
    RequestHeaders {
        header_name: Spanned<String>,
        descriptor_key: Spanned<String>,
        #[serde(default)]
        skip_if_absent: bool,
    },
    RemoteAddress {},
    MaskedRemoteAddress {
        v4_prefix_mask_len: Option<Spanned<i64>>,
        v6_prefix_mask_len: Option<Spanned<i64>>,
    },
    GenericKey {
        descriptor_value: Spanned<String>,
        descriptor_key: Option<Spanned<String>>,
    },
    HeaderValueMatch {
        descriptor_value: Spanned<String>,
        descriptor_key: Option<Spanned<String>>,
        #[serde(default = "default_true")]
        expect_match: bool,
        headers: Vec<RawHeaderMatcher>,
    },
    QueryParameter {
        query_parameter_name: Spanned<String>,
        descriptor_key: Spanned<String>,
        #[serde(default)]
        skip_if_absent: bool,
    },
    Method {
        descriptor_key: Option<Spanned<String>>,
    },
    Path {
        descriptor_key: Option<Spanned<String>>,
    },
    Country {
        descriptor_key: Option<Spanned<String>>,
        default_value: Option<Spanned<String>>,
    },
    Asn {
        descriptor_key: Option<Spanned<String>>,
        default_value: Option<Spanned<String>>,
    },
}

fn default_true() -> bool {
    true
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHeaderMatcher {
    pub name: Spanned<String>,
    pub exact_match: Option<String>,
    pub prefix_match: Option<String>,
    pub suffix_match: Option<String>,
    pub contains_match: Option<String>,
    pub present_match: Option<bool>,
    #[serde(default)]
    pub invert_match: bool,
}
