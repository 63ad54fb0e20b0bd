//! A bucket id as a descriptor, and as a key of bounded size.
//!
//! A `BucketId` is a map: Envoy says its entries have no order (`{a: A, b: B}` and
//! `{b: B, a: A}` are one bucket), and the order protobuf maps arrive in is not stable. The
//! descriptor is its entries sorted by key, so one bucket is always one descriptor, on every
//! Envoy and after every restart, and matching costs what one RLS descriptor costs (trying
//! every order would cost `n!` matches and could match two rules for one bucket). A rule
//! tree for a bucket of several entries nests their keys in byte order of the keys: for
//! `{user: alice, path: /api}`, `path` above `user`.
//!
//! Sizes: the descriptor lives only while its usage is counted. What a stream and the demand
//! book keep is the [`BucketKey`]: the entries' encoding up to [`MAX_KEY_BYTES`] bytes, their
//! digest beyond, so a kept bucket costs a fixed size whatever its id. Values come from
//! requests (Envoy builds them from headers): one longer than the RLS limit is replaced by its
//! digest, as the gateway does, and still limited one by one. Keys and the number of entries
//! come from Envoy's configuration: an id with more entries or longer keys than the RLS
//! limits is refused ([`Refused`]), which leaves that bucket alone and the stream open.

use std::fmt::Write as _;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::BucketId;
use sluice_engine::{MAX_KEY_BYTES, write_digest};

use crate::RlsOptions;

/// A bucket's identity, at most [`MAX_KEY_BYTES`] bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BucketKey(Box<str>);

impl BucketKey {
    /// Bytes it holds (for memory bounds).
    pub fn weight(&self) -> usize {
        self.0.len() + 16
    }
}

/// A bucket id read from a report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bucket {
    /// Its identity.
    pub key: BucketKey,
    /// The descriptor's entries, sorted by key (long values as digests).
    pub entries: Vec<(String, String)>,
}

/// Why a bucket id is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// No entries.
    #[error("a bucket id with no entries")]
    Empty,
    /// More entries than a descriptor may have.
    #[error("a bucket id with {0} entries")]
    TooManyEntries(usize),
    /// An empty key, or one longer than a descriptor's.
    #[error("a bucket id with a key of {0} bytes")]
    KeyLength(usize),
}

impl Bucket {
    /// The bucket of an id, within the RLS size limits (entries per descriptor, key
    /// lengths; longer values hashed).
    pub fn read(id: &BucketId, options: &RlsOptions) -> Result<Self, Refused> {
        let n = id.bucket.len();
        if n == 0 {
            return Err(Refused::Empty);
        }
        if n > options.max_entries {
            return Err(Refused::TooManyEntries(n));
        }
        let mut entries = Vec::with_capacity(n);
        for (k, v) in &id.bucket {
            if k.is_empty() || k.len() > options.max_key_len {
                return Err(Refused::KeyLength(k.len()));
            }
            let value = if v.len() > options.max_value_len {
                let mut digest = String::with_capacity(39);
                write_digest(&mut digest, v.as_bytes());
                digest
            } else {
                v.clone()
            };
            entries.push((k.clone(), value));
        }
        entries.sort_unstable();
        let key = key_of(&entries);
        Ok(Self { key, entries })
    }
}

/// The entries as `<len>:<key><len>:<value>...`, or its digest when longer than
/// [`MAX_KEY_BYTES`] (a digest starts with a letter, an encoding with a digit).
fn key_of(entries: &[(String, String)]) -> BucketKey {
    let mut out = String::new();
    for (k, v) in entries {
        let _ = write!(out, "{}:{k}{}:{v}", k.len(), v.len());
    }
    if out.len() > MAX_KEY_BYTES {
        let mut digest = String::with_capacity(39);
        write_digest(&mut digest, out.as_bytes());
        out = digest;
    }
    BucketKey(out.into_boxed_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(entries: &[(&str, &str)]) -> BucketId {
        BucketId {
            bucket: entries
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    #[test]
    fn entries_are_sorted_by_key() {
        let options = RlsOptions::default();
        let a = Bucket::read(
            &id(&[("user", "alice"), ("path", "/api"), ("method", "GET")]),
            &options,
        )
        .unwrap();
        let keys: Vec<&str> = a.entries.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["method", "path", "user"]);
        let b = Bucket::read(
            &id(&[("path", "/api"), ("method", "GET"), ("user", "alice")]),
            &options,
        )
        .unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn one_entry_is_the_descriptor_of_that_entry() {
        let b = Bucket::read(&id(&[("user", "alice")]), &RlsOptions::default()).unwrap();
        assert_eq!(b.entries, [("user".to_owned(), "alice".to_owned())]);
    }

    #[test]
    fn empty_and_oversized_ids_are_refused() {
        let options = RlsOptions::default();
        assert_eq!(Bucket::read(&id(&[]), &options), Err(Refused::Empty));
        let long = "k".repeat(options.max_key_len + 1);
        assert!(Bucket::read(&id(&[(&long, "v")]), &options).is_err());
        assert!(Bucket::read(&id(&[("", "v")]), &options).is_err());
        let many: Vec<(String, String)> = (0..=options.max_entries)
            .map(|i| (format!("k{i}"), "v".to_owned()))
            .collect();
        let many: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert!(matches!(
            Bucket::read(&id(&many), &options),
            Err(Refused::TooManyEntries(_))
        ));
    }

    #[test]
    fn a_bucket_keeps_a_bounded_key_and_long_values_as_digests() {
        let options = RlsOptions::default();
        // The largest id the limits let through: 32 entries of 256-byte keys and 1 KiB values.
        let big: Vec<(String, String)> = (0..options.max_entries)
            .map(|i| (format!("{i:0>256}"), "v".repeat(options.max_value_len)))
            .collect();
        let big: Vec<(&str, &str)> = big.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let b = Bucket::read(&id(&big), &options).unwrap();
        assert!(b.key.weight() <= MAX_KEY_BYTES + 16, "{}", b.key.weight());
        // A value past the RLS limit is its digest, the same for the same value.
        let long = "x".repeat(options.max_value_len + 1);
        let one = Bucket::read(&id(&[("user", &long)]), &options).unwrap();
        assert!(one.entries[0].1.starts_with("sha256:"), "{:?}", one.entries);
        assert_eq!(
            one,
            Bucket::read(&id(&[("user", &long)]), &options).unwrap()
        );
        let other = "y".repeat(options.max_value_len + 1);
        assert_ne!(
            one,
            Bucket::read(&id(&[("user", &other)]), &options).unwrap()
        );
    }
}
