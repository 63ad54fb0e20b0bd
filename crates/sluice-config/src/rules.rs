//! Validated rules: a domain's descriptor tree with its limits.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde_saphyr::Spanned;
use sluice_core::Rate;

use crate::duration::parse_duration;
use crate::error::{Located, suggestion};
use crate::raw::{RawDescriptor, RawDomainFile, RawRateLimit};

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
}

/// One limit at one place in a domain's descriptor tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// Position in [`Domain::rules`].
    pub index: usize,
    /// Stable identity: the domain, the descriptor path and, for `limits:` lists, the position.
    pub id: String,
    /// The descriptor path, e.g. `database=users/collection`.
    pub path: String,
    /// `name` from the rule file, used by `replaces`.
    pub name: Option<String>,
    /// The limit.
    pub limit: Limit,
    /// Counted but never denies.
    pub shadow_mode: bool,
    /// Envoy's per-value metrics flag.
    pub detailed_metric: bool,
    /// Names of rules this one replaces when both match one request.
    pub replaces: Vec<String>,
    /// Line and column of the limit in its file.
    pub position: (u64, u64),
}

/// Matching runs on every request: a fast hasher (foldhash) rather than SipHash.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

#[derive(Clone, Debug, Default)]
struct Level {
    /// key -> matchers for that key.
    keys: FastMap<String, KeyMatchers>,
}

#[derive(Clone, Debug, Default)]
struct KeyMatchers {
    exact: FastMap<String, usize>,
    prefixes: Vec<(String, usize)>,
    any: Option<usize>,
}

#[derive(Clone, Debug)]
struct Node {
    rules: Vec<usize>,
    children: Level,
}

/// A validated domain: its rules and the tree that matches request descriptors to them.
#[derive(Clone, Debug)]
pub struct Domain {
    name: String,
    file: PathBuf,
    rules: Vec<Rule>,
    nodes: Vec<Node>,
    root: Level,
}

/// One rule matched for one descriptor of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuleMatch<'a> {
    /// Which of the request's descriptors matched.
    pub descriptor: usize,
    /// The rule.
    pub rule: &'a Rule,
}

/// The rules a request matched, in order (inline up to 8: no allocation per request).
pub type RuleMatches<'a> = smallvec::SmallVec<[RuleMatch<'a>; 8]>;

impl Domain {
    /// The domain's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The file it came from.
    pub fn file(&self) -> &std::path::Path {
        &self.file
    }

    /// All rules in file order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Rules for one descriptor (key/value entries), with Envoy's semantics: at each level an
    /// exact `key`+`value` node wins over a `value: prefix*` node, which wins over a key-only
    /// node; the limits apply only where the descriptor ends.
    pub fn match_descriptor<K, V>(&self, entries: &[(K, V)]) -> impl Iterator<Item = &Rule>
    where
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut level = &self.root;
        let mut found: &[usize] = &[];
        for (i, (key, value)) in entries.iter().enumerate() {
            let Some(node) = level.find(key.as_ref(), value.as_ref()) else {
                break;
            };
            let node = &self.nodes[node];
            if i + 1 == entries.len() {
                found = &node.rules;
            }
            level = &node.children;
        }
        found.iter().map(|&i| &self.rules[i])
    }

    /// Rules for a whole request: every descriptor's rules, minus those replaced by another
    /// matched rule's `replaces`.
    pub fn match_request<K, V, D>(&self, descriptors: &[D]) -> RuleMatches<'_>
    where
        K: AsRef<str>,
        V: AsRef<str>,
        D: AsRef<[(K, V)]>,
    {
        let mut matched = RuleMatches::new();
        for (descriptor, entries) in descriptors.iter().enumerate() {
            for rule in self.match_descriptor(entries.as_ref()) {
                matched.push(RuleMatch { descriptor, rule });
            }
        }
        if matched.iter().any(|m| !m.rule.replaces.is_empty()) {
            let replaced: smallvec::SmallVec<[&str; 8]> = matched
                .iter()
                .flat_map(|m| m.rule.replaces.iter().map(String::as_str))
                .collect();
            matched.retain(|m| {
                m.rule
                    .name
                    .as_deref()
                    .is_none_or(|n| !replaced.contains(&n))
            });
        }
        matched
    }
}

impl Level {
    fn find(&self, key: &str, value: &str) -> Option<usize> {
        let matchers = self.keys.get(key)?;
        if let Some(&node) = matchers.exact.get(value) {
            return Some(node);
        }
        matchers
            .prefixes
            .iter()
            .filter(|(prefix, _)| value.starts_with(prefix.as_str()))
            .max_by_key(|(prefix, _)| prefix.len())
            .map(|&(_, node)| node)
            .or(matchers.any)
    }
}

