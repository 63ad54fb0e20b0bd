//! Bearer tokens for the admin endpoints and the APIs (`access:` in `sluice.yaml`). A token is
//! compared in constant time and never logged; a missing or wrong token gets 401 (gRPC:
//! `UNAUTHENTICATED`) with a message that says which header to send, never the token.

use std::path::Path;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use subtle::ConstantTimeEq as _;

use crate::error::ServerError;

/// A token read from a file. Its `Debug` never shows it.
#[derive(Clone)]
pub(crate) struct Token(Arc<[u8]>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(***)")
    }
}

impl Token {
    /// Reads the token in `file` (surrounding whitespace removed; at least 16 bytes).
    pub(crate) fn read(file: &Path, what: &str) -> Result<Self, ServerError> {
        let text = std::fs::read_to_string(file).map_err(|e| {
            ServerError::file_because(format!("cannot read {what} {}", file.display()), e)
        })?;
        let token = text.trim();
        if token.len() < 16 {
            return Err(ServerError::file(format!(
                "{what} {} holds {} bytes; a token needs at least 16 (e.g. `openssl rand -hex 32`)",
                file.display(),
                token.len()
            )));
        }
        if token.bytes().any(|b| !b.is_ascii_graphic()) {
            return Err(ServerError::file(format!(
                "{what} {} holds a character that cannot be sent in a header; use printable ASCII",
                file.display()
            )));
        }
        Ok(Self(Arc::from(token.as_bytes())))
    }

    /// A token of these bytes, for tests.
    #[cfg(test)]
    pub(crate) fn for_tests(token: &[u8]) -> Self {
        Self(Arc::from(token))
    }

    /// Whether an `authorization` header value carries this token.
    pub(crate) fn accepts(&self, header: Option<&[u8]>) -> bool {
        let Some(presented) = header.and_then(|h| {
            h.strip_prefix(b"Bearer ")
                .or_else(|| h.strip_prefix(b"bearer "))
        }) else {
            return false;
        };
        bool::from(presented.ct_eq(&self.0))
    }
}

/// Axum middleware: the request goes on only with `authorization: Bearer <token>`.
pub(crate) async fn require_bearer(
    State(token): State<Token>,
    request: Request,
    next: Next,
) -> Response {
    let header = request
        .headers()
        .get(http::header::AUTHORIZATION)
        .map(http::HeaderValue::as_bytes);
    if token.accepts(header) {
        return next.run(request).await;
    }
    metrics::counter!("sluice_unauthorized_total").increment(1);
    let mut response = (
        StatusCode::UNAUTHORIZED,
        axum::Json(serde_json::json!({
            "error": "missing or wrong token; send `authorization: Bearer <token>`"
        })),
    )
        .into_response();
    response.headers_mut().insert(
        http::header::WWW_AUTHENTICATE,
        http::HeaderValue::from_static("Bearer"),
    );
    response
}

/// A tonic interceptor with the same rule, on the `authorization` metadata.
pub(crate) fn grpc_interceptor(
    token: Token,
) -> impl FnMut(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + Clone {
    move |request: tonic::Request<()>| {
        let header = request
            .metadata()
            .get("authorization")
            .map(tonic::metadata::MetadataValue::as_bytes);
        if token.accepts(header) {
            Ok(request)
        } else {
            metrics::counter!("sluice_unauthorized_total").increment(1);
            Err(tonic::Status::unauthenticated(
                "missing or wrong token; send `authorization: Bearer <token>` metadata",
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_match_whole_and_only_as_bearer() {
        let token = Token(Arc::from(&b"0123456789abcdef"[..]));
        assert!(token.accepts(Some(b"Bearer 0123456789abcdef")));
        assert!(!token.accepts(Some(b"Bearer 0123456789abcde")));
        assert!(!token.accepts(Some(b"Bearer 0123456789abcdefg")));
        assert!(!token.accepts(Some(b"0123456789abcdef")));
        assert!(!token.accepts(None));
        assert_eq!(format!("{token:?}"), "Token(***)");
    }
}
