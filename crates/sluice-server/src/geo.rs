//! `geoip:`: the gateways' country and ASN databases, loaded at start and swapped for a new
//! version of a file when it changes (checked every `geoip.check_every`, off the request path).

use std::sync::Arc;

use sluice_config::GeoIpConfig;
use sluice_http::GeoIp;
use tokio::sync::watch;

use crate::error::ServerError;

/// Loads the databases `config` names (none without `geoip:`).
pub(crate) fn open(config: Option<&GeoIpConfig>) -> Result<Option<Arc<GeoIp>>, ServerError> {
    let Some(config) = config else {
        return Ok(None);
    };
    let geo = GeoIp::open(&config.databases)
        .map_err(|e| ServerError::file_because("geoip.databases".to_owned(), e))?;
    tracing::info!(databases = ?config.databases, "geoip databases loaded");
    Ok(Some(Arc::new(geo)))
}

/// Checks the files every `config.check_every` until `stop` turns true, and logs what each
/// new version did: loaded, or refused (the version in use stays).
pub(crate) fn watch(geo: Arc<GeoIp>, config: &GeoIpConfig, mut stop: watch::Receiver<bool>) {
    let every = config.check_every;
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = stop.changed() => return,
                _ = tick.tick() => {}
            }
            let geo = geo.clone();
            let Ok(results) = tokio::task::spawn_blocking(move || geo.reload_changed()).await
            else {
                continue;
            };
            for (path, result) in results {
                match result {
                    Ok(()) => {
                        tracing::info!(file = %path.display(), "geoip database reloaded");
                    }
                    Err(e) => tracing::error!(
                        error = %e,
                        "geoip database not reloaded; the version in use stays"
                    ),
                }
            }
        }
    });
}
