//! `sluice.yaml`: the service configuration (docs/CONFIG.md).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_saphyr::Spanned;

use crate::error::{ConfigError, Located, suggestion};
use crate::fields::{HeaderStyle, non_empty, parse_addr, parse_headers};
use crate::gateway::{Gateway, gateway};
use crate::raw::{RawListen, RawServiceFile};
use crate::rules::{RuleSet, RuleSettings, parse_settings};
use crate::store::parse_store;
use crate::target::StoreConfig;

/// The listeners.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listen {
    /// HTTP/JSON API.
    pub http: SocketAddr,
    /// Envoy RLS gRPC.
    pub grpc: SocketAddr,
    /// Admin: metrics, health, reload.
    pub admin: SocketAddr,
}

impl Default for Listen {
    fn default() -> Self {
        Self {
            http: SocketAddr::from(([127, 0, 0, 1], 8080)),
            grpc: SocketAddr::from(([127, 0, 0, 1], 8081)),
            admin: SocketAddr::from(([127, 0, 0, 1], 9090)),
        }
    }
}

/// A validated `sluice.yaml` with its rule files loaded.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ServiceConfig {
    /// The file.
    pub file: PathBuf,
    /// The store.
    pub store: StoreConfig,
    /// Listeners.
    pub listen: Listen,
    /// Rule files and directories, resolved against the config file's directory.
    pub rule_paths: Vec<PathBuf>,
    /// The loaded rules.
    pub rules: RuleSet,
    /// Entries of `rules:` that named a directory holding no rule file (a warning).
    pub empty_rule_dirs: Vec<PathBuf>,
    /// Whether a config without any rule may load (`allow_empty_rules`, default `false`):
    /// such a service answers every call with "unknown domain".
    pub allow_empty_rules: bool,
    /// Settings for rules that do not set them.
    pub defaults: RuleSettings,
    /// Domain of `/v1/acquire` and `/v1/refill`.
    pub api_domain: String,
    /// Keys all ad-hoc limits of `/v1/acquire` keep at once (`api.adhoc_max_keys`, default
    /// [`DEFAULT_ADHOC_MAX_KEYS`]); a new key beyond it is refused.
    pub adhoc_max_keys: usize,
    /// Worker threads of the HTTP/JSON API, and as many of the gRPC listener (`api.workers`;
    /// `None`: one per CPU), each with its own runtime and socket, as a gateway's.
    pub api_workers: Option<std::num::NonZeroUsize>,
    /// Header style.
    pub headers: HeaderStyle,
    /// Whether Envoy RLS answers (gRPC and `/json`) carry `x-ratelimit-*` headers in
    /// `response_headers_to_add` (`rls.response_headers`, default `false`, as Envoy's ratelimit
    /// service without `LIMIT_RESPONSE_HEADERS_ENABLED`).
    pub rls_response_headers: bool,
    /// The bounds of RLQS streams (`rlqs:`).
    pub rlqs: crate::RlqsSettings,
    /// Gateways.
    pub gateways: Vec<Gateway>,
    /// The most instances the deployment runs (`expected_instances`, default 1): the `N` of
    /// the seed's MAX/N fallback, the share a newly started instance keeps to before it has
    /// heard from the store, and the split of `exact` mode's `on_store_error: local`.
    pub expected_instances: u64,
    /// The most keys (distinct descriptor values) a rule tracks on one instance
    /// (`max_keys_per_rule`, default 1,000,000); keys beyond it share the rule's fixed-size
    /// sketch. With keys of at most 128 bytes this bounds a rule's memory.
    pub max_keys_per_rule: usize,
    /// Most keys per flush pipeline (`flush_chunk_items`, default 1,000): a larger flush goes
    /// in several, each within the store's per-call timeout.
    pub flush_chunk_items: usize,
    /// The longest wait for one store call (`store_timeout`, default 500 ms): an exact-mode
    /// backstop (`exact.timeout` is shorter), a settling, a clock read, a flush's base.
    pub store_timeout: std::time::Duration,
    /// Added to a flush pipeline's timeout per key it carries (`flush_timeout_per_key`,
    /// default 100 µs: a chunk of 1,000 keys may take 600 ms).
    pub flush_timeout_per_key: std::time::Duration,
    /// How `exact` mode calls the store (`exact:`).
    pub exact: crate::ExactCalls,
    /// How a stopping instance drains and where it keeps counts the store could not take.
    pub lifecycle: crate::Lifecycle,
    /// PEM root certificate(s) to trust for a `rediss://` store instead of the built-in web
    /// roots (`store_ca_file`, resolved against the config file's directory).
    pub store_ca_file: Option<PathBuf>,
    /// How every listener protects itself (`listeners:`).
    pub listeners: crate::ListenerLimits,
    /// Bearer tokens for the admin endpoints and the APIs (`access:`).
    pub access: crate::Access,
    /// The databases of the gateways' `country` and `asn` actions (`geoip:`).
    pub geoip: Option<crate::GeoIpConfig>,
}

