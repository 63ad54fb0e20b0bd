//! Country and autonomous system of a client address, from MaxMind-format (`.mmdb`)
//! databases: what the `country` and `asn` actions read. [`GeoIp`] holds the databases of
//! `geoip.databases`, looks addresses up without a lock, and swaps in a database file's new
//! version when [`GeoIp::reload_changed`] finds one (a file that fails to load keeps the
//! version in use).
//!
//! Layouts read: MaxMind's GeoLite2 / GeoIP2 (`country.iso_code`, else
//! `registered_country.iso_code`; `autonomous_system_number`), the `ip-location-db` packages
//! (`country_code`) and ipinfo's (`country` as a code, `asn` as `AS13335`).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use arc_swap::ArcSwap;
use maxminddb::{PathElement, Reader};

/// The largest database file loaded (GeoIP2 City, among the largest, is under 100 MiB).
pub const MAX_DATABASE_BYTES: u64 = 512 << 20;

/// The longest value taken from a database (a country code is 2 characters; anything longer
/// than this is not one).
const MAX_VALUE_LEN: usize = 16;

/// Why a database file could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GeoError {
    /// The file could not be read.
    #[error("cannot read the geoip database {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is larger than [`MAX_DATABASE_BYTES`].
    #[error("the geoip database {} is {size} bytes, more than the {max} a database may have", path.display(), max = MAX_DATABASE_BYTES)]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
    },
    /// The file is not a valid MaxMind-format database.
    #[error("{} is not a valid MaxMind-format (.mmdb) database: {message}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, as the reader says it.
        message: String,
    },
}

/// How `maxminddb`'s verification words a database without a description (see
/// [`Loaded::open`]).
const EMPTY_DESCRIPTION: &str = "description - Expected: non-empty map";

/// A file's identity for change detection: its size and modification time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
}

fn stamp(path: &Path) -> Result<Stamp, GeoError> {
    let meta = std::fs::metadata(path).map_err(|source| GeoError::Read {
        path: path.to_owned(),
        source,
    })?;
    Ok(Stamp {
        len: meta.len(),
        modified: meta.modified().ok(),
    })
}

/// One loaded version of a database file.
struct Loaded {
    reader: Reader<Vec<u8>>,
}

impl Loaded {
    /// Reads, parses and checks `path` whole (a truncated or corrupt file is refused here,
    /// not found out by a request); `before` is the file's stamp, taken first.
    fn open(path: &Path, before: Stamp) -> Result<Self, GeoError> {
        if before.len > MAX_DATABASE_BYTES {
            return Err(GeoError::TooLarge {
                path: path.to_owned(),
                size: before.len,
            });
        }
        let read = |source| GeoError::Read {
            path: path.to_owned(),
            source,
        };
        let mut bytes = Vec::new();
        let file = std::fs::File::open(path).map_err(read)?;
        std::io::Read::read_to_end(
            &mut std::io::Read::take(file, MAX_DATABASE_BYTES + 1),
            &mut bytes,
        )
        .map_err(read)?;
        let invalid = |e: maxminddb::MaxMindDbError| GeoError::Invalid {
            path: path.to_owned(),
            message: e.to_string(),
        };
        let reader = Reader::from_source(bytes).map_err(invalid)?;
        match reader.verify() {
            Ok(()) => {}
            // The format asks for a description, but public databases (the `ip-location-db`
            // packages among them) ship none, and nothing here reads it: the check's only
            // complaint that is not about the tree or the data.
            Err(e) if e.to_string().contains(EMPTY_DESCRIPTION) => {}
            Err(e) => return Err(invalid(e)),
        }
        Ok(Self { reader })
    }

