//! Warnings for configurations that load but do not do what they seem to say: `sluice check`
//! prints them and `sluice serve` logs them at start and on every reload.

use std::fmt;
use std::path::PathBuf;

use crate::rules::{AlgorithmKind, Domain, Limit, Mode, Rule};
use crate::service::ServiceConfig;

/// One warning, where it applies and what to do about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    /// The file it is about.
    pub file: PathBuf,
    /// Line and column, when the warning is about one place.
    pub position: Option<(u64, u64)>,
    /// What behaves differently from what it says, and what to write instead.
    pub message: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.position {
            Some((line, column)) => write!(
                f,
                "{}:{line}:{column}: {}",
                self.file.display(),
                self.message
            ),
            None => write!(f, "{}: {}", self.file.display(), self.message),
        }
    }
}

/// Every warning for `config`, in file order.
pub fn warnings(config: &ServiceConfig) -> Vec<Warning> {
    let mut out = Vec::new();
    for domain in config.rules.domains() {
        for rule in domain.rules() {
            rule_warnings(config, domain, rule, &mut out);
        }
    }
    for g in &config.gateways {
        let Some(domain) = config.rules.domain(&g.domain) else {
            continue;
        };
        for (r, route) in g.routes.iter().enumerate() {
            for (d, actions) in route.rate_limits.iter().enumerate() {
                let keys: Vec<&str> = actions.iter().map(|a| a.descriptor_key()).collect();
                let required: Vec<&str> = actions
                    .iter()
                    .filter(|a| !a.skippable())
                    .map(|a| a.descriptor_key())
                    .collect();
                if !keys.is_empty() && !domain.limits_keys(&keys) && !domain.limits_keys(&required)
                {
                    out.push(Warning {
                        file: config.file.clone(),
                        position: None,
                        message: format!(
                            "gateway {}: routes[{r}].rate_limits[{d}] builds descriptors ({}) that no rule of domain `{}` matches, so it never limits; add a rule with these keys in order to {}",
                            g.listen,
                            keys.join(", "),
                            domain.name(),
                            domain.file().display()
                        ),
                    });
                }
            }
        }
    }
    for dir in &config.empty_rule_dirs {
        out.push(Warning {
            file: config.file.clone(),
            position: None,
            message: format!(
                "rules: `{}` holds no rule file (`*.yaml` or `*.yml`), so it adds no rule; check the path (relative to this file) or the volume mounted there",
                dir.display()
            ),
        });
    }
    if config.rules.domains().next().is_none() {
        out.push(Warning {
            file: config.file.clone(),
            position: None,
            message: "no rules (`allow_empty_rules: true`): every call is answered with \"unknown domain\" until a reload brings rules".to_owned(),
        });
    }
    // (A rule file served alone names its own domain for the API: not a choice to check.)
    let rule_file_alone = config.rule_paths.first() == Some(&config.file);
    if let Some(domain) = config.rules.domain(&config.api_domain)
        && !rule_file_alone
        && !domain.limits_keys(&["item", "user"])
        && !domain.limits_keys(&["item"])
    {
        out.push(Warning {
            file: config.file.clone(),
            position: None,
            message: format!(
                "api.domain `{}` has no rule for the descriptors /v1/acquire sends ([item, user], or [item] alone), so acquires are never limited; add `key: item` rules with a nested `key: user` to {}",
                domain.name(),
                domain.file().display()
            ),
        });
    }
    out
}

fn rule_warnings(config: &ServiceConfig, domain: &Domain, rule: &Rule, out: &mut Vec<Warning>) {
    let mut warn = |message: String| {
        out.push(Warning {
            file: domain.file().to_path_buf(),
            position: Some(rule.position),
            message: format!("rule `{}`: {message}", rule.path),
        });
    };
    let Limit::Limited(spec) = &rule.limit else {
        if rule.shadow_mode && matches!(rule.limit, Limit::Unlimited) {
            warn(
                "`shadow_mode` on an unlimited rule does nothing: it neither counts nor denies"
                    .to_owned(),
            );
        }
        return;
    };
    let r = spec.resolve(&config.defaults);
    let window_algorithm = matches!(
        r.algorithm,
        AlgorithmKind::FixedWindow | AlgorithmKind::SlidingWindow
    );
    if r.mode == Mode::Synced && !window_algorithm {
        warn(format!(
            "`{}` in synced mode runs on each instance alone (synced mode syncs window counts): N instances admit up to N times {}; use `fixed_window` or `sliding_window` to share the limit, `mode: exact` to run `{}` in the store, or `mode: local` to say it is per instance",
            r.algorithm.name(),
            r.rate.limit(),
            r.algorithm.name()
        ));
    }
    let synced = r.mode == Mode::Synced && window_algorithm;
    if !synced && spec.settings.spans.is_some() {
        warn(format!(
            "`spans` applies only to synced rules with a window algorithm; this {} `{}` rule ignores it",
            r.mode.name(),
            r.algorithm.name()
        ));
    }
    if (!synced || r.policy == crate::Policy::Reactive) && spec.settings.small_limits.is_some() {
        let policy = if synced { " `reactive`" } else { "" };
        warn(format!(
            "`small_limits` applies only to synced rules with a window algorithm and the predictive policy; this{policy} {} `{}` rule ignores it",
            r.mode.name(),
            r.algorithm.name()
        ));
    }
    if !synced && spec.settings.policy.is_some() {
        warn(format!(
            "`policy` applies only to synced rules with a window algorithm; this {} `{}` rule ignores it",
            r.mode.name(),
            r.algorithm.name()
        ));
    }
    if rule.shadow_mode {
        for name in &rule.replaces {
            let enforcing = domain
                .rules()
                .iter()
                .filter(|o| o.name.as_deref() == Some(name.as_str()))
                .any(|o| !o.shadow_mode && matches!(o.limit, Limit::Limited(_)));
            if enforcing {
                warn(format!(
                    "a shadow rule replaces the enforcing rule `{name}`: when both match, `{name}` is dropped and nothing is enforced; remove `replaces` or `shadow_mode`"
                ));
            }
        }
    }
}
