//! `sluice_requests_total{door, result}`: every answer of every front door, counted by the
//! door (`json`, `acquire`, `acquire_batch`, `refill`, `other` on the HTTP listener; `gateway`;
//! `grpc` is counted by its service) and what it answered, with the gateway's upstream
//! failures apart (`bad_gateway`, `gateway_timeout`). Labels are a fixed set: no path or
//! value from the request becomes a label.

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;

/// The result label of an HTTP answer.
pub(crate) fn result_of(status: StatusCode) -> &'static str {
    match status.as_u16() {
        200..=399 => "ok",
        429 => "over_limit",
        502 => "bad_gateway",
        503 => "shed",
        504 => "gateway_timeout",
        400..=499 => "client_error",
        _ => "server_error",
    }
}

fn api_door(path: &str) -> &'static str {
    match path {
        "/json" => "json",
        "/v1/acquire" => "acquire",
        "/v1/acquire/batch" => "acquire_batch",
        "/v1/refill" => "refill",
        _ => "other",
    }
}

/// Counts the HTTP API listener's answers by route.
pub(crate) async fn count_api(request: Request, next: Next) -> Response {
    let door = api_door(request.uri().path());
    let response = next.run(request).await;
    metrics::counter!("sluice_requests_total", "door" => door, "result" => result_of(response.status()))
        .increment(1);
    response
}

/// Counts a gateway's answers.
pub(crate) fn count_gateway(response: Response) -> Response {
    metrics::counter!("sluice_requests_total", "door" => "gateway", "result" => result_of(response.status()))
        .increment(1);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_map_to_a_fixed_set_of_results() {
        let cases = [
            (200, "ok"),
            (429, "over_limit"),
            (413, "client_error"),
            (502, "bad_gateway"),
            (503, "shed"),
            (504, "gateway_timeout"),
            (500, "server_error"),
        ];
        for (code, result) in cases {
            assert_eq!(result_of(StatusCode::from_u16(code).unwrap()), result);
        }
        assert_eq!(api_door("/v1/acquire/batch"), "acquire_batch");
        assert_eq!(api_door("/anything/else"), "other");
    }
}
