//! A `rate_limit` block as written, validated into a [`Limit`]: Envoy's fields, a zero limit,
//! `unlimited`, and Sluice's extensions with the combinations they allow.

use std::time::Duration;

use serde_saphyr::Spanned;
use sluice_core::Rate;

use crate::error::{Located, suggestion};
use crate::raw::RawRateLimit;
use crate::settings::{
    AlgorithmKind, Limit, LimitSpec, MAX_SLIDING_LOG_LIMIT, Mode, RuleSettings, UNITS,
    check_settings_fit, parse_positive_duration, parse_settings, unit_duration,
};

/// Validates one `rate_limit` (or one entry of `limits`).
pub(crate) fn parse_limit(raw: &Spanned<RawRateLimit>) -> Result<Limit, Located> {
    let r = &raw.value;
    if r.unlimited {
        check_unlimited(r)?;
        return Ok(Limit::Unlimited);
    }
    let window = window_of(raw)?;
    let rpu = requests_per_unit(raw)?;
    if rpu.value == 0 {
        check_blocked(r)?;
        return Ok(Limit::Blocked(window));
    }
    let (rate, settings) = rate_and_settings(raw, rpu, window)?;
    let algorithm = settings.algorithm;
    let (burst, max_delay) = burst_and_max_delay(r, algorithm)?;
    if algorithm == Some(AlgorithmKind::SlidingWindowLog) && rate.limit() > MAX_SLIDING_LOG_LIMIT {
        return Err(Located::at(
            rpu,
            format!(
                "sliding_window_log keeps one entry per request and {} is above its maximum of {MAX_SLIDING_LOG_LIMIT}; use `algorithm: sliding_window`",
                rate.limit()
            ),
        ));
    }
    if let (Some(on_err), mode) = (&r.on_store_error, settings.mode)
        && mode != Some(Mode::Exact)
    {
        return Err(Located::at(
            on_err,
            "`on_store_error` applies only to `mode: exact` (synced and local rules never wait on the store); add `mode: exact` or remove it",
        ));
    }
    Ok(Limit::Limited(LimitSpec {
        rate,
        burst,
        max_delay,
        settings,
    }))
}

/// `unlimited: true` takes neither a count nor a unit.
fn check_unlimited(r: &RawRateLimit) -> Result<(), Located> {
    if let Some(rpu) = &r.requests_per_unit {
        return Err(Located::at(
            rpu,
            "`unlimited: true` takes no `requests_per_unit`; remove one of the two",
        ));
    }
    if let Some(unit) = &r.unit {
        return Err(Located::at(
            unit,
            "`unlimited: true` takes no `unit`; remove one of the two",
        ));
    }
    Ok(())
}

/// The window: from `unit` or `window`, exactly one of them.
fn window_of(raw: &Spanned<RawRateLimit>) -> Result<Duration, Located> {
    let r = &raw.value;
    Ok(match (&r.unit, &r.window) {
        (Some(_), Some(window)) => {
            return Err(Located::at(
                window,
                "write either `unit` or `window`, not both; `window: 90s` replaces `unit`",
            ));
        }
        (Some(unit), None) => unit_duration(&unit.value).ok_or_else(|| {
            Located::at(
                unit,
                format!(
                    "unknown unit `{}`; {}",
                    unit.value,
                    suggestion(&unit.value, UNITS)
                ),
            )
        })?,
        (None, Some(window)) => parse_positive_duration("window", window, false)?,
        (None, None) => {
            return Err(Located::at(
                raw,
                "this rate_limit has no `unit`; add `unit: second` (or minute, hour, day), or `window: 90s`, or `unlimited: true`",
            ));
        }
    })
}

/// `requests_per_unit`, present and not negative.
fn requests_per_unit(raw: &Spanned<RawRateLimit>) -> Result<&Spanned<i64>, Located> {
    let r = &raw.value;
    let Some(rpu) = &r.requests_per_unit else {
        return Err(Located::at(
            raw,
            "this rate_limit has no `requests_per_unit`; add e.g. `requests_per_unit: 100`",
        ));
    };
    if rpu.value < 0 {
        return Err(Located::at(
            rpu,
            format!(
                "requests_per_unit must be 0 (deny every request) or more, found {}",
                rpu.value
            ),
        ));
    }
    Ok(rpu)
}

