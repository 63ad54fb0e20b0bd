//! Rate-limit response headers: the IETF draft fields and the legacy `X-RateLimit-*` ones.

use http::{HeaderMap, HeaderName, HeaderValue};
use sluice_config::HeaderStyle;
use sluice_engine::Verdict;

fn secs_ceil(d: std::time::Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// A header value from bytes built by hand: the buffer becomes the value without a copy.
fn value(buf: Vec<u8>) -> Option<HeaderValue> {
    HeaderValue::from_maybe_shared(axum::body::Bytes::from(buf)).ok()
}

fn push_number(buf: &mut Vec<u8>, n: u64) {
    buf.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// The rate-limit header fields of a verdict: at most six, no map of their own.
#[derive(Debug, Default)]
pub struct RateLimitFields {
    fields: [Option<(HeaderName, HeaderValue)>; 6],
}

impl RateLimitFields {
    fn push(&mut self, name: &'static str, value: Option<HeaderValue>) {
        if let (Some(value), Some(slot)) = (value, self.fields.iter_mut().find(|f| f.is_none())) {
            *slot = Some((HeaderName::from_static(name), value));
        }
    }

    /// Sets each field in `headers` (replacing a field of the same name).
    pub fn insert_into(self, headers: &mut HeaderMap) {
        for (name, value) in self.fields.into_iter().flatten() {
            headers.insert(name, value);
        }
    }
}

/// The fields `style` asks for, describing the most limiting matched rule:
/// `RateLimit-Policy: "<rule>";q=<limit>;w=<window s>` and `RateLimit: "<rule>";r=<left>;t=<reset s>`
/// (draft-ietf-httpapi-ratelimit-headers), and/or `X-RateLimit-Limit`, `-Remaining`, `-Reset`
/// and, on a denial, `X-RateLimit-Retry-After` (whole seconds, as `Retry-After`).
/// Built with integer formatting into one buffer per value (this runs on every request).
pub fn rate_limit_fields(verdict: &Verdict<'_>, style: HeaderStyle) -> RateLimitFields {
    let mut out = RateLimitFields::default();
    let Some(status) = verdict.most_limiting() else {
        return out;
    };
    let Some((limit, window)) = status.limit else {
        return out;
    };
    let remaining = if verdict.allowed { status.remaining } else { 0 };
    let reset = secs_ceil(status.reset_after);
    if matches!(style, HeaderStyle::Ietf | HeaderStyle::Both) {
        let raw = status.name.unwrap_or(status.rule_id);
        // The name goes in a quoted string (a structured-field string): no quote, no backslash.
        let quoted = |extra: usize| {
            let mut buf = Vec::with_capacity(raw.len() + extra);
            buf.push(b'"');
            buf.extend(
                raw.bytes()
                    .map(|b| if b == b'"' || b == b'\\' { b'_' } else { b }),
            );
            buf.push(b'"');
            buf
        };
        let mut policy = quoted(48);
        policy.extend_from_slice(b";q=");
        push_number(&mut policy, limit);
        policy.extend_from_slice(b";w=");
        push_number(&mut policy, window.as_secs().max(1));
        out.push("ratelimit-policy", value(policy));
        let mut current = quoted(48);
        current.extend_from_slice(b";r=");
        push_number(&mut current, remaining);
        current.extend_from_slice(b";t=");
        push_number(&mut current, reset);
        out.push("ratelimit", value(current));
    }
    if matches!(style, HeaderStyle::Legacy | HeaderStyle::Both) {
        out.push("x-ratelimit-limit", Some(HeaderValue::from(limit)));
        out.push("x-ratelimit-remaining", Some(HeaderValue::from(remaining)));
        out.push("x-ratelimit-reset", Some(HeaderValue::from(reset)));
        if !verdict.allowed {
            out.push(
                "x-ratelimit-retry-after",
                Some(HeaderValue::from(retry_after_secs(verdict))),
            );
        }
    }
    out
}

/// Adds the headers `style` asks for to `headers` (see [`rate_limit_fields`]).
pub fn add_rate_limit_headers(headers: &mut HeaderMap, verdict: &Verdict<'_>, style: HeaderStyle) {
    rate_limit_fields(verdict, style).insert_into(headers);
}

/// `Retry-After` in whole seconds (at least 1) for a denied verdict.
pub fn retry_after_secs(verdict: &Verdict<'_>) -> u64 {
    verdict.retry_after().map_or(1, secs_ceil).max(1)
}
