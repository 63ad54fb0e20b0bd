//! A limit's settings: the algorithm, mode, policy and their defaults, validated from a rule
//! file or `defaults:` in `sluice.yaml`.

use std::fmt;
use std::time::Duration;

use serde_saphyr::Spanned;
use sluice_core::Rate;

use crate::duration::parse_duration;
use crate::error::{Located, suggestion};

/// Which algorithm a limit uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AlgorithmKind {
    /// Token bucket as GCRA, with `burst`.
    TokenBucket,
    /// Leaky bucket as a meter, of size `burst`.
    LeakyBucket,
    /// Leaky bucket as a queue: delays requests up to `max_delay`.
    LeakyQueue,
    /// Fixed window counter (Envoy ratelimit's behaviour; the default).
    FixedWindow,
    /// Sliding window log (exact, memory grows with the limit).
    SlidingWindowLog,
    /// Sliding window counter (approximate, two counters).
    SlidingWindow,
}

impl AlgorithmKind {
    /// Names as written in rule files.
    pub const NAMES: &'static [&'static str] = &[
        "token_bucket",
        "leaky_bucket",
        "leaky_queue",
        "fixed_window",
        "sliding_window_log",
        "sliding_window",
    ];

    /// The name as written in rule files.
    pub fn name(self) -> &'static str {
        match self {
            AlgorithmKind::TokenBucket => "token_bucket",
            AlgorithmKind::LeakyBucket => "leaky_bucket",
            AlgorithmKind::LeakyQueue => "leaky_queue",
            AlgorithmKind::FixedWindow => "fixed_window",
            AlgorithmKind::SlidingWindowLog => "sliding_window_log",
            AlgorithmKind::SlidingWindow => "sliding_window",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "token_bucket" => AlgorithmKind::TokenBucket,
            "leaky_bucket" => AlgorithmKind::LeakyBucket,
            "leaky_queue" => AlgorithmKind::LeakyQueue,
            "fixed_window" => AlgorithmKind::FixedWindow,
            "sliding_window_log" => AlgorithmKind::SlidingWindowLog,
            "sliding_window" => AlgorithmKind::SlidingWindow,
            _ => return None,
        })
    }
}

/// Where a rule's state lives (docs/CONFIG.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mode {
    /// This process only.
    Local,
    /// Local counts flushed to the store once per span.
    Synced,
    /// One store round trip per decision.
    Exact,
}

impl Mode {
    /// Names as written in config.
    pub const NAMES: &'static [&'static str] = &["local", "synced", "exact"];

    /// The name as written in config.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Local => "local",
            Mode::Synced => "synced",
            Mode::Exact => "exact",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "local" => Mode::Local,
            "synced" => Mode::Synced,
            "exact" => Mode::Exact,
            _ => return None,
        })
    }
}

/// What a synced rule does with a limit too small to share among the instances (under two
/// requests per instance and span, with the instances the store counts).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SmallLimits {
    /// Each request is decided at the store, on the window counter the flushes add to (one
    /// round trip per request until the key is over its limit): the default.
    Store,
    /// Every decision stays local, on this instance's share (no request waits on the store).
    Share,
}

impl SmallLimits {
    /// Names as written in config.
    pub const NAMES: &'static [&'static str] = &["store", "share"];

    /// The name as written in config.
    pub fn name(self) -> &'static str {
        match self {
            SmallLimits::Store => "store",
            SmallLimits::Share => "share",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "store" => SmallLimits::Store,
            "share" => SmallLimits::Share,
            _ => return None,
        })
    }
}

/// How a synced rule decides between flushes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Policy {
    /// Extrapolates the other instances from their demand rates (the default).
    Predictive,
    /// The seed algorithm: blocks only after a flush or a local fallback check.
    Reactive,
}

impl Policy {
    /// Names as written in config.
    pub const NAMES: &'static [&'static str] = &["predictive", "reactive"];

    /// The name as written in config.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Predictive => "predictive",
            Policy::Reactive => "reactive",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "predictive" => Policy::Predictive,
            "reactive" => Policy::Reactive,
            _ => return None,
        })
    }
}

/// What an `exact` rule does when the store cannot be reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OnStoreError {
    /// Admit the request.
    Allow,
    /// Deny the request.
    Deny,
    /// Decide with a local limit of MAX / instances.
    Local,
}

impl OnStoreError {
    /// Names as written in config.
    pub const NAMES: &'static [&'static str] = &["allow", "deny", "local"];

    /// The name as written in config.
    pub fn name(self) -> &'static str {
        match self {
            OnStoreError::Allow => "allow",
            OnStoreError::Deny => "deny",
            OnStoreError::Local => "local",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "allow" => OnStoreError::Allow,
            "deny" => OnStoreError::Deny,
            "local" => OnStoreError::Local,
            _ => return None,
        })
    }
}