/// A rule with `requests_per_unit: 0` denies every request: no extension applies to it.
fn check_blocked(r: &RawRateLimit) -> Result<(), Located> {
    // Envoy's banned value: every request over the limit. Nothing else applies.
    let extensions = [
        ("algorithm", r.algorithm.as_ref().map(|s| s.referenced)),
        ("mode", r.mode.as_ref().map(|s| s.referenced)),
        ("burst", r.burst.as_ref().map(|s| s.referenced)),
        ("max_delay", r.max_delay.as_ref().map(|s| s.referenced)),
        ("spans", r.spans.as_ref().map(|s| s.referenced)),
        ("cooldown", r.cooldown.as_ref().map(|s| s.referenced)),
        (
            "on_store_error",
            r.on_store_error.as_ref().map(|s| s.referenced),
        ),
        ("policy", r.policy.as_ref().map(|s| s.referenced)),
        (
            "small_limits",
            r.small_limits.as_ref().map(|s| s.referenced),
        ),
    ];
    if let Some((field, Some(at))) = extensions.into_iter().find(|(_, at)| at.is_some()) {
        return Err(Located::at_location(
            &at,
            format!(
                "`{field}` has nothing to do on a rule with `requests_per_unit: 0` (it denies every request); remove it"
            ),
        ));
    }
    Ok(())
}

/// The rate and the settings, checked to fit each other.
fn rate_and_settings(
    raw: &Spanned<RawRateLimit>,
    rpu: &Spanned<i64>,
    window: Duration,
) -> Result<(Rate, RuleSettings), Located> {
    let r = &raw.value;
    if rpu.value > i64::from(u32::MAX) {
        return Err(Located::at(
            rpu,
            format!(
                "requests_per_unit must be at most {} (counts are 32-bit, as in Envoy's rate limit service), found {}; use a shorter unit or window",
                u32::MAX,
                rpu.value
            ),
        ));
    }
    let rate = Rate::new(rpu.value as u64, window).map_err(|e| {
        Located::at_location(
            r.window.as_ref().map_or(&raw.referenced, |w| &w.referenced),
            e.to_string(),
        )
    })?;
    let settings = parse_settings(
        r.algorithm.as_ref(),
        r.mode.as_ref(),
        r.spans.as_ref(),
        r.cooldown.as_ref(),
        r.on_store_error.as_ref(),
        (r.policy.as_ref(), r.small_limits.as_ref()),
    )?;
    let loc_of = |field: &str| -> (u64, u64) {
        let spanned_loc = match field {
            "spans" => r.spans.as_ref().map(|s| s.referenced),
            "cooldown" => r.cooldown.as_ref().map(|s| s.referenced),
            _ => None,
        };
        let l = spanned_loc.unwrap_or(raw.referenced);
        (l.line(), l.column())
    };
    check_settings_fit(rate, &settings, &loc_of)?;
    Ok((rate, settings))
}

/// `burst` and `max_delay`, each only with the algorithms that use it.
fn burst_and_max_delay(
    r: &RawRateLimit,
    algorithm: Option<AlgorithmKind>,
) -> Result<(Option<u64>, Option<Duration>), Located> {
    let burst = r
        .burst
        .as_ref()
        .map(|b| {
            if !matches!(algorithm, Some(AlgorithmKind::TokenBucket | AlgorithmKind::LeakyBucket)) {
                return Err(Located::at(b, "`burst` applies only to `algorithm: token_bucket` or `leaky_bucket`; set the algorithm or remove `burst`"));
            }
            if b.value <= 0 {
                return Err(Located::at(b, format!("burst must be at least 1, found {}", b.value)));
            }
            Ok(b.value as u64)
        })
        .transpose()?;
    let max_delay = r
        .max_delay
        .as_ref()
        .map(|d| {
            if algorithm != Some(AlgorithmKind::LeakyQueue) {
                return Err(Located::at(d, "`max_delay` applies only to `algorithm: leaky_queue`; set the algorithm or remove `max_delay`"));
            }
            parse_positive_duration("max_delay", d, true)
        })
        .transpose()?;
    Ok((burst, max_delay))
}