    /// The first of `paths` this database has for `ip` as a short text value.
    fn text(&self, ip: IpAddr, paths: &[&[PathElement<'_>]]) -> Option<String> {
        let found = self.reader.lookup(ip).ok()?;
        if !found.has_data() {
            return None;
        }
        paths.iter().find_map(|path| {
            // A path through a value of another type (ipinfo's `country` is a string, not a
            // map) is an error here: try the next layout.
            let value: String = found.decode_path(path).ok().flatten()?;
            short_code(&value).then_some(value)
        })
    }

    fn asn(&self, ip: IpAddr) -> Option<u32> {
        let found = self.reader.lookup(ip).ok()?;
        if !found.has_data() {
            return None;
        }
        if let Ok(Some(n)) =
            found.decode_path::<u32>(&[PathElement::Key("autonomous_system_number")])
        {
            return Some(n);
        }
        let text: String = found
            .decode_path(&[PathElement::Key("asn")])
            .ok()
            .flatten()?;
        let digits = text.strip_prefix("AS").unwrap_or(&text);
        digits.parse().ok()
    }
}

/// A value fit for a descriptor: short, letters and digits (a country code).
fn short_code(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= MAX_VALUE_LEN
        && value.bytes().all(|b| b.is_ascii_alphanumeric())
}

const COUNTRY_PATHS: [&[PathElement<'static>]; 4] = [
    &[PathElement::Key("country"), PathElement::Key("iso_code")],
    &[PathElement::Key("country_code")],
    &[PathElement::Key("country")],
    &[
        PathElement::Key("registered_country"),
        PathElement::Key("iso_code"),
    ],
];

/// One database file and the version of it in use.
struct Database {
    path: PathBuf,
    current: ArcSwap<Loaded>,
    /// The stamp of the version last tried (loaded, or refused: a refused version is not
    /// tried again until the file changes again).
    seen: std::sync::Mutex<Stamp>,
}

/// The databases of `geoip.databases`, asked in order.
pub struct GeoIp {
    databases: Vec<Database>,
}

impl std::fmt::Debug for GeoIp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GeoIp")
            .field(
                "databases",
                &self.databases.iter().map(|d| &d.path).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl GeoIp {
    /// Loads every file of `paths` (each read whole and checked).
    ///
    /// # Errors
    /// The first file that cannot be read, is too large or is not a valid database.
    pub fn open(paths: &[PathBuf]) -> Result<Self, GeoError> {
        let databases = paths
            .iter()
            .map(|path| {
                let seen = stamp(path)?;
                Ok(Database {
                    current: ArcSwap::from_pointee(Loaded::open(path, seen)?),
                    path: path.clone(),
                    seen: std::sync::Mutex::new(seen),
                })
            })
            .collect::<Result<_, GeoError>>()?;
        Ok(Self { databases })
    }

    /// The country code (ISO 3166-1 alpha-2, e.g. `DE`) the first database that knows `ip`
    /// gives it.
    pub fn country(&self, ip: IpAddr) -> Option<String> {
        self.databases
            .iter()
            .find_map(|d| d.current.load().text(ip, &COUNTRY_PATHS))
    }

    /// The autonomous system number the first database that knows `ip` gives it.
    pub fn asn(&self, ip: IpAddr) -> Option<u32> {
        self.databases.iter().find_map(|d| d.current.load().asn(ip))
    }

    /// Loads the files that changed (size or modification time) since they were loaded and
    /// swaps each new version in; lookups in progress finish with the old one. Returns, per
    /// changed file, its path and whether it was taken (a file that fails keeps the version
    /// in use, and is tried again at the next call only if it changes again).
    ///
    /// Reads whole files: call it off the request path (a blocking thread).
    pub fn reload_changed(&self) -> Vec<(PathBuf, Result<(), GeoError>)> {
        let mut out = Vec::new();
        for d in &self.databases {
            let now = match stamp(&d.path) {
                Ok(s) => s,
                Err(e) => {
                    out.push((d.path.clone(), Err(e)));
                    continue;
                }
            };
            let mut seen = d
                .seen
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if now == *seen {
                continue;
            }
            *seen = now;
            let result = Loaded::open(&d.path, now).map(|loaded| d.current.store(Arc::new(loaded)));
            out.push((d.path.clone(), result));
        }
        out
    }
}