/// `flush_chunk_items` when the file does not set it. A chunk's commands are encoded and its
/// replies read on the request runtime, so a chunk is also the longest a flush holds up a
/// request there: with 1,000 keys a 1M-key flush kept checks within about 13 ms on a busy
/// 2-CPU machine (5,000: 30 ms) and still finished within two spans (docs/RELIABILITY.md).
pub const DEFAULT_FLUSH_CHUNK_ITEMS: usize = 1_000;

/// `store_timeout` when the file does not set it.
pub const DEFAULT_STORE_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(500);

/// `flush_timeout_per_key` when the file does not set it.
pub const DEFAULT_FLUSH_TIMEOUT_PER_KEY: std::time::Duration =
    std::time::Duration::from_micros(100);

/// `api.adhoc_max_keys` when the file does not set it: about 100 MiB of keys.
pub const DEFAULT_ADHOC_MAX_KEYS: usize = 1_000_000;

/// `max_keys_per_rule` when the file does not set it.
pub const DEFAULT_MAX_KEYS_PER_RULE: usize = 1_000_000;

impl ServiceConfig {
    /// Validates a parsed `sluice.yaml` and loads the rule files it names.
    pub(crate) fn from_raw(raw: RawServiceFile, file: &Path) -> Result<Self, ConfigError> {
        let err = |e: Located| e.in_file(file);
        let store = raw
            .store
            .as_ref()
            .map(parse_store)
            .transpose()
            .map_err(err)?
            .unwrap_or(StoreConfig::Memory);
        let listen = parse_listen(&raw.listen).map_err(err)?;
        let d = &raw.defaults;
        let defaults = parse_settings(
            d.algorithm.as_ref(),
            d.mode.as_ref(),
            d.spans.as_ref(),
            d.cooldown.as_ref(),
            d.on_store_error.as_ref(),
            (d.policy.as_ref(), d.small_limits.as_ref()),
        )
        .map_err(err)?;
        let headers = raw
            .headers
            .as_ref()
            .map(parse_headers)
            .transpose()
            .map_err(err)?
            .unwrap_or(HeaderStyle::Ietf);
        let gateways: Vec<Gateway> = raw
            .gateways
            .iter()
            .map(|g| gateway(g, headers))
            .collect::<Result<_, _>>()
            .map_err(err)?;
        let base = file.parent().unwrap_or(Path::new("."));
        let geoip = geoip_of(&raw, base).map_err(err)?;
        let (rule_paths, rules, empty_rule_dirs) = load_rules(&raw, file, base)?;
        check_rules_fit(&rules, &defaults, &store, file)?;
        let api_domain = api_domain_of(&raw, &rules, &gateways).map_err(err)?;
        let (expected_instances, max_keys_per_rule, adhoc_max_keys, flush_chunk_items) =
            counts(&raw).map_err(err)?;
        let (store_timeout, flush_timeout_per_key) = timeouts(&raw).map_err(err)?;
        Ok(ServiceConfig {
            file: file.to_path_buf(),
            store,
            listen,
            rule_paths,
            rules,
            empty_rule_dirs,
            allow_empty_rules: raw.allow_empty_rules.unwrap_or(false),
            defaults,
            api_domain,
            adhoc_max_keys,
            api_workers: raw
                .api
                .workers
                .as_ref()
                .map(crate::gateway::parse_workers)
                .transpose()
                .map_err(err)?,
            headers,
            rls_response_headers: raw.rls.response_headers.unwrap_or(false),
            rlqs: crate::rlqs::parse_rlqs(&raw.rlqs).map_err(err)?,
            gateways,
            expected_instances,
            max_keys_per_rule,
            flush_chunk_items,
            store_timeout,
            flush_timeout_per_key,
            exact: crate::exact_calls::parse_exact_calls(&raw.exact).map_err(err)?,
            lifecycle: crate::lifecycle::parse_lifecycle(
                raw.shutdown_timeout.as_ref(),
                raw.state_dir.as_ref(),
                base,
            )
            .map_err(err)?,
            store_ca_file: raw.store_ca_file.as_ref().map(|f| base.join(&f.value)),
            listeners: crate::protection::parse_listeners(&raw.listeners).map_err(err)?,
            access: crate::protection::parse_access(&raw.access, base).map_err(err)?,
            geoip,
        })
    }
}

