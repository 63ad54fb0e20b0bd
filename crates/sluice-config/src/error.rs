//! Errors that say what was wrong, where, and what to write instead.

use std::path::{Path, PathBuf};

use serde_saphyr::Spanned;

/// A configuration that could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file was read but its content is wrong.
    #[error("{}:{line}:{column}: {message}", file.display())]
    Invalid {
        /// The file.
        file: PathBuf,
        /// 1-based line (0 when the error concerns the whole file).
        line: u64,
        /// 1-based column (0 when the error concerns the whole file).
        column: u64,
        /// What is wrong and what to write instead.
        message: String,
    },
    /// The file could not be read.
    #[error("{}: cannot read: {source}", file.display())]
    Io {
        /// The file.
        file: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
}

impl ConfigError {
    /// The message without the location prefix (for `Invalid`) or the whole text (for `Io`).
    pub fn message(&self) -> String {
        match self {
            ConfigError::Invalid { message, .. } => message.clone(),
            other => other.to_string(),
        }
    }
}

/// An error at a place in a file not yet named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Located {
    pub line: u64,
    pub column: u64,
    pub message: String,
}

impl Located {
    pub fn at<T>(spanned: &Spanned<T>, message: impl Into<String>) -> Self {
        Self {
            line: spanned.referenced.line(),
            column: spanned.referenced.column(),
            message: message.into(),
        }
    }

    pub fn at_location(location: &serde_saphyr::Location, message: impl Into<String>) -> Self {
        Self {
            line: location.line(),
            column: location.column(),
            message: message.into(),
        }
    }

    pub fn whole_file(message: impl Into<String>) -> Self {
        Self {
            line: 0,
            column: 0,
            message: message.into(),
        }
    }

    pub fn in_file(self, file: &Path) -> ConfigError {
        ConfigError::Invalid {
            file: file.to_path_buf(),
            line: self.line,
            column: self.column,
            message: self.message,
        }
    }
}

/// The closest of `candidates` to `word`, if it is close enough to be a likely typo.
pub(crate) fn nearest<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    let word = word.to_ascii_lowercase();
    candidates
        .iter()
        .map(|c| (strsim::levenshtein(&word, c), *c))
        .filter(|(d, c)| *d <= (c.len() / 3).max(2))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// "did you mean `x`? " or "" followed by the list of valid choices.
/// "did you mean `x`? (valid: ...)", or "write one of ..." when nothing is near: how every
/// Sluice error names the choices.
pub fn suggestion(word: &str, candidates: &[&str]) -> String {
    let list = candidates
        .iter()
        .map(|c| format!("`{c}`"))
        .collect::<Vec<_>>()
        .join(", ");
    match nearest(word, candidates) {
        Some(best) => format!("did you mean `{best}`? (valid: {list})"),
        None => format!("write one of {list}"),
    }
}

/// The rest of the line at a location, without a trailing comment: what the user wrote there.
fn token_at(text: &str, line: u64, column: u64) -> String {
    let Some(l) = text.lines().nth(line.saturating_sub(1) as usize) else {
        return String::new();
    };
    let rest: String = l.chars().skip(column.saturating_sub(1) as usize).collect();
    let rest = rest.split(" #").next().unwrap_or("");
    rest.trim().chars().take(60).collect()
}

/// For a key that takes a mapping where a single value was written, how to write it.
fn mapping_hint(text: &str, line: u64) -> &'static str {
    let key = text
        .lines()
        .nth(line.saturating_sub(1) as usize)
        .and_then(|l| l.trim_start().split(':').next())
        .unwrap_or("");
    match key {
        "listen" => {
            "; `listen` names each listener, e.g. `listen: { http: localhost:8080, grpc: localhost:8081, admin: localhost:9090 }` (a listener left out keeps its default)"
        }
        _ => "",
    }
}

