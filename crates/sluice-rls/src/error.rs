use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use sluice_engine::EngineError;

/// A request Sluice cannot answer. One error maps to both an HTTP status and a gRPC code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// The request is malformed; the message says which field and why.
    #[error("{0}")]
    Invalid(String),
    /// The domain has no rules.
    #[error("{0}")]
    UnknownDomain(String),
    /// The operation does not apply to the matched rule.
    #[error("{0}")]
    Unsupported(String),
}

impl RequestError {
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        RequestError::Invalid(message.into())
    }

    pub(crate) fn status(&self) -> StatusCode {
        match self {
            RequestError::Invalid(_) => StatusCode::BAD_REQUEST,
            RequestError::UnknownDomain(_) => StatusCode::NOT_FOUND,
            RequestError::Unsupported(_) => StatusCode::CONFLICT,
        }
    }
}

impl From<EngineError> for RequestError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::UnknownDomain(d) => RequestError::UnknownDomain(format!(
                "unknown domain `{d}`: no rule file defines it"
            )),
            e @ EngineError::CostTooLarge { .. } => RequestError::Invalid(e.to_string()),
            other => RequestError::Unsupported(other.to_string()),
        }
    }
}

impl From<RequestError> for tonic::Status {
    fn from(e: RequestError) -> Self {
        match e {
            RequestError::Invalid(m) => tonic::Status::invalid_argument(m),
            RequestError::UnknownDomain(m) => tonic::Status::not_found(m),
            RequestError::Unsupported(m) => tonic::Status::failed_precondition(m),
        }
    }
}

impl RequestError {
    /// The JSON body this error is answered with over HTTP.
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::json!({ "error": self.to_string() })
    }
}

impl IntoResponse for RequestError {
    fn into_response(self) -> Response {
        (self.status(), axum::Json(self.json())).into_response()
    }
}

/// Checks a descriptor's entries against the caps.
pub(crate) fn check_entries<'a>(
    options: &crate::RlsOptions,
    index: usize,
    entries: impl ExactSizeIterator<Item = (&'a str, &'a str)>,
) -> Result<(), RequestError> {
    if entries.len() == 0 {
        return Err(RequestError::invalid(format!(
            "descriptors[{index}] has no entries"
        )));
    }
    if entries.len() > options.max_entries {
        return Err(RequestError::invalid(format!(
            "descriptors[{index}] has {} entries; at most {} are allowed",
            entries.len(),
            options.max_entries
        )));
    }
    for (j, (key, value)) in entries.enumerate() {
        if key.is_empty() {
            return Err(RequestError::invalid(format!(
                "descriptors[{index}].entries[{j}].key is empty"
            )));
        }
        if key.len() > options.max_key_len {
            return Err(RequestError::invalid(format!(
                "descriptors[{index}].entries[{j}].key is {} bytes; at most {} are allowed",
                key.len(),
                options.max_key_len
            )));
        }
        if value.len() > options.max_value_len {
            return Err(RequestError::invalid(format!(
                "descriptors[{index}].entries[{j}].value is {} bytes; at most {} are allowed",
                value.len(),
                options.max_value_len
            )));
        }
    }
    Ok(())
}

pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, RequestError> {
    serde_json::from_slice(body)
        .map_err(|e| RequestError::invalid(format!("invalid JSON body: {e}")))
}
