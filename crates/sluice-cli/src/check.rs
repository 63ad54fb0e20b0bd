//! `sluice check`: validate and print the rule tree.

use std::path::Path;
use std::process::ExitCode;

use sluice_server::rule_listing::render;

/// Loads `file`, prints its rule tree and warnings; with `strict`, warnings fail.
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
