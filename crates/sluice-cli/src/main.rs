//! The `sluice` binary: validate rule files, and (as the engine grows) serve them.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory as _, Parser, Subcommand};

mod check;
mod dist_files;
mod status_cli;

/// Sluice: a distributed rate limiter.
#[derive(Debug, Parser)]
#[command(name = "sluice", version = sluice_server::build_info::LONG_VERSION, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate a sluice.yaml (with the rule files it names) or one Envoy-format rule file,
    /// print each domain's rule tree, and warn about settings that do not do what they seem
    /// to (each with file:line:column).
    Check {
        /// The file to check.
        #[arg(long, short)]
        config: PathBuf,
        /// Exit with status 1 when there are warnings (for CI).
        #[arg(long)]
        strict: bool,
    },
    /// Run the rate-limit service described by a config file: Envoy RLS gRPC, the HTTP/JSON
    /// API, the admin listener (/metrics, /healthz, /readyz, POST /reload).
    Serve {
        /// sluice.yaml, or one Envoy-format rule file.
        #[arg(long, short)]
        config: PathBuf,
        /// Log format.
        #[arg(long, value_enum, default_value_t = LogFormat::Human)]
        log_format: LogFormat,
    },
    /// Show a running instance's status (its admin listener's /status.json) as tables: the
    /// store, every rule's decisions per second, and each rule's heaviest keys.
    Status {
        /// The admin listener, e.g. 127.0.0.1:9090 or http://host:9090 (default: the one
        /// `--config` names, else 127.0.0.1:9090).
        #[arg(long)]
        admin: Option<String>,
        /// The instance's sluice.yaml: its admin listener and admin token file.
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// A file holding the admin bearer token (default: `access.admin_token_file` of
        /// `--config`).
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// Print the JSON as it came.
        #[arg(long)]
        json: bool,
    },
    /// Ask a running instance's admin listener whether it is ready (`/readyz`, or `--path`):
    /// exit 0 on 200, 1 otherwise. For container health checks, where no curl is installed.
    Probe {
        /// The admin listener (default: the one `--config` names, else 127.0.0.1:9090).
        #[arg(long)]
        admin: Option<String>,
        /// The instance's sluice.yaml: its admin listener.
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// The path to ask (`/healthz`: the process answers; `/readyz`: it takes traffic).
        #[arg(long, default_value = "/readyz")]
        path: String,
        /// Seconds to wait for the answer.
        #[arg(long, default_value_t = 3)]
        timeout: u64,
    },
    /// Write the man pages and shell completions (bash, zsh, fish) generated from this CLI
    /// into OUT/man and OUT/completions, for packages.
    #[command(hide = true)]
    DistFiles {
        /// The directory to write into.
        #[arg(long)]
        out: PathBuf,
    },
    #[cfg(feature = "sim")]
    /// Run a simulation scenario: the real engine on simulated nodes, every policy on the same
    /// traffic; prints a table and writes OUT/summary.json and plots (SVG and PNG).
    Simulate {
        /// The scenario file (YAML).
        scenario: PathBuf,
        /// Directory for summary.json and the plots (SVG and PNG).
        #[arg(long, default_value = "sluice-sim-out")]
        out: PathBuf,
        /// Print the table as Markdown.
        #[arg(long)]
        markdown: bool,
        /// The policies to run, comma-separated (instead of the scenario's `policies`), e.g.
        /// `predictive,rlqs`.
        #[arg(long, value_delimiter = ',')]
        policies: Vec<String>,
        /// Run the scenario once per seed in FIRST-LAST, or with the one seed N (its own `seed`
        /// replaced), and print, per policy and class of keys, the spread over the runs as a
        /// Markdown table (OUT/seeds.json; no plots): one traffic draw is one story.
        #[arg(long, value_name = "FIRST-LAST", value_parser = parse_seeds)]
        seeds: Option<std::ops::RangeInclusive<u64>>,
    },
}

/// `--seeds FIRST-LAST` (or one seed, `N`): at least one seed, at most 10,000.
#[cfg(feature = "sim")]
fn parse_seeds(text: &str) -> Result<std::ops::RangeInclusive<u64>, String> {
    let (first, last) = text.split_once('-').unwrap_or((text, text));
    let number = |s: &str| {
        s.trim().parse::<u64>().map_err(|_| {
            if s == text {
                format!("`{text}` is not a seed N or a range FIRST-LAST (for example 1-24)")
            } else {
                format!("`{s}` in `{text}` is not a whole number")
            }
        })
    };
    let (first, last) = (number(first)?, number(last)?);
    if last < first {
        return Err(format!("{last} is before {first} in `{text}`"));
    }
    if last - first >= 10_000 {
        return Err(format!("`{text}` names more than 10,000 seeds"));
    }
    Ok(first..=last)
}

/// How logs are written (level from `RUST_LOG`, default `info`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// One readable line per event.
    Human,
    /// One JSON object per event.
    Json,
}

fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only for a terminal: a log file or journald gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Check { config, strict } => check::run(&config, strict),
        #[cfg(feature = "sim")]
        Command::Simulate {
            scenario,
            out,
            markdown,
            policies,
            seeds,
        } => simulate(&scenario, &out, markdown, policies, seeds),
        Command::Status {
            admin,
            config,
            token_file,
            json,
        } => status_cli::target(admin, config.as_deref(), token_file)
            .and_then(|(admin, token_file)| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                rt.block_on(status_cli::fetch(&admin, token_file.as_deref()))
            })
            .map(|status| {
                let text = if json {
                    serde_json::to_string_pretty(&status).unwrap_or_default() + "\n"
                } else {
                    status_cli::render(&status)
                };
                let _ = std::io::Write::write_all(&mut std::io::stdout(), text.as_bytes());
                ExitCode::SUCCESS
            }),
        Command::Probe {
            admin,
            config,
            path,
            timeout,
        } => probe(admin, config.as_deref(), &path, timeout),
        Command::DistFiles { out } => dist_files::write(Cli::command(), &out).map(|files| {
            for f in files {
                println!("wrote {}", f.display());
            }
            ExitCode::SUCCESS
        }),
        Command::Serve { config, log_format } => {
            init_logs(log_format);
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .map_err(anyhow::Error::from)
                .and_then(|rt| {
                    let served = rt
                        .block_on(sluice_server::run(&config))
                        .map_err(anyhow::Error::from);
                    // Calls still running past `shutdown_timeout` are not waited for.
                    rt.shutdown_timeout(std::time::Duration::from_millis(200));
                    served
                })
                .map(|()| ExitCode::SUCCESS)
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `sluice probe`: 0 when the admin listener answers `path` with 200, 1 (with the reason on
/// stderr) otherwise.
fn probe(
    admin: Option<String>,
    config: Option<&std::path::Path>,
    path: &str,
    timeout: u64,
) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(path.starts_with('/'), "--path {path}: must start with /");
    let (admin, _) = status_cli::target(admin, config, None)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (uri, status, body) = rt.block_on(status_cli::get(
        &admin,
        path,
        None,
        std::time::Duration::from_secs(timeout.max(1)),
    ))?;
    let text = String::from_utf8_lossy(&body[..body.len().min(200)]);
    if status == http::StatusCode::OK {
        println!("{uri}: {}", text.trim());
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("{uri} answered {status}: {}", text.trim());
        Ok(ExitCode::FAILURE)
    }
}

/// `sluice simulate`: runs the scenario, prints the table, writes the summary and the plots.
#[cfg(feature = "sim")]
fn simulate(
    file: &std::path::Path,
    out: &std::path::Path,
    markdown: bool,
    policies: Vec<String>,
    seeds: Option<std::ops::RangeInclusive<u64>>,
) -> anyhow::Result<ExitCode> {
    use anyhow::Context as _;
    let mut scenario = sluice_sim::Scenario::load(file)?;
    if let Some(bad) = policies
        .iter()
        .find(|p| !sluice_sim::ALL_POLICIES.contains(&p.as_str()))
    {
        anyhow::bail!(
            "unknown policy `{bad}` in --policies; {}",
            sluice_config::suggestion(bad, &sluice_sim::ALL_POLICIES)
        );
    }
    if let Some(problem) = scenario.policies_problem(&policies) {
        anyhow::bail!("{}: {problem} (--policies)", file.display());
    }
    if !policies.is_empty() {
        scenario.policies = Some(policies);
    }
    if let Some(seeds) = seeds {
        let report = sluice_sim::seeds::over_seeds(&scenario, seeds);
        let _ = std::io::Write::write_all(
            &mut std::io::stdout(),
            sluice_sim::seeds::markdown(&report).as_bytes(),
        );
        std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
        let path = out.join("seeds.json");
        std::fs::write(&path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        let _ = std::io::Write::write_all(
            &mut std::io::stdout(),
            format!("wrote {}\n", path.display()).as_bytes(),
        );
        return Ok(ExitCode::SUCCESS);
    }
    // A progress bar once a run has taken a second (on a terminal only).
    let clock = sluice_core::SystemClock::default();
    let started = sluice_core::Clock::now(&clock);
    let mut bar: Option<indicatif::ProgressBar> = None;
    let report = sluice_sim::run_with_progress(&scenario, &mut |done, total| {
        if bar.is_none() && sluice_core::Clock::now(&clock).saturating_sub(started) >= 1_000_000_000
        {
            let b = indicatif::ProgressBar::new(total);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{elapsed_precise} [{wide_bar}] {percent}% of {human_len} requests, {eta} left",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar = Some(b);
        }
        if let Some(b) = &bar {
            b.set_position(done);
        }
    });
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    // A closed pipe (`| head`) is not an error worth a panic.
    let mut stdout = std::io::stdout();
    let table = if markdown {
        report.markdown()
    } else {
        report.table()
    };
    let _ = std::io::Write::write_all(&mut stdout, table.as_bytes());
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let path = out.join("summary.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("cannot write {}", path.display()))?;
    let mut written = vec![path];
    written.extend(sluice_sim::write_plots(&report, out)?);
    for path in written {
        let _ = std::io::Write::write_all(
            &mut stdout,
            format!("wrote {}\n", path.display()).as_bytes(),
        );
    }
    Ok(ExitCode::SUCCESS)
}
