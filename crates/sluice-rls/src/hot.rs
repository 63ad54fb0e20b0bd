//! The API's busiest routes, `POST /v1/acquire` and `POST /json`, answered from a body already
//! read: the same answers as the router's handlers (they share the state and the functions),
//! without the router's extractors and response machinery per request. A listener that
//! reads bodies itself (`sluice serve`'s API listener) calls these; everything else about
//! the request (its defences, other routes, other methods) stays the router's.

use std::sync::Arc;

use axum::http::{Method, StatusCode};

use crate::api::{ApiState, acquire_answer};
use crate::error::RequestError;

/// One of the routes answered here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HotRoute {
    /// `POST /json`.
    Json,
    /// `POST /v1/acquire`.
    Acquire,
}

impl HotRoute {
    /// The route a request's method and path name, if it is one answered here.
    pub fn of(method: &Method, path: &str) -> Option<Self> {
        if method != Method::POST {
            return None;
        }
        match path {
            "/json" => Some(Self::Json),
            "/v1/acquire" => Some(Self::Acquire),
            _ => None,
        }
    }

    /// Its `door` label in `sluice_requests_total`.
    pub fn door(self) -> &'static str {
        match self {
            Self::Json => "json",
            Self::Acquire => "acquire",
        }
    }
}

/// The hot routes over the same state as the router they were made with.
#[derive(Clone)]
pub struct HotRoutes {
    state: Arc<ApiState>,
    max_body: usize,
}

impl std::fmt::Debug for HotRoutes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HotRoutes").finish_non_exhaustive()
    }
}

impl HotRoutes {
    pub(crate) fn new(state: Arc<ApiState>, max_body: usize) -> Self {
        Self { state, max_body }
    }

    /// The largest body the router takes (`max_body`, when it was made); a longer one is the
    /// router's to refuse.
    pub fn max_body(&self) -> usize {
        self.max_body
    }

    /// The status and JSON body the router would answer `route` with for `body`.
    pub async fn answer(&self, route: HotRoute, body: &[u8]) -> (StatusCode, Vec<u8>) {
        let answered = match route {
            HotRoute::Acquire => acquire_answer(&self.state, body)
                .await
                .map(|a| (StatusCode::OK, serde_json::to_vec(&a))),
            HotRoute::Json => crate::json::answer(&self.state, body)
                .await
                .map(|(status, v)| (status, serde_json::to_vec(&v))),
        };
        match answered {
            Ok((status, Ok(bytes))) => (status, bytes),
            Ok((_, Err(_))) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                br#"{"error":"internal error"}"#.to_vec(),
            ),
            Err(e) => error_answer(&e),
        }
    }
}

fn error_answer(e: &RequestError) -> (StatusCode, Vec<u8>) {
    let body =
        serde_json::to_vec(&e.json()).unwrap_or_else(|_| br#"{"error":"internal error"}"#.to_vec());
    (e.status(), body)
}
