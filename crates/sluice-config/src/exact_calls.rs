//! `exact:` in `sluice.yaml`: how `exact` mode calls the store (a time budget per request and
//! a circuit breaker), and how often a synced rule with a limit too small to share may.

use std::time::Duration;

use serde::Deserialize;
use serde_saphyr::Spanned;

use crate::duration::{Bounds, bounded_count, bounded_duration};
use crate::error::Located;

/// How `exact` mode calls the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExactCalls {
    /// The most one request waits for the store (`exact.timeout`, default 10 ms, well under
    /// Envoy's 20 ms rate-limit timeout); then the rule's `on_store_error` decides it.
    pub timeout: Duration,
    /// Store calls failing in a row (timeouts, refused connections) that open the breaker
    /// (`exact.breaker_failures`, default 5): while open, `on_store_error` decides at once.
    pub breaker_failures: u32,
    /// How long the breaker stays open before one request probes the store
    /// (`exact.breaker_cool_off`, default 1 s); a probe that succeeds closes it.
    pub breaker_cool_off: Duration,
    /// Store decisions per second a synced rule with a limit too small to share may ask for
    /// on one instance (`exact.small_limit_calls`, default 5,000); beyond it the key's share
    /// decides, so a key spray cannot turn every request into a store call.
    pub small_limit_calls: u32,
}

impl Default for ExactCalls {
    fn default() -> Self {
        Self {
            timeout: Duration::from_millis(10),
            breaker_failures: 5,
            breaker_cool_off: Duration::from_secs(1),
            small_limit_calls: 5_000,
        }
    }
}

/// `exact:` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawExactCalls {
    pub timeout: Option<Spanned<String>>,
    pub breaker_failures: Option<Spanned<i64>>,
    pub breaker_cool_off: Option<Spanned<String>>,
    pub small_limit_calls: Option<Spanned<i64>>,
}

pub(crate) fn parse_exact_calls(raw: &RawExactCalls) -> Result<ExactCalls, Located> {
    let d = ExactCalls::default();
    let breaker_failures = bounded_count(
        "exact.breaker_failures",
        raw.breaker_failures.as_ref(),
        u64::from(d.breaker_failures),
        (1, 1000),
        "",
    )? as u32;
    let small_limit_calls = bounded_count(
        "exact.small_limit_calls",
        raw.small_limit_calls.as_ref(),
        u64::from(d.small_limit_calls),
        (1, 1_000_000),
        "",
    )? as u32;
    Ok(ExactCalls {
        small_limit_calls,
        timeout: bounded_duration(
            "exact.timeout",
            raw.timeout.as_ref(),
            d.timeout,
            &Bounds {
                min: Duration::from_millis(1),
                max: Duration::from_secs(10),
                range: "1ms and 10s",
                example: "`10ms` or `1s`",
            },
        )?,
        breaker_failures,
        breaker_cool_off: bounded_duration(
            "exact.breaker_cool_off",
            raw.breaker_cool_off.as_ref(),
            d.breaker_cool_off,
            &Bounds {
                min: Duration::from_millis(10),
                max: Duration::from_secs(3600),
                range: "10ms and 1h",
                example: "`500ms` or `1s`",
            },
        )?,
    })
}
