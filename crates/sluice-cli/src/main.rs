//! The `sluice` binary: validate rule files, and (as the engine grows) serve them.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod check;

/// Sluice: a distributed rate limiter.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate a sluice.yaml (with the rule files it names) or one Envoy-format rule file,
    /// and print each domain's rule tree.
    Check {
        /// The file to check.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Run the rate-limit service described by a config file.
    Serve {
        /// sluice.yaml, or one Envoy-format rule file.
        #[arg(long, short)]
        config: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Check { config } => check::run(&config),
        Command::Serve { config } => serve(&config),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn serve(config: &std::path::Path) -> anyhow::Result<ExitCode> {
    let loaded = sluice_config::load(config)?;
    eprintln!(
        "sluice serve: {} is valid ({} domains), but this build has no rate-limit engine or listeners yet; nothing is served. Use `sluice check` to inspect the rules.",
        config.display(),
        loaded.rules.domains().count()
    );
    Ok(ExitCode::from(2))
}