/// All validated domains, by name.
#[derive(Clone, Debug, Default)]
pub struct RuleSet {
    domains: BTreeMap<String, Domain>,
}

impl RuleSet {
    /// A rule set of the given domains; fails on a domain defined twice.
    pub fn new(domains: Vec<Domain>) -> Result<Self, crate::ConfigError> {
        let mut map: BTreeMap<String, Domain> = BTreeMap::new();
        for domain in domains {
            if let Some(first) = map.get(&domain.name) {
                return Err(Located {
                    line: 1,
                    column: 1,
                    message: format!(
                        "domain `{}` is already defined in {}; merge the two files or rename one domain",
                        domain.name,
                        first.file.display()
                    ),
                }
                .in_file(&domain.file));
            }
            map.insert(domain.name.clone(), domain);
        }
        Ok(Self { domains: map })
    }

    /// One domain.
    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    /// All domains, by name.
    pub fn domains(&self) -> impl Iterator<Item = &Domain> {
        self.domains.values()
    }
}

const UNITS: &[&str] = &["second", "minute", "hour", "day", "week", "month", "year"];
/// The sliding log keeps an entry per admission; above this it is the wrong tool.
const MAX_SLIDING_LOG_LIMIT: u64 = 100_000;
/// Spans shorter than this cannot be flushed on time.
const MIN_SPAN: Duration = Duration::from_millis(10);
const MAX_SPANS: i64 = 1000;

fn unit_duration(unit: &str) -> Option<Duration> {
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
    policy: Option<&Spanned<String>>,
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
        && cooldown > rate.window()
    {
        return Err(loc(
            "cooldown",
            format!(
                "cooldown ({}) is longer than the window ({}); a blocked key would stay blocked after its quota is back; use at most the window, or 0s for until the window ends",
                sluice_core::format_duration(cooldown),
                sluice_core::format_duration(rate.window())
            ),
        ));
    }
    Ok(())
}

struct Builder<'a> {
    domain: &'a str,
    rules: Vec<Rule>,
    nodes: Vec<Node>,
    names: HashMap<String, (u64, u64)>,
    /// (rule index, replaced name and its location) to resolve once all names are known.
    pending_replaces: Vec<(Located, String)>,
}

