//! A bucket id as a descriptor.
//!
//! A `BucketId` is a map: Envoy says its entries have no order (`{a: A, b: B}` and
//! `{b: B, a: A}` are one bucket), and the order protobuf maps arrive in is not stable. The
//! descriptor is its entries sorted by key, so one bucket is always one descriptor, on every
//! Envoy and after every restart, and matching costs what one RLS descriptor costs (trying
//! every order would cost `n!` matches and could match two rules for one bucket). A rule
//! tree for a bucket of several entries nests their keys in byte order of the keys: for
//! `{user: alice, path: /api}`, `path` above `user`.

use envoy_types::pb::envoy::service::rate_limit_quota::v3::BucketId;

use crate::RlsOptions;
use crate::error::{RequestError, check_entries};

/// A bucket's entries, sorted by key: the descriptor it stands for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BucketKey(Vec<(String, String)>);

impl BucketKey {
    /// The descriptor's entries, from a bucket id, checked against the RLS size limits
    /// (entries per descriptor, key and value lengths). `index` names the usage report in
    /// error messages.
    pub fn from_proto(
        id: &BucketId,
        options: &RlsOptions,
        index: usize,
    ) -> Result<Self, RequestError> {
        check_entries(
            options,
            index,
            id.bucket.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        )
        .map_err(|e| RequestError::invalid(format!("bucket_quota_usages: {e}")))?;
        let mut entries: Vec<(String, String)> = id
            .bucket
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        entries.sort_unstable();
        Ok(Self(entries))
    }

    /// The entries, as the engine takes a descriptor.
    pub fn entries(&self) -> &[(String, String)] {
        &self.0
    }

    /// Bytes it holds (for memory bounds).
    pub fn weight(&self) -> usize {
        self.0.iter().map(|(k, v)| k.len() + v.len() + 48).sum()
    }

    /// The bucket id Envoy sent.
    pub fn to_proto(&self) -> BucketId {
        BucketId {
            bucket: self.0.iter().cloned().collect(),
        }
    }
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
        let key = BucketKey::from_proto(
            &id(&[("user", "alice"), ("path", "/api"), ("method", "GET")]),
            &RlsOptions::default(),
            0,
        )
        .unwrap();
        let keys: Vec<&str> = key.entries().iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["method", "path", "user"]);
        assert_eq!(
            key.to_proto(),
            id(&[("path", "/api"), ("user", "alice"), ("method", "GET")])
        );
    }

    #[test]
    fn one_entry_is_the_descriptor_of_that_entry() {
        let key =
            BucketKey::from_proto(&id(&[("user", "alice")]), &RlsOptions::default(), 0).unwrap();
        assert_eq!(key.entries(), [("user".to_owned(), "alice".to_owned())]);
    }

    #[test]
    fn empty_and_oversized_ids_are_refused() {
        let options = RlsOptions::default();
        assert!(BucketKey::from_proto(&id(&[]), &options, 0).is_err());
        let long = "x".repeat(options.max_value_len + 1);
        let err = BucketKey::from_proto(&id(&[("user", &long)]), &options, 3).unwrap_err();
        assert!(err.to_string().contains("descriptors[3]"), "{err}");
        let many: Vec<(String, String)> = (0..=options.max_entries)
            .map(|i| (format!("k{i}"), "v".to_owned()))
            .collect();
        let many: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert!(BucketKey::from_proto(&id(&many), &options, 0).is_err());
    }
}