/// The settings a rule may leave to `defaults:` in `sluice.yaml`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuleSettings {
    /// Algorithm.
    pub algorithm: Option<AlgorithmKind>,
    /// Mode.
    pub mode: Option<Mode>,
    /// Spans per window (synced mode).
    pub spans: Option<u32>,
    /// How long a key stays blocked once over the limit; zero means until the window ends.
    pub cooldown: Option<Duration>,
    /// Exact mode's behaviour on store errors.
    pub on_store_error: Option<OnStoreError>,
    /// Synced mode's policy.
    pub policy: Option<Policy>,
    /// Synced mode, predictive policy: a limit too small to share.
    pub small_limits: Option<SmallLimits>,
}

/// A limit as written: the rate, and everything else optional.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitSpec {
    /// Requests (cost units) per window.
    pub rate: Rate,
    /// Bucket size for token and leaky buckets; defaults to the limit.
    pub burst: Option<u64>,
    /// Longest delay handed out by a `leaky_queue`; defaults to the window.
    pub max_delay: Option<Duration>,
    /// Settings that fall back to the defaults.
    pub settings: RuleSettings,
}

/// A limit with every setting decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedLimit {
    /// Requests (cost units) per window.
    pub rate: Rate,
    /// Algorithm.
    pub algorithm: AlgorithmKind,
    /// Mode.
    pub mode: Mode,
    /// Bucket size for token and leaky buckets.
    pub burst: u64,
    /// Longest delay of a `leaky_queue`.
    pub max_delay: Duration,
    /// Spans per window.
    pub spans: u32,
    /// Block duration after going over; zero means until the window ends.
    pub cooldown: Duration,
    /// Exact mode's behaviour on store errors.
    pub on_store_error: OnStoreError,
    /// Synced mode's policy.
    pub policy: Policy,
    /// Synced mode, predictive policy: a limit too small to share.
    pub small_limits: SmallLimits,
}

/// Values used when neither the rule nor `defaults:` says otherwise.
pub const BUILTIN_SPANS: u32 = 6;

impl LimitSpec {
    /// Fills unset settings from `defaults`, then from the built-in defaults.
    pub fn resolve(&self, defaults: &RuleSettings) -> ResolvedLimit {
        let s = &self.settings;
        ResolvedLimit {
            rate: self.rate,
            algorithm: s
                .algorithm
                .or(defaults.algorithm)
                .unwrap_or(AlgorithmKind::FixedWindow),
            mode: s.mode.or(defaults.mode).unwrap_or(Mode::Synced),
            burst: self.burst.unwrap_or(self.rate.limit()),
            max_delay: self.max_delay.unwrap_or(self.rate.window()),
            spans: s.spans.or(defaults.spans).unwrap_or(BUILTIN_SPANS),
            cooldown: s.cooldown.or(defaults.cooldown).unwrap_or(Duration::ZERO),
            on_store_error: s
                .on_store_error
                .or(defaults.on_store_error)
                .unwrap_or(OnStoreError::Local),
            policy: s.policy.or(defaults.policy).unwrap_or(Policy::Predictive),
            small_limits: s
                .small_limits
                .or(defaults.small_limits)
                .unwrap_or(SmallLimits::Store),
        }
    }
}

/// A rule's limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Limit {
    /// `unlimited: true`: matched, never limited (useful to exempt a value from a key-wide rule).
    Unlimited,
    /// A real limit.
    Limited(LimitSpec),
    /// `requests_per_unit: 0`: every request is over the limit (a banned value, as in Envoy's
    /// ratelimit service); the window is what responses report.
    Blocked(Duration),
}

pub(crate) const UNITS: &[&str] = &["second", "minute", "hour", "day", "week", "month", "year"];
/// The sliding log keeps an entry per admission; above this it is the wrong tool.
pub(crate) const MAX_SLIDING_LOG_LIMIT: u64 = 100_000;
/// The longest `cooldown`, in windows: a penalty may outlast the window that earned it.
pub const MAX_COOLDOWN_WINDOWS: u32 = 10;
/// Spans shorter than this cannot be flushed on time.
const MIN_SPAN: Duration = Duration::from_millis(10);
const MAX_SPANS: i64 = 1000;

pub(crate) fn unit_duration(unit: &str) -> Option<Duration> {
    let secs = match unit.to_ascii_lowercase().as_str() {
        "second" => 1,
        "minute" => 60,
        "hour" => 3600,
        "day" => 86_400,
        "week" => 7 * 86_400,
        "month" => 30 * 86_400,
        "year" => 365 * 86_400,
        _ => return None,
    };
    Some(Duration::from_secs(secs))
}

