//! Durations as rule files write them: `90s`, `500ms`, `1h30m`, `2d`.

use std::time::Duration;

/// Parses `1h30m`, `90s`, `250ms`, `10us`, `2d`. Every number needs a unit; `0s` is zero.
pub(crate) fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return None;
        }
        let number: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let nanos_per: u64 = match unit {
            "ns" => 1,
            "us" | "µs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "d" => 86_400_000_000_000,
            _ => return None,
        };
        total = total.checked_add(Duration::from_nanos(number.checked_mul(nanos_per)?))?;
    }
    Some(total)
}

/// A duration setting's bounds, as its errors state them.
pub(crate) struct Bounds {
    pub min: Duration,
    pub max: Duration,
    /// `1ms and 10s`: how errors write the range.
    pub range: &'static str,
    /// `10ms` or `1s`: what errors suggest writing.
    pub example: &'static str,
}

/// The duration `field` (named so in errors) sets, `default` when it is not set.
pub(crate) fn bounded_duration(
    field: &str,
    value: Option<&serde_saphyr::Spanned<String>>,
    default: Duration,
    bounds: &Bounds,
) -> Result<Duration, crate::error::Located> {
    use crate::error::Located;
    let Some(v) = value else {
        return Ok(default);
    };
    match parse_duration(&v.value) {
        Some(d) if d >= bounds.min && d <= bounds.max => Ok(d),
        Some(_) => Err(Located::at(
            v,
            format!(
                "{field} must be between {}, found `{}`",
                bounds.range, v.value
            ),
        )),
        None => Err(Located::at(
            v,
            format!(
                "{field} `{}` is not a duration; write e.g. {}",
                v.value, bounds.example
            ),
        )),
    }
}

/// The count `field` (named so in errors) sets, `default` when it is not set; out of
/// `min..=max` is an error, followed by `hint` when there is one.
pub(crate) fn bounded_count(
    field: &str,
    value: Option<&serde_saphyr::Spanned<i64>>,
    default: u64,
    (min, max): (i64, i64),
    hint: &str,
) -> Result<u64, crate::error::Located> {
    match value {
        None => Ok(default),
        Some(v) if (min..=max).contains(&v.value) => Ok(v.value as u64),
        Some(v) => Err(crate::error::Located::at(
            v,
            format!(
                "{field} must be between {min} and {max}, found {}{}{hint}",
                v.value,
                if hint.is_empty() { "" } else { "; " }
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_compound_durations() {
        assert_eq!(parse_duration("90s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("0s"), Some(Duration::ZERO));
        assert_eq!(parse_duration("10"), None);
        assert_eq!(parse_duration("s"), None);
        assert_eq!(parse_duration("5 minutes"), None);
        assert_eq!(parse_duration(""), None);
    }
}
