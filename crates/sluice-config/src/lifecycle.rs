//! How `sluice serve` stops and what it keeps between runs: `shutdown_timeout` and `state_dir`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_saphyr::Spanned;

use crate::duration::{Bounds, bounded_duration};
use crate::error::Located;

/// `shutdown_timeout` when the file does not set it: within Kubernetes' default 30 s grace
/// period, with room for the final flush.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(20);

/// The top-level lifecycle settings of `sluice.yaml`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Lifecycle {
    /// How long a stopping `sluice serve` lets calls in flight finish (`shutdown_timeout`,
    /// default 20 s, 1 s to 1 h); the counts are flushed at once and while it waits, and once
    /// more after.
    pub shutdown_timeout: Duration,
    /// Where counts that could not reach the store at shutdown are kept for the next start to
    /// deliver (`state_dir`, resolved against the config file's directory; unset: such counts
    /// are lost, and the log says how many). One directory per instance: a second instance
    /// given the same directory refuses to start.
    pub state_dir: Option<PathBuf>,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Self {
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            state_dir: None,
        }
    }
}

pub(crate) fn parse_lifecycle(
    shutdown_timeout: Option<&Spanned<String>>,
    state_dir: Option<&Spanned<String>>,
    base: &Path,
) -> Result<Lifecycle, Located> {
    let shutdown_timeout = bounded_duration(
        "shutdown_timeout",
        shutdown_timeout,
        DEFAULT_SHUTDOWN_TIMEOUT,
        &Bounds {
            min: Duration::from_secs(1),
            max: Duration::from_secs(3600),
            range: "1s and 1h",
            example: "`20s` or `1m`",
        },
    )?;
    let state_dir = match state_dir {
        None => None,
        Some(v) if v.value.trim().is_empty() => {
            return Err(Located::at(
                v,
                "state_dir is empty; write a directory this instance alone uses, e.g. `/var/lib/sluice`".to_owned(),
            ));
        }
        Some(v) => Some(base.join(&v.value)),
    };
    Ok(Lifecycle {
        shutdown_timeout,
        state_dir,
    })
}