fn friendly_type(expected: &str) -> String {
    let expected = expected.trim();
    if expected.starts_with("sequence") {
        return "a list (lines starting with `- `)".to_owned();
    }
    if expected.starts_with("mapping") {
        return "a mapping (`key: value` lines)".to_owned();
    }
    if expected.starts_with("struct ") || expected.starts_with("a map") {
        return "a mapping (`key: value` lines)".to_owned();
    }
    match expected {
        "i64" | "u64" | "i32" | "u32" | "an integer" => "a whole number".to_owned(),
        "a boolean" | "bool" | "boolean" => "`true` or `false`".to_owned(),
        "a string" => "a string".to_owned(),
        "a sequence" => "a list (lines starting with `- `)".to_owned(),
        other => other.to_owned(),
    }
}

fn friendly_found(unexpected: &str) -> String {
    if unexpected.starts_with("map") {
        return "a mapping".to_owned();
    }
    if unexpected.starts_with("sequence") {
        return "a list".to_owned();
    }
    unexpected.to_owned()
}

/// Turns a YAML or shape error into a located message in our words.
pub(crate) fn from_yaml(err: &serde_saphyr::Error, text: &str) -> Located {
    let (line, column, message) = describe_yaml_error(
        err,
        text,
        "the file is empty; a rule file starts with `domain: <name>`",
    );
    Located {
        line,
        column,
        message,
    }
}

/// A YAML or shape error of any Sluice file (the simulator's scenarios too) as line, column
/// and a message in `sluice check`'s words: unknown fields with did-you-mean, types in plain
/// words, no Rust type names. `empty` is the message for an empty file.
pub fn describe_yaml_error(
    err: &serde_saphyr::Error,
    text: &str,
    empty: &str,
) -> (u64, u64, String) {
    use serde_saphyr::Error as E;
    let err = err.without_snippet();
    let (line, column) = err.location().map_or((0, 0), |l| (l.line(), l.column()));
    let message = match err {
        E::SerdeUnknownField {
            field, expected, ..
        } => format!("unknown field `{field}`; {}", suggestion(field, expected)),
        E::SerdeUnknownVariant {
            variant, expected, ..
        } => format!("unknown `{variant}`; {}", suggestion(variant, expected)),
        E::SerdeInvalidType {
            unexpected,
            expected,
            ..
        } => format!(
            "wrong type: expected {}, found {}{}",
            friendly_type(expected),
            friendly_found(unexpected),
            mapping_hint(text, line)
        ),
        E::SerdeInvalidValue {
            unexpected,
            expected,
            ..
        } => format!(
            "invalid value: expected {}, found {}",
            friendly_type(expected),
            friendly_found(unexpected)
        ),
        E::SerdeMissingField { field, .. } => {
            format!("missing field `{field}`; add `{field}:` to this mapping")
        }
        E::DuplicateMappingKey { key, .. } => format!(
            "duplicate key `{}`; each key may appear only once in a mapping",
            key.as_deref().unwrap_or("?")
        ),
        E::InvalidScalar { ty, .. } => format!(
            "wrong type: expected {}, found `{}`",
            friendly_type(ty),
            token_at(text, line, column)
        ),
        E::Unexpected { expected, .. } => format!(
            "wrong type: expected {}, found `{}`{}",
            friendly_type(expected),
            token_at(text, line, column),
            mapping_hint(text, line)
        ),
        E::Eof { .. } => empty.to_owned(),
        E::NullIntoString { .. } => {
            "this value is empty; write a text value here (or remove the entry)".to_owned()
        }
        E::InvalidBooleanStrict { .. } => format!(
            "wrong type: expected `true` or `false`, found `{}`",
            token_at(text, line, column)
        ),
        other => {
            let text = other.to_string();
            let first = text.lines().next().unwrap_or("invalid YAML");
            let first = first.split(" at line ").next().unwrap_or(first);
            // Never a Rust type name in a user's error.
            let first = if first.contains("Option<") || first.contains("::") {
                "a value of the wrong kind"
            } else {
                first
            };
            format!(
                "invalid YAML: {first}; check the indentation and the `:` and `- ` markers here"
            )
        }
    };
    (line, column, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_nearest() {
        assert_eq!(
            nearest("requests_per_unti", &["unit", "requests_per_unit"]),
            Some("requests_per_unit")
        );
        assert_eq!(nearest("zzzzzz", &["unit", "requests_per_unit"]), None);
    }
}
