//! Rate-limit response headers: the IETF draft fields and the legacy `X-RateLimit-*` ones.

use http::{HeaderMap, HeaderName, HeaderValue};
use sluice_config::HeaderStyle;
use sluice_engine::Verdict;

fn secs_ceil(d: std::time::Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

fn put(headers: &mut HeaderMap, name: &'static str, value: String) {
    if let Ok(v) = HeaderValue::from_str(&value) {
        headers.insert(HeaderName::from_static(name), v);
    }
}

/// Adds the headers `style` asks for, describing the most limiting matched rule:
/// `RateLimit-Policy: "<rule>";q=<limit>;w=<window s>` and `RateLimit: "<rule>";r=<left>;t=<reset s>`
/// (draft-ietf-httpapi-ratelimit-headers), and/or `X-RateLimit-Limit`, `-Remaining`, `-Reset`.
pub fn add_rate_limit_headers(headers: &mut HeaderMap, verdict: &Verdict<'_>, style: HeaderStyle) {
    let Some(status) = verdict.most_limiting() else {
        return;
    };
    let Some((limit, window)) = status.limit else {
        return;
    };
    let remaining = if verdict.allowed { status.remaining } else { 0 };
    let reset = secs_ceil(status.reset_after);
    let raw = status.name.unwrap_or(status.rule_id);
    let name: std::borrow::Cow<'_, str> = if raw.contains(['"', '\\']) {
        raw.replace(['"', '\\'], "_").into()
    } else {
        raw.into()
    };
    if matches!(style, HeaderStyle::Ietf | HeaderStyle::Both) {
        put(
            headers,
            "ratelimit-policy",
            format!("\"{name}\";q={limit};w={}", window.as_secs().max(1)),
        );
        put(
            headers,
            "ratelimit",
            format!("\"{name}\";r={remaining};t={reset}"),
        );
    }
    if matches!(style, HeaderStyle::Legacy | HeaderStyle::Both) {
        headers.insert(
            HeaderName::from_static("x-ratelimit-limit"),
            HeaderValue::from(limit),
        );
        headers.insert(
            HeaderName::from_static("x-ratelimit-remaining"),
            HeaderValue::from(remaining),
        );
        headers.insert(
            HeaderName::from_static("x-ratelimit-reset"),
            HeaderValue::from(reset),
        );
    }
}

/// `Retry-After` in whole seconds (at least 1) for a denied verdict.
pub fn retry_after_secs(verdict: &Verdict<'_>) -> u64 {
    verdict.retry_after().map_or(1, secs_ceil).max(1)
}
