//! `sluice check`: validate and print the rule tree.

use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;

use sluice_config::{Limit, ServiceConfig};

/// Renders every domain's rules, one line per rule.
pub fn render(config: &ServiceConfig) -> String {
    let mut out = String::new();
    for domain in config.rules.domains() {
        let _ = writeln!(
            out,
            "domain {} ({}): {} rules",
            domain.name(),
            domain.file().display(),
            domain.rules().len()
        );
        for rule in domain.rules() {
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
                    (
                        r.rate.limit().to_string(),
                        sluice_core::format_duration(r.rate.window()),
                        r.algorithm.name(),
                        r.mode.name(),
                    )
                }
            };
            let mut extra = String::new();
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

pub fn run(file: &Path, strict: bool) -> anyhow::Result<ExitCode> {
    let config = sluice_config::load(file)?;
    print!("{}", render(&config));
    let warnings = sluice_config::warnings(&config);
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    match warnings.len() {
        0 => println!("{}: ok", file.display()),
        1 => println!("{}: ok, 1 warning", file.display()),
        n => println!("{}: ok, {n} warnings", file.display()),
    }
    Ok(if strict && !warnings.is_empty() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Logs every warning of `config` (at start and after a reload).
pub fn log_warnings(config: &ServiceConfig) {
    for w in sluice_config::warnings(config) {
        tracing::warn!("{w}");
    }
}
