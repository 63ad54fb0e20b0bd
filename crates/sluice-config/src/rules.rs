//! Validated rules: a domain's descriptor tree with its limits.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use serde_saphyr::Spanned;

use crate::error::{Located, suggestion};
use crate::raw::{RawDescriptor, RawDomainFile, RawRateLimit};
pub use crate::settings::{
    AlgorithmKind, BUILTIN_SPANS, Limit, LimitSpec, Mode, OnStoreError, Policy, ResolvedLimit,
    RuleSettings, SmallLimits,
};
pub(crate) use crate::settings::{check_settings_fit, parse_positive_duration, parse_settings};

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
    /// Whether the rule file says `shadow_mode` at all: `defaults.shadow_mode` applies to the
    /// rules that do not.
    pub(crate) shadow_written: bool,
    /// Counts decisions per descriptor value (`detailed_metric` or `value_to_metric`, bounded).
    pub detailed_metric: bool,
    /// `quota_mode`: over this limit, a request is denied only when every quota-mode rule it
    /// matched is over too (or a normal rule is).
    pub quota_mode: bool,
    /// `metadata` of the descriptor: returned to Envoy in the response's dynamic metadata.
    pub metadata: Option<serde_json::Value>,
    /// `share_threshold`: (entry index, wildcard) for each entry matched by a sharing
    /// wildcard; that entry's value counts as the pattern, so all matching values share one
    /// counter.
    pub shared_values: Vec<(usize, String)>,
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
    /// Values with `*`, tried in file order (the first that matches wins).
    wildcards: Vec<(crate::wildcard::Wildcard, usize)>,
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

    /// Whether some rule applies to a descriptor with exactly these keys, whatever its
    /// values (a value rule counts: some values are limited).
    pub fn limits_keys(&self, keys: &[&str]) -> bool {
        fn walk(domain: &Domain, level: &Level, keys: &[&str]) -> bool {
            let Some((first, rest)) = keys.split_first() else {
                return false;
            };
            let Some(m) = level.keys.get(*first) else {
                return false;
            };
            m.exact
                .values()
                .chain(m.wildcards.iter().map(|(_, n)| n))
                .chain(m.any.iter())
                .any(|&n| {
                    let node = &domain.nodes[n];
                    if rest.is_empty() {
                        !node.rules.is_empty()
                    } else {
                        walk(domain, &node.children, rest)
                    }
                })
        }
        walk(self, &self.root, keys)
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
            .wildcards
            .iter()
            .find(|(w, _)| w.matches(value))
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

    /// Puts every rule with a limit in shadow mode but those whose file says `shadow_mode:
    /// false` (`defaults.shadow_mode: true`: a dry run that counts and reports every denial
    /// and enforces none).
    pub(crate) fn shadow_all(&mut self) {
        for domain in self.domains.values_mut() {
            for rule in &mut domain.rules {
                if !matches!(rule.limit, Limit::Unlimited) && !rule.shadow_written {
                    rule.shadow_mode = true;
                }
            }
        }
    }
}

