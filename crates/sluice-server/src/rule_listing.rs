//! The rule tree as `sluice check` prints it and `GET /rlconfig` serves it, and the warnings
//! logged at start and after each reload.

use std::fmt::Write as _;

use sluice_config::{
    AlgorithmKind, Limit, Mode, Policy, ResolvedLimit, ServiceConfig, SmallLimits, StoreConfig,
};

/// From how many instances a synced rule's limit is too small to share and each request is
/// decided at the store (a Redis store, the predictive policy, `small_limits: store`, a window
/// algorithm and no penalty beyond the window; see docs/SYNCED.md).
fn decided_at_store_from(r: &ResolvedLimit, store: &StoreConfig) -> Option<u64> {
    let window_algorithm = matches!(
        r.algorithm,
        AlgorithmKind::FixedWindow | AlgorithmKind::SlidingWindow
    );
    let applies = matches!(store, StoreConfig::Redis(_))
        && r.mode == Mode::Synced
        && window_algorithm
        && r.policy == Policy::Predictive
        && r.small_limits == SmallLimits::Store
        && r.cooldown <= r.rate.window();
    let per_instance = u64::from(r.spans) * sluice_engine::SMALL_LIMIT_SHARES;
    applies.then(|| (r.rate.limit() / per_instance + 1).max(2))
}

/// Renders every domain's rules, one line per rule.
pub fn render(config: &ServiceConfig) -> String {
    let mut out = String::new();
    for domain in config.rules.domains() {
        let _ = writeln!(
            out,
            "domain {} ({}): {}",
            domain.name(),
            domain.file().display(),
            if domain.rules().len() == 1 {
                "1 rule".to_owned()
            } else {
                format!("{} rules", domain.rules().len())
            }
        );
        for rule in domain.rules() {
            let mut extra = String::new();
            let (limit, window, algorithm, mode) = match &rule.limit {
                Limit::Unlimited => ("unlimited".to_owned(), "-".to_owned(), "-", "-"),
                Limit::Blocked(window) => (
                    "0".to_owned(),
                    sluice_core::format_duration(*window),
                    "blocked",
                    "-",
                ),
                Limit::Limited(spec) => {
                    let r = spec.resolve(&config.defaults);
                    if let Some(from) = decided_at_store_from(&r, &config.store) {
                        let _ = write!(
                            extra,
                            "  decided at the store once the fleet has {from} instances or more"
                        );
                    }
                    if r.mode == Mode::Synced && matches!(config.store, StoreConfig::Memory) {
                        extra.push_str("  runs as local (one instance on the memory store)");
                    }
                    if !r.cooldown.is_zero() {
                        let _ = write!(
                            extra,
                            "  cooldown={}",
                            sluice_core::format_duration(r.cooldown)
                        );
                    }
                    (
                        r.rate.limit().to_string(),
                        sluice_core::format_duration(r.rate.window()),
                        r.algorithm.name(),
                        r.mode.name(),
                    )
                }
            };
            if rule.shadow_mode {
                extra.push_str("  shadow");
            }
            if let Some(name) = &rule.name {
                let _ = write!(extra, "  name={name}");
            }
            if !rule.replaces.is_empty() {
                let _ = write!(extra, "  replaces={}", rule.replaces.join(","));
            }
            let _ = writeln!(
                out,
                "  {:<32} {:>9} per {:<6} {:<18} {:<6}{extra}",
                rule.path, limit, window, algorithm, mode
            );
        }
    }
    out
}

/// Logs every warning of `config` (at start and after a reload).
pub fn log_warnings(config: &ServiceConfig) {
    for w in sluice_config::warnings(config) {
        tracing::warn!("{w}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_says_from_how_many_instances_the_store_decides_it() {
        let dir = std::env::temp_dir().join(format!("sluice-check-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("rules")).unwrap();
        std::fs::write(
            dir.join("rules/edge.yaml"),
            "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { window: 10s, requests_per_unit: 20, spans: 5 }\n  - key: ip\n    rate_limit: { window: 10s, requests_per_unit: 20, spans: 5, small_limits: share }\n",
        )
        .unwrap();
        let render_with = |store: &str| {
            std::fs::write(
                dir.join("sluice.yaml"),
                format!("store: {store}\nrules: [rules/]\n"),
            )
            .unwrap();
            render(&sluice_config::load(&dir.join("sluice.yaml")).unwrap())
        };
        let redis = render_with("redis://127.0.0.1:6399/");
        let lines: Vec<&str> = redis.lines().collect();
        assert!(
            lines[1]
                .ends_with("synced  decided at the store once the fleet has 3 instances or more"),
            "{redis}"
        );
        assert!(lines[2].ends_with("synced"), "{redis}");
        // With the embedded store nothing is shared, nothing decided at a store.
        let memory = render_with("memory://");
        assert!(!memory.contains("decided at the store"), "{memory}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_rule_shows_its_cooldown_its_own_or_the_default() {
        let dir = std::env::temp_dir().join(format!("sluice-check-cd-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("rules")).unwrap();
        std::fs::write(
            dir.join("rules/edge.yaml"),
            "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { window: 10s, requests_per_unit: 2, cooldown: 25s }\n  - key: ip\n    rate_limit: { window: 10s, requests_per_unit: 2 }\n  - key: tenant\n    rate_limit: { window: 10s, requests_per_unit: 2, cooldown: 0s }\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("sluice.yaml"),
            "rules: [rules/]\ndefaults: { cooldown: 5s }\n",
        )
        .unwrap();
        let text = render(&sluice_config::load(&dir.join("sluice.yaml")).unwrap());
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[1].ends_with("  cooldown=25s"), "{text}");
        assert!(lines[2].ends_with("  cooldown=5s"), "{text}");
        assert!(!lines[3].contains("cooldown"), "{text}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
