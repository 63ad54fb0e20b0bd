//! Loading a configuration from disk: a `sluice.yaml`, or a rule file alone.

use std::path::Path;

use crate::domain_file::{parse, parse_domain, read};
use crate::error::ConfigError;
use crate::fields::HeaderStyle;
use crate::raw::RawServiceFile;
use crate::rules::RuleSet;
use crate::service::{Listen, ServiceConfig};
use crate::target::StoreConfig;

/// Loads `file`, which is either a `sluice.yaml` or a single Envoy-format rule file (told apart
/// by a top-level `domain:` or `descriptors:` key, whatever else is wrong with it). A rule file alone runs with every other setting at its default.
pub fn load(file: &Path) -> Result<ServiceConfig, ConfigError> {
    let text = read(file)?;
    let is_rule_file = looks_like_rule_file(&text);
    if is_rule_file {
        let domain = parse_domain(file, &text)?;
        let api_domain = domain.name().to_owned();
        return Ok(ServiceConfig {
            file: file.to_path_buf(),
            store: StoreConfig::Memory,
            listen: Listen::default(),
            rule_paths: vec![file.to_path_buf()],
            rules: RuleSet::new(vec![domain])?,
            empty_rule_dirs: Vec::new(),
            allow_empty_rules: false,
            defaults: Default::default(),
            api_domain,
            adhoc_max_keys: crate::service::DEFAULT_ADHOC_MAX_KEYS,
            api_workers: None,
            headers: HeaderStyle::Ietf,
            rls_response_headers: false,
            rlqs: crate::RlqsSettings::default(),
            gateways: Vec::new(),
            expected_instances: 1,
            max_keys_per_rule: crate::service::DEFAULT_MAX_KEYS_PER_RULE,
            flush_chunk_items: crate::service::DEFAULT_FLUSH_CHUNK_ITEMS,
            store_timeout: crate::service::DEFAULT_STORE_TIMEOUT,
            flush_timeout_per_key: crate::service::DEFAULT_FLUSH_TIMEOUT_PER_KEY,
            exact: Default::default(),
            lifecycle: Default::default(),
            store_ca_file: None,
            listeners: Default::default(),
            access: Default::default(),
            geoip: None,
        });
    }
    let config = parse_service(file, &text)?;
    if config.rules.domains().next().is_none() && !config.allow_empty_rules {
        return Err(ConfigError::Invalid {
            file: file.to_path_buf(),
            line: 1,
            column: 1,
            message: no_rules(&config),
        });
    }
    Ok(config)
}

/// Why a `sluice.yaml` loaded no rule, and what to write instead: a service without rules
/// answers every call with "unknown domain".
fn no_rules(config: &ServiceConfig) -> String {
    let served = "a service without rules answers every call with \"unknown domain\"; set `allow_empty_rules: true` to start one anyway";
    if config.rule_paths.is_empty() {
        return format!(
            "no rules: add `rules: [rules/]` (a directory of rule files, relative to this file) or run with a rule file as the config; {served}"
        );
    }
    let named: Vec<String> = config
        .rule_paths
        .iter()
        .map(|p| format!("`{}`", p.display()))
        .collect();
    format!(
        "no rules: `rules` names {} and no rule file is there (a directory is read for `*.yaml` and `*.yml` files); check the path or the volume mounted there; {served}",
        named.join(", ")
    )
}

/// Parses a `sluice.yaml` from text; `file` names it in errors and anchors relative `rules:`
/// paths (which are read from disk). Without `rules:` nothing is read, which lets a program
/// or a test build gateway routes from YAML text alone.
pub fn parse_service(file: &Path, text: &str) -> Result<ServiceConfig, ConfigError> {
    let secrets = crate::redact::secrets_in(text);
    let redact = |error| redact(error, &secrets);
    let raw: RawServiceFile = if text.trim().is_empty() {
        RawServiceFile::default()
    } else {
        parse(file, text).map_err(redact)?
    };
    ServiceConfig::from_raw(raw, file).map_err(redact)
}

/// An error about a `sluice.yaml` may quote its text, store URLs included: no password in it,
/// neither one that looks like a password in the quote nor one the file holds.
fn redact(error: ConfigError, secrets: &[&str]) -> ConfigError {
    match error {
        ConfigError::Invalid {
            file,
            line,
            column,
            message,
        } => {
            let mut message = crate::redact::redact_secrets(&message);
            for secret in secrets {
                message = message.replace(secret, "***");
            }
            ConfigError::Invalid {
                file,
                line,
                column,
                message,
            }
        }
        other => other,
    }
}

/// Whether a file is a rule file: a top-level `domain` or `descriptors` key (quoted or not),
/// so that a rule file with mistakes gets errors about rules, not about `sluice.yaml`.
pub(crate) fn looks_like_rule_file(text: &str) -> bool {
    text.lines().any(|line| {
        let Some(first) = line.chars().next() else {
            return false;
        };
        if first.is_whitespace() || first == '#' || first == '-' {
            return false;
        }
        let key = line.split(':').next().unwrap_or("").trim();
        let key = key.trim_matches(|c| c == '"' || c == '\'');
        line.contains(':') && (key == "domain" || key == "descriptors")
    })
}