pub(crate) fn parse_choice<T>(
    field: &str,
    value: &Spanned<String>,
    names: &[&str],
    parse: fn(&str) -> Option<T>,
) -> Result<T, Located> {
    parse(&value.value).ok_or_else(|| {
        Located::at(
            value,
            format!(
                "unknown {field} `{}`; {}",
                value.value,
                suggestion(&value.value, names)
            ),
        )
    })
}

pub(crate) fn parse_positive_duration(
    field: &str,
    value: &Spanned<String>,
    allow_zero: bool,
) -> Result<Duration, Located> {
    let d = parse_duration(&value.value).ok_or_else(|| {
        Located::at(
            value,
            format!(
                "invalid {field} `{}`; write a duration such as `90s`, `500ms`, `1m` or `1h30m`",
                value.value
            ),
        )
    })?;
    if d.is_zero() && !allow_zero {
        return Err(Located::at(
            value,
            format!("{field} must be longer than zero"),
        ));
    }
    Ok(d)
}

pub(crate) fn parse_settings(
    algorithm: Option<&Spanned<String>>,
    mode: Option<&Spanned<String>>,
    spans: Option<&Spanned<i64>>,
    cooldown: Option<&Spanned<String>>,
    on_store_error: Option<&Spanned<String>>,
    (policy, small_limits): (Option<&Spanned<String>>, Option<&Spanned<String>>),
) -> Result<RuleSettings, Located> {
    let spans = spans
        .map(|s| {
            if !(2..=MAX_SPANS).contains(&s.value) {
                return Err(Located::at(
                    s,
                    format!(
                        "spans must be between 2 and {MAX_SPANS}, found {}; 6 is a good start",
                        s.value
                    ),
                ));
            }
            Ok(s.value as u32)
        })
        .transpose()?;
    Ok(RuleSettings {
        algorithm: algorithm
            .map(|a| parse_choice("algorithm", a, AlgorithmKind::NAMES, AlgorithmKind::parse))
            .transpose()?,
        mode: mode
            .map(|m| parse_choice("mode", m, Mode::NAMES, Mode::parse))
            .transpose()?,
        spans,
        cooldown: cooldown
            .map(|c| parse_positive_duration("cooldown", c, true))
            .transpose()?,
        on_store_error: on_store_error
            .map(|o| {
                parse_choice(
                    "on_store_error",
                    o,
                    OnStoreError::NAMES,
                    OnStoreError::parse,
                )
            })
            .transpose()?,
        policy: policy
            .map(|p| parse_choice("policy", p, Policy::NAMES, Policy::parse))
            .transpose()?,
        small_limits: small_limits
            .map(|s| parse_choice("small_limits", s, SmallLimits::NAMES, SmallLimits::parse))
            .transpose()?,
    })
}

/// Checks that settings can work with a rate: spans not too short, cooldown not beyond the
/// window, options used only where they mean something.
pub(crate) fn check_settings_fit(
    rate: Rate,
    settings: &RuleSettings,
    at: &impl Fn(&str) -> (u64, u64),
) -> Result<(), Located> {
    let loc = |field: &str, message: String| {
        let (line, column) = at(field);
        Located {
            line,
            column,
            message,
        }
    };
    if let Some(spans) = settings.spans {
        let span = rate.window() / spans;
        if span < MIN_SPAN {
            return Err(loc(
                "spans",
                format!(
                    "spans: {spans} splits the {:?} window into spans of {span:?}, shorter than 10ms; use at most {} spans or a longer window",
                    rate.window(),
                    (rate.window().as_millis() / 10).max(2)
                ),
            ));
        }
    }
    if let Some(cooldown) = settings.cooldown
        && cooldown > rate.window().saturating_mul(MAX_COOLDOWN_WINDOWS)
    {
        return Err(loc(
            "cooldown",
            format!(
                "cooldown ({}) is longer than {MAX_COOLDOWN_WINDOWS} windows ({}); a penalty may outlast the window, up to {MAX_COOLDOWN_WINDOWS} of them (2 to 3 windows suits aggressive traffic)",
                sluice_core::format_duration(cooldown),
                sluice_core::format_duration(rate.window().saturating_mul(MAX_COOLDOWN_WINDOWS))
            ),
        ));
    }
    Ok(())
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Limit::Unlimited => f.write_str("unlimited"),
            Limit::Limited(spec) => write!(f, "{}", spec.rate),
            Limit::Blocked(window) => write!(f, "0/{}", sluice_core::format_duration(*window)),
        }
    }
}