struct Builder<'a> {
    domain: &'a str,
    rules: Vec<Rule>,
    nodes: Vec<Node>,
    names: HashMap<String, (u64, u64)>,
    /// (rule index, replaced name and its location) to resolve once all names are known.
    pending_replaces: Vec<(Located, String)>,
    /// For each level above the one being built: the sharing wildcard of its entry, if any.
    share_stack: Vec<Option<String>>,
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
            // An empty value is no value (every value of the key), as in Envoy's service.
            let value = descriptor
                .value
                .as_ref()
                .map(|v| v.value.clone())
                .filter(|v| !v.is_empty());
            let slot = (key.value.clone(), value.clone());
            if let Some(first_line) = seen.get(&slot) {
                return Err(duplicate(key, value.as_deref(), *first_line));
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
            let shared = sharing_wildcard(descriptor, value.as_deref())?;
            check_metadata(descriptor)?;
            self.share_stack.push(shared);
            let rules = self.limits(descriptor, &path)?;
            let children = self.level(&descriptor.descriptors, &path)?;
            self.share_stack.pop();
            let index = self.nodes.len();
            self.nodes.push(Node { rules, children });
            let matchers = level.keys.entry(key.value.clone()).or_default();
            matchers.add(value, index);
        }
        Ok(level)
    }

    fn limits(&mut self, descriptor: &RawDescriptor, path: &str) -> Result<Vec<usize>, Located> {
        let list = limit_list(descriptor)?;
        let several = list.len() > 1;
        let mut indices = Vec::with_capacity(list.len());
        for (i, raw) in list.into_iter().enumerate() {
            let limit = crate::limit::parse_limit(raw)?;
            let id = if several {
                format!("{}/{path}#{i}", self.domain)
            } else {
                format!("{}/{path}", self.domain)
            };
            let name = self.claim_name(raw)?;
            let replaces = self.replaces(raw, name.as_deref())?;
            indices.push(self.rules.len());
            self.rules.push(Rule {
                index: self.rules.len(),
                id,
                path: path.to_owned(),
                name,
                limit,
                shadow_mode: descriptor.shadow_mode.unwrap_or(false),
                shadow_written: descriptor.shadow_mode.is_some(),
                detailed_metric: descriptor.detailed_metric || descriptor.value_to_metric,
                quota_mode: descriptor.quota_mode,
                metadata: descriptor.metadata.as_ref().map(|m| m.value.clone()),
                shared_values: self
                    .share_stack
                    .iter()
                    .enumerate()
                    .filter_map(|(depth, w)| w.clone().map(|w| (depth, w)))
                    .collect(),
                replaces,
                position: (raw.referenced.line(), raw.referenced.column()),
            });
        }
        Ok(indices)
    }

    /// The rule's name, if it has one: not empty, and unique in the domain.
    fn claim_name(&mut self, raw: &Spanned<RawRateLimit>) -> Result<Option<String>, Located> {
        let Some(n) = &raw.value.name else {
            return Ok(None);
        };
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
        Ok(Some(n.value.clone()))
    }

    /// The rules this one replaces, by name (resolved once every name is known).
    fn replaces(
        &mut self,
        raw: &Spanned<RawRateLimit>,
        name: Option<&str>,
    ) -> Result<Vec<String>, Located> {
        let mut replaces = Vec::with_capacity(raw.value.replaces.len());
        for entry in &raw.value.replaces {
            let Some(replaced) = entry
                .value
                .as_ref()
                .and_then(|r| r.name.as_ref())
                .filter(|n| !n.value.is_empty())
            else {
                return Err(Located::at(
                    entry,
                    "this `replaces` entry names no rule; write `- name: <the other rule's name>` or remove the entry",
                ));
            };
            if name == Some(replaced.value.as_str()) {
                return Err(Located::at(
                    replaced,
                    format!(
                        "rule `{}` replaces itself; `replaces` names another rule that this one takes the place of when both match",
                        replaced.value
                    ),
                ));
            }
            self.pending_replaces
                .push((Located::at(replaced, ""), replaced.value.clone()));
            replaces.push(replaced.value.clone());
        }
        Ok(replaces)
    }
}

impl KeyMatchers {
    /// The node of a value: exact, a wildcard (with `*`), or any value (none).
    fn add(&mut self, value: Option<String>, index: usize) {
        match value {
            None => self.any = Some(index),
            Some(v) if v.contains('*') => {
                if let Some(w) = crate::wildcard::Wildcard::new(&v) {
                    self.wildcards.push((w, index));
                }
            }
            Some(v) => {
                self.exact.insert(v, index);
            }
        }
    }
}

/// The error for a descriptor whose key and value another entry of its level has.
fn duplicate(key: &Spanned<String>, value: Option<&str>, first_line: u64) -> Located {
    let what = match value {
        Some(v) => format!("`{}` with value `{v}`", key.value),
        None => format!("`{}` without a value", key.value),
    };
    Located::at(
        key,
        format!(
            "duplicate descriptor {what} at this level (first defined on line {first_line}); merge the two entries or give this one a different value"
        ),
    )
}

/// The wildcard whose values share one counter (`share_threshold: true`), if any.
fn sharing_wildcard(
    descriptor: &RawDescriptor,
    value: Option<&str>,
) -> Result<Option<String>, Located> {
    match &descriptor.share_threshold {
        Some(flag) if flag.value => match value {
            Some(v) if v.contains('*') => Ok(Some(v.to_owned())),
            _ => Err(Located::at(
                flag,
                "`share_threshold` applies only to a wildcard value (one with `*`, e.g. `value: files/*`): all values it matches then share one counter",
            )),
        },
        _ => Ok(None),
    }
}

fn check_metadata(descriptor: &RawDescriptor) -> Result<(), Located> {
    match &descriptor.metadata {
        Some(metadata) if !metadata.value.is_object() => Err(Located::at(
            metadata,
            "`metadata` is a mapping of names to values (e.g. `metadata: { tier: gold }`); it is returned to Envoy as dynamic metadata",
        )),
        _ => Ok(()),
    }
}

/// A descriptor's limits: its `rate_limit`, or its `limits` list (not both, and not empty).
fn limit_list(descriptor: &RawDescriptor) -> Result<Vec<&Spanned<RawRateLimit>>, Located> {
    match (&descriptor.rate_limit, &descriptor.limits) {
        (Some(_), Some(limits)) => Err(Located::at(
            limits,
            "a descriptor has either `rate_limit` or `limits`, not both; move the `rate_limit` into the `limits` list",
        )),
        (Some(one), None) => Ok(vec![one]),
        (None, Some(many)) => {
            if many.value.is_empty() {
                return Err(Located::at(
                    many,
                    "`limits` is empty; list at least one limit or remove `limits`",
                ));
            }
            Ok(many.value.iter().collect())
        }
        (None, None) => Ok(Vec::new()),
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
            share_stack: Vec::new(),
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
