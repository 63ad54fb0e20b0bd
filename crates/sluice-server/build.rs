//! Build facts for `sluice --version`, the status page and `sluice_build_info`: the git commit
//! and the build date, as `SLUICE_COMMIT` and `SLUICE_BUILD_DATE` (`src/build_info.rs`).
//!
//! - The commit: `SLUICE_GIT_COMMIT` when set (a container build has no `.git`), else
//!   `git rev-parse HEAD`, else `unknown` (a source tarball, no git installed). 12 hex digits.
//! - The date (UTC, `YYYY-MM-DD`): `SOURCE_DATE_EPOCH` when set, so that a packaged build is
//!   reproducible (`scripts/package.sh` sets it to the commit's time), else the day this script
//!   ran. It reruns when the commit or either variable changes, not on every build: a debug
//!   build's date is the day its commit was first built.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=SLUICE_GIT_COMMIT");
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".to_owned());
    let commit = match std::env::var("SLUICE_GIT_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_owned(),
        _ => {
            watch_git_head(&dir);
            git(&dir, &["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".to_owned())
        }
    };
    let commit: String = if commit.bytes().all(|b| b.is_ascii_hexdigit()) {
        commit.chars().take(12).collect()
    } else {
        "unknown".to_owned()
    };
    let date = match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(s) if !s.trim().is_empty() => s.trim().parse::<i64>().ok().map(civil_date),
        _ => now_epoch().map(civil_date),
    }
    .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=SLUICE_COMMIT={commit}");
    println!("cargo:rustc-env=SLUICE_BUILD_DATE={date}");
}

/// `git ARGS` in `dir`, its trimmed output when it succeeded.
fn git(dir: &str, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_owned())
}

/// Reruns this script when HEAD moves: HEAD itself, the branch it points to, packed refs.
/// `--git-path` finds them in a worktree too. Only files that exist (cargo reruns every build
/// for a missing one).
fn watch_git_head(dir: &str) {
    let mut paths = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    if let Some(branch) = git(dir, &["symbolic-ref", "-q", "HEAD"]) {
        paths.push(branch);
    }
    for p in paths {
        if let Some(file) = git(dir, &["rev-parse", "--git-path", &p]) {
            let file = Path::new(dir).join(file);
            if file.exists() {
                println!("cargo:rerun-if-changed={}", file.display());
            }
        }
    }
}

/// Seconds since the epoch now. The build script is not the service: no `Clock` here.
#[allow(clippy::disallowed_methods)]
fn now_epoch() -> Option<i64> {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?;
    i64::try_from(d.as_secs()).ok()
}

/// `YYYY-MM-DD` (UTC) of a Unix time: days to the proleptic Gregorian calendar (H. Hinnant's
/// `civil_from_days`).
fn civil_date(epoch: i64) -> String {
    let z = epoch.div_euclid(86_400) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}
