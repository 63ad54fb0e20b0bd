//! Rule files: the files a `rules:` entry names, read from disk and parsed into a [`Domain`].

use std::path::{Path, PathBuf};

use crate::error::{ConfigError, Located, from_yaml};
use crate::raw::RawDomainFile;
use crate::rules::Domain;

/// Rule files larger than this are refused rather than parsed.
const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;

pub(crate) fn read(file: &Path) -> Result<String, ConfigError> {
    let io = |source| ConfigError::Io {
        file: file.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(file).map_err(io)?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(Located::whole_file(format!(
            "file is {} bytes; config files are limited to {MAX_FILE_BYTES}",
            meta.len()
        ))
        .in_file(file));
    }
    std::fs::read_to_string(file).map_err(io)
}

pub(crate) fn parse<T: serde::de::DeserializeOwned>(
    file: &Path,
    text: &str,
) -> Result<T, ConfigError> {
    let options = serde_saphyr::options! { with_snippet: false };
    serde_saphyr::from_str_with_options(text, options)
        .map_err(|e| from_yaml(&e, text).in_file(file))
}

/// The files a `rules:` entry names: the file itself, or the `.yaml`/`.yml` files of a
/// directory in name order.
pub(crate) fn rule_files(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    if !path.is_dir() {
        std::fs::metadata(path)?;
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    Ok(files)
}

/// Parses one domain's rules from text; `file` names it in errors.
pub fn parse_domain(file: &Path, text: &str) -> Result<Domain, ConfigError> {
    let raw: RawDomainFile = parse(file, text)?;
    Domain::from_raw(raw, file.to_path_buf()).map_err(|e| e.in_file(file))
}

/// Loads one Envoy-format rule file.
pub fn load_domain_file(file: &Path) -> Result<Domain, ConfigError> {
    parse_domain(file, &read(file)?)
}

/// A rule file's path and text, to be validated into a [`Domain`] with `TryFrom`.
#[derive(Clone, Debug)]
pub struct DomainSource {
    /// Named in errors.
    pub file: PathBuf,
    /// The YAML.
    pub text: String,
}

impl TryFrom<DomainSource> for Domain {
    type Error = ConfigError;

    fn try_from(source: DomainSource) -> Result<Self, ConfigError> {
        parse_domain(&source.file, &source.text)
    }
}
