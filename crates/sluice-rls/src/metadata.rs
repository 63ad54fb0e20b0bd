//! The response's dynamic metadata for Envoy (`RateLimitResponse.dynamic_metadata`, which
//! Envoy's rate limit filter puts in its own namespace for later filters and access logs):
//! the `metadata` of every rule file descriptor that matched, and the quota-mode outcome.
//!
//! ```json
//! {"domain": "edge",
//!  "descriptors": [{"entries": ["plan=gold"], "metadata": {"tier": "gold"}}],
//!  "quotaModeEnabled": true, "quotaModeViolations": [1]}
//! ```
//!
//! `descriptors` lists the request's descriptors whose matched rule carries `metadata`;
//! `quotaModeEnabled` is present when a quota-mode rule matched, with the indices of the
//! request's descriptors that went over a quota-mode limit.

use envoy_types::pb::google::protobuf::{ListValue, Struct, Value, value::Kind};
use sluice_engine::{Outcome, Verdict};

fn value(kind: Kind) -> Value {
    Value { kind: Some(kind) }
}

fn string(s: impl Into<String>) -> Value {
    value(Kind::StringValue(s.into()))
}

fn list(values: Vec<Value>) -> Value {
    value(Kind::ListValue(ListValue { values }))
}

/// A JSON value (a rule file's `metadata`) as a protobuf `Value`.
fn from_json(json: &serde_json::Value) -> Value {
    match json {
        serde_json::Value::Null => value(Kind::NullValue(0)),
        serde_json::Value::Bool(b) => value(Kind::BoolValue(*b)),
        serde_json::Value::Number(n) => value(Kind::NumberValue(n.as_f64().unwrap_or(0.0))),
        serde_json::Value::String(s) => string(s.clone()),
        serde_json::Value::Array(items) => list(items.iter().map(from_json).collect()),
        serde_json::Value::Object(map) => value(Kind::StructValue(Struct {
            fields: map.iter().map(|(k, v)| (k.clone(), from_json(v))).collect(),
        })),
    }
}

/// The dynamic metadata for a decided request, or `None` when no rule with `metadata` or in
/// quota mode matched.
pub(crate) fn dynamic_metadata(
    domain: &str,
    descriptors: &[Vec<(&str, &str)>],
    verdict: &Verdict<'_>,
) -> Option<Struct> {
    let mut described = Vec::new();
    for (i, entries) in descriptors.iter().enumerate() {
        let Some(metadata) = verdict
            .statuses
            .iter()
            .filter(|s| s.descriptor == i)
            .find_map(|s| s.metadata)
        else {
            continue;
        };
        let entries = entries
            .iter()
            .map(|(k, v)| string(format!("{k}={v}")))
            .collect();
        described.push(value(Kind::StructValue(Struct {
            fields: [
                ("entries".to_owned(), list(entries)),
                ("metadata".to_owned(), from_json(metadata)),
            ]
            .into(),
        })));
    }
    let quota = verdict.statuses.iter().any(|s| s.quota_mode);
    if described.is_empty() && !quota {
        return None;
    }
    let mut fields = std::collections::HashMap::new();
    fields.insert("domain".to_owned(), string(domain));
    if !described.is_empty() {
        fields.insert("descriptors".to_owned(), list(described));
    }
    if quota {
        let mut violations: Vec<usize> = verdict
            .statuses
            .iter()
            .filter(|s| {
                s.quota_mode && matches!(s.outcome, Outcome::QuotaExceeded | Outcome::Denied)
            })
            .map(|s| s.descriptor)
            .collect();
        violations.dedup();
        fields.insert("quotaModeEnabled".to_owned(), value(Kind::BoolValue(true)));
        fields.insert(
            "quotaModeViolations".to_owned(),
            list(
                violations
                    .into_iter()
                    .map(|i| value(Kind::NumberValue(i as f64)))
                    .collect(),
            ),
        );
    }
    Some(Struct { fields })
}

/// A protobuf `Struct` as JSON (for `/json`).
pub(crate) fn to_json(s: &Struct) -> serde_json::Value {
    fn one(v: &Value) -> serde_json::Value {
        match &v.kind {
            None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
            Some(Kind::BoolValue(b)) => (*b).into(),
            // Whole numbers print as integers (`3`, not `3.0`).
            Some(Kind::NumberValue(n)) if n.fract() == 0.0 && n.abs() < 9.0e15 => {
                (*n as i64).into()
            }
            Some(Kind::NumberValue(n)) => serde_json::Number::from_f64(*n)
                .map_or(serde_json::Value::Null, serde_json::Value::Number),
            Some(Kind::StringValue(s)) => s.clone().into(),
            Some(Kind::ListValue(l)) => l.values.iter().map(one).collect(),
            Some(Kind::StructValue(s)) => to_json(s),
        }
    }
    serde_json::Value::Object(s.fields.iter().map(|(k, v)| (k.clone(), one(v))).collect())
}