/// The three listeners' addresses, each defaulting on its own.
fn parse_listen(raw: &RawListen) -> Result<Listen, Located> {
    let defaults = Listen::default();
    let addr = |field: &str, value: &Option<Spanned<String>>, default: SocketAddr| {
        value.as_ref().map_or(Ok(default), |a| parse_addr(field, a))
    };
    Ok(Listen {
        http: addr("listen.http", &raw.http, defaults.http)?,
        grpc: addr("listen.grpc", &raw.grpc, defaults.grpc)?,
        admin: addr("listen.admin", &raw.admin, defaults.admin)?,
    })
}

/// The rule files `rules:` names, read and parsed: the paths as written (relative to `file`),
/// the rules, and the directories that held no rule file.
fn load_rules(
    raw: &RawServiceFile,
    file: &Path,
    base: &Path,
) -> Result<(Vec<PathBuf>, RuleSet, Vec<PathBuf>), ConfigError> {
    let rule_entries = raw.rules.clone().unwrap_or_default();
    let rule_paths: Vec<PathBuf> = rule_entries.iter().map(|p| base.join(&p.value)).collect();
    let mut domains = Vec::new();
    let mut empty_rule_dirs = Vec::new();
    for (entry, path) in rule_entries.iter().zip(&rule_paths) {
        let files = crate::domain_file::rule_files(path).map_err(|e| {
            Located::at(
                entry,
                format!(
                    "cannot read rules `{}`: {e}; check the path (it is relative to this file)",
                    entry.value
                ),
            )
            .in_file(file)
        })?;
        if files.is_empty() {
            empty_rule_dirs.push(path.clone());
        }
        for f in files {
            domains.push(crate::domain_file::load_domain_file(&f)?);
        }
    }
    let mut rules = RuleSet::new(domains)?;
    if raw.defaults.shadow_mode == Some(true) {
        rules.shadow_all();
    }
    Ok((rule_paths, rules, empty_rule_dirs))
}

/// Every limited rule fits the file's defaults, and none is `exact` over etcd.
fn check_rules_fit(
    rules: &RuleSet,
    defaults: &RuleSettings,
    store: &StoreConfig,
    file: &Path,
) -> Result<(), ConfigError> {
    for domain in rules.domains() {
        for rule in domain.rules() {
            if let crate::rules::Limit::Limited(spec) = &rule.limit {
                let merged = RuleSettings {
                    spans: spec.settings.spans.or(defaults.spans),
                    cooldown: spec.settings.cooldown.or(defaults.cooldown),
                    ..Default::default()
                };
                let position = rule.position;
                if matches!(store, StoreConfig::Etcd(_))
                    && spec.settings.mode.or(defaults.mode) == Some(crate::rules::Mode::Exact)
                {
                    return Err(Located {
                        line: position.0,
                        column: position.1,
                        message: format!(
                            "rule `{}` is in `exact` mode, which the etcd store does not run (one etcd transaction per request is too slow to be worth it); use `mode: synced`, or a Redis store for exact limits",
                            rule.path
                        ),
                    }
                    .in_file(domain.file()));
                }
                crate::rules::check_settings_fit(spec.rate, &merged, &|_| position).map_err(
                    |mut e| {
                        e.message =
                            format!("{} (with the defaults of {})", e.message, file.display());
                        e.in_file(domain.file())
                    },
                )?;
            }
        }
    }
    Ok(())
}

