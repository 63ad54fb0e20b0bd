//! Which build runs: the version, the git commit and the build date (`build.rs`), as
//! `sluice --version`, the status page, `/status.json` and `sluice_build_info` show them.

/// The crate version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The git commit (12 hex digits) or `unknown`.
pub const COMMIT: &str = env!("SLUICE_COMMIT");
/// The build date (`YYYY-MM-DD`, UTC) or `unknown`.
pub const BUILD_DATE: &str = env!("SLUICE_BUILD_DATE");

/// `sluice --version`: `sluice 0.1.0 (commit 0123456789ab, built 2026-01-31)`.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("SLUICE_COMMIT"),
    ", built ",
    env!("SLUICE_BUILD_DATE"),
    ")"
);

/// The labels of `sluice_build_info`.
pub fn metric_labels() -> sluice_engine::BuildInfo {
    sluice_engine::BuildInfo {
        version: VERSION,
        commit: COMMIT,
        build_date: BUILD_DATE,
    }
}