impl Builder<'_> {
    fn level(&mut self, raw: &[RawDescriptor], parent_path: &str) -> Result<Level, Located> {
        let mut level = Level::default();
        let mut seen: HashMap<(String, Option<String>), u64> = HashMap::new();
        for descriptor in raw {
            let key = &descriptor.key;
            if key.value.is_empty() {
                return Err(Located::at(
                    key,
                    "descriptor `key` is empty; write the descriptor key the client sends, e.g. `key: user`",
                ));
            }
            let value = descriptor.value.as_ref().map(|v| v.value.clone());
            if let Some(v) = &descriptor.value
                && v.value.is_empty()
            {
                return Err(Located::at(
                    v,
                    "descriptor `value` is empty; remove `value:` to match every value of the key",
                ));
            }
            let slot = (key.value.clone(), value.clone());
            if let Some(first_line) = seen.get(&slot) {
                let what = match &value {
                    Some(v) => format!("`{}` with value `{v}`", key.value),
                    None => format!("`{}` without a value", key.value),
                };
                return Err(Located::at(
                    key,
                    format!(
                        "duplicate descriptor {what} at this level (first defined on line {first_line}); merge the two entries or give this one a different value"
                    ),
                ));
            }
            seen.insert(slot, key.referenced.line());
            let segment = match &value {
                Some(v) => format!("{}={v}", key.value),
                None => key.value.clone(),
            };
            let path = if parent_path.is_empty() {
                segment
            } else {
                format!("{parent_path}/{segment}")
            };
            let rules = self.limits(descriptor, &path)?;
            let children = self.level(&descriptor.descriptors, &path)?;
            let index = self.nodes.len();
            self.nodes.push(Node { rules, children });
            let matchers = level.keys.entry(key.value.clone()).or_default();
            match value {
                None => matchers.any = Some(index),
                Some(v) if v.ends_with('*') => {
                    matchers
                        .prefixes
                        .push((v.trim_end_matches('*').to_owned(), index));
                }
                Some(v) => {
                    matchers.exact.insert(v, index);
                }
            }
        }
        Ok(level)
    }

    fn limits(&mut self, descriptor: &RawDescriptor, path: &str) -> Result<Vec<usize>, Located> {
        let list: Vec<&Spanned<RawRateLimit>> = match (&descriptor.rate_limit, &descriptor.limits) {
            (Some(_), Some(limits)) => {
                return Err(Located::at(
                    limits,
                    "a descriptor has either `rate_limit` or `limits`, not both; move the `rate_limit` into the `limits` list",
                ));
            }
            (Some(one), None) => vec![one],
            (None, Some(many)) => {
                if many.value.is_empty() {
                    return Err(Located::at(
                        many,
                        "`limits` is empty; list at least one limit or remove `limits`",
                    ));
                }
                many.value.iter().collect()
            }
            (None, None) => Vec::new(),
        };
        let several = list.len() > 1;
        let mut indices = Vec::with_capacity(list.len());
        for (i, raw) in list.into_iter().enumerate() {
            let limit = self.limit(raw)?;
            let id = if several {
                format!("{}/{path}#{i}", self.domain)
            } else {
                format!("{}/{path}", self.domain)
            };
            let name = raw.value.name.as_ref().map(|n| n.value.clone());
            if let Some(n) = &raw.value.name {
                if n.value.is_empty() {
                    return Err(Located::at(
                        n,
                        "`name` is empty; give the rule a name or remove `name:`",
                    ));
                }
                if let Some((line, _)) = self.names.get(&n.value) {
                    return Err(Located::at(
                        n,
                        format!(
                            "rule name `{}` is already used on line {line}; rule names must be unique in a domain",
                            n.value
                        ),
                    ));
                }
                self.names.insert(
                    n.value.clone(),
                    (n.referenced.line(), n.referenced.column()),
                );
            }
            let replaces: Vec<String> = raw
                .value
                .replaces
                .iter()
                .map(|r| r.name.value.clone())
                .collect();
            for r in &raw.value.replaces {
                self.pending_replaces
                    .push((Located::at(&r.name, ""), r.name.value.clone()));
            }
            indices.push(self.rules.len());
            self.rules.push(Rule {
                index: self.rules.len(),
                id,
                path: path.to_owned(),
                name,
                limit,
                shadow_mode: descriptor.shadow_mode,
                detailed_metric: descriptor.detailed_metric,
                replaces,
                position: (raw.referenced.line(), raw.referenced.column()),
            });
        }
        Ok(indices)
    }

    fn limit(&self, raw: &Spanned<RawRateLimit>) -> Result<Limit, Located> {
        let r = &raw.value;
        if r.unlimited {
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
            return Ok(Limit::Unlimited);
        }
        let window = match (&r.unit, &r.window) {
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
        };
        let Some(rpu) = &r.requests_per_unit else {
            return Err(Located::at(
                raw,
                "this rate_limit has no `requests_per_unit`; add e.g. `requests_per_unit: 100`",
            ));
        };
        if rpu.value <= 0 {
            return Err(Located::at(
                rpu,
                format!(
                    "requests_per_unit must be at least 1, found {}; to block a key, use a small limit and a long window",
                    rpu.value
                ),
            ));
        }
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
            r.policy.as_ref(),
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
        let algorithm = settings.algorithm;
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
        if algorithm == Some(AlgorithmKind::SlidingWindowLog)
            && rate.limit() > MAX_SLIDING_LOG_LIMIT
        {
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
}

impl Domain {
    pub(crate) fn from_raw(raw: RawDomainFile, file: PathBuf) -> Result<Domain, Located> {
        if raw.domain.value.trim().is_empty() {
            return Err(Located::at(
                &raw.domain,
                "`domain` is empty; name the domain the clients send, e.g. `domain: edge`",
            ));
        }
        let mut builder = Builder {
            domain: &raw.domain.value,
            rules: Vec::new(),
            nodes: Vec::new(),
            names: HashMap::new(),
            pending_replaces: Vec::new(),
        };
        let root = builder.level(&raw.descriptors, "")?;
        for (at, name) in &builder.pending_replaces {
            if !builder.names.contains_key(name) {
                let known: Vec<&str> = builder.names.keys().map(String::as_str).collect();
                let hint = if known.is_empty() {
                    "no rule in this domain has a `name`; add `name:` to the rule to replace"
                        .to_owned()
                } else {
                    suggestion(name, &known)
                };
                return Err(Located {
                    message: format!("`replaces` names unknown rule `{name}`; {hint}"),
                    ..at.clone()
                });
            }
        }
        Ok(Domain {
            name: raw.domain.value.clone(),
            file,
            rules: builder.rules,
            nodes: builder.nodes,
            root,
        })
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Limit::Unlimited => f.write_str("unlimited"),
            Limit::Limited(spec) => write!(f, "{}", spec.rate),
        }
    }
}