/// `geoip:`, which the gateways' `country` and `asn` actions need.
fn geoip_of(raw: &RawServiceFile, base: &Path) -> Result<Option<crate::GeoIpConfig>, Located> {
    let geoip = raw
        .geoip
        .as_ref()
        .map(|g| crate::geoip::parse_geoip(g, base))
        .transpose()?;
    if geoip.is_none()
        && let Some(action) = raw
            .gateways
            .iter()
            .find_map(crate::gateway::first_geo_action)
    {
        return Err(Located::at(
            action,
            "the `country` and `asn` actions look the client address up in `geoip.databases`; add `geoip: { databases: [country.mmdb] }` to this file",
        ));
    }
    Ok(geoip)
}

/// `api.domain` (`default` when unset); with `rules:`, it and every gateway's domain must be
/// defined by a rule file.
fn api_domain_of(
    raw: &RawServiceFile,
    rules: &RuleSet,
    gateways: &[Gateway],
) -> Result<String, Located> {
    let api_domain = match &raw.api.domain {
        Some(d) => {
            let name = non_empty("api.domain", d)?;
            if raw.rules.is_some() && rules.domain(&name).is_none() {
                return Err(unknown_domain(d, rules));
            }
            name
        }
        None => "default".to_owned(),
    };
    if raw.rules.is_some() {
        for (g, raw_g) in gateways.iter().zip(&raw.gateways) {
            if rules.domain(&g.domain).is_none() {
                return Err(unknown_domain(&raw_g.domain, rules));
            }
        }
    }
    Ok(api_domain)
}

/// `expected_instances`, `max_keys_per_rule`, `api.adhoc_max_keys` and `flush_chunk_items`,
/// within their bounds.
fn counts(raw: &RawServiceFile) -> Result<(u64, usize, usize, usize), Located> {
    let count = crate::duration::bounded_count;
    let expected_instances = count(
        "expected_instances",
        raw.expected_instances.as_ref(),
        1,
        (1, 100_000),
        "write the most instances the deployment runs",
    )?;
    let max_keys_per_rule = count(
        "max_keys_per_rule",
        raw.max_keys_per_rule.as_ref(),
        DEFAULT_MAX_KEYS_PER_RULE as u64,
        (1, 100_000_000),
        "each tracked key takes about 200 bytes (docs/RELIABILITY.md)",
    )? as usize;
    let adhoc_max_keys = count(
        "api.adhoc_max_keys",
        raw.api.adhoc_max_keys.as_ref(),
        DEFAULT_ADHOC_MAX_KEYS as u64,
        (1, 100_000_000),
        "each ad-hoc key takes about 100 bytes (docs/RELIABILITY.md)",
    )? as usize;
    let flush_chunk_items = count(
        "flush_chunk_items",
        raw.flush_chunk_items.as_ref(),
        DEFAULT_FLUSH_CHUNK_ITEMS as u64,
        (1, 1_000_000),
        "each chunk is one call to the store (its timeout grows with flush_timeout_per_key)",
    )? as usize;
    Ok((
        expected_instances,
        max_keys_per_rule,
        adhoc_max_keys,
        flush_chunk_items,
    ))
}

/// `store_timeout` and `flush_timeout_per_key`, within their bounds.
fn timeouts(raw: &RawServiceFile) -> Result<(Duration, Duration), Located> {
    let store_timeout = crate::duration::bounded_duration(
        "store_timeout",
        raw.store_timeout.as_ref(),
        DEFAULT_STORE_TIMEOUT,
        &crate::duration::Bounds {
            min: std::time::Duration::from_millis(10),
            max: std::time::Duration::from_secs(60),
            range: "10ms and 1m",
            example: "`500ms` or `2s`",
        },
    )?;
    let flush_timeout_per_key = crate::duration::bounded_duration(
        "flush_timeout_per_key",
        raw.flush_timeout_per_key.as_ref(),
        DEFAULT_FLUSH_TIMEOUT_PER_KEY,
        &crate::duration::Bounds {
            min: std::time::Duration::ZERO,
            max: std::time::Duration::from_millis(10),
            range: "0s and 10ms",
            example: "`100us` or `1ms`",
        },
    )?;
    Ok((store_timeout, flush_timeout_per_key))
}

fn unknown_domain(name: &Spanned<String>, rules: &RuleSet) -> Located {
    let known: Vec<&str> = rules.domains().map(|d| d.name()).collect();
    let hint = if known.is_empty() {
        "no rule file defines a domain".to_owned()
    } else {
        suggestion(&name.value, &known)
    };
    Located::at(
        name,
        format!(
            "domain `{}` is not defined by any rule file; {hint}",
            name.value
        ),
    )
}
