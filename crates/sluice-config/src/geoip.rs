//! `geoip:` in `sluice.yaml`: the MaxMind-format (`.mmdb`) databases the gateways' `country`
//! and `asn` actions read, and how often their files are checked for a new version.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_saphyr::Spanned;

use crate::error::Located;

/// `geoip:` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawGeoIp {
    pub databases: Spanned<Vec<Spanned<String>>>,
    pub check_every: Option<Spanned<String>>,
}

/// The databases a gateway's `country` and `asn` actions look client addresses up in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GeoIpConfig {
    /// The database files, resolved against the config file's directory. A lookup asks them
    /// in order: the first that knows the address's country (or ASN) answers, so a country
    /// database and an ASN database can be listed together.
    pub databases: Vec<PathBuf>,
    /// How often each file is checked for a new version (its size or modification time
    /// changed), which is then loaded, checked whole and swapped in (`check_every`, default
    /// 10 s). A file that fails to load keeps the version in use.
    pub check_every: Duration,
}

/// The most database files `geoip.databases` may list.
pub const MAX_GEOIP_DATABASES: usize = 8;

/// `geoip.check_every` when the file does not set it.
pub const DEFAULT_GEOIP_CHECK_EVERY: Duration = Duration::from_secs(10);

pub(crate) fn parse_geoip(raw: &RawGeoIp, base: &Path) -> Result<GeoIpConfig, Located> {
    let listed = &raw.databases.value;
    if listed.is_empty() || listed.len() > MAX_GEOIP_DATABASES {
        return Err(Located::at(
            &raw.databases,
            format!(
                "geoip.databases lists {} files; list between 1 and {MAX_GEOIP_DATABASES} `.mmdb` files (a country database, an ASN database)",
                listed.len()
            ),
        ));
    }
    let mut databases = Vec::with_capacity(listed.len());
    for entry in listed {
        let path = entry.value.trim();
        if path.is_empty() {
            return Err(Located::at(
                entry,
                "geoip.databases has an empty entry; write the path of a `.mmdb` file",
            ));
        }
        databases.push(base.join(path));
    }
    let check_every = crate::duration::bounded_duration(
        "geoip.check_every",
        raw.check_every.as_ref(),
        DEFAULT_GEOIP_CHECK_EVERY,
        &crate::duration::Bounds {
            min: Duration::from_millis(100),
            max: Duration::from_secs(86_400),
            range: "100ms and 1d",
            example: "`10s` or `5m`",
        },
    )?;
    Ok(GeoIpConfig {
        databases,
        check_every,
    })
}
