//! The HTTP API's bodies (`/json`, `/v1/acquire`, `/v1/acquire/batch`, `/v1/refill`): any body
//! gets a decision or a 4xx that says what is wrong, never a 500 or a panic.
#![no_main]

use std::sync::OnceLock;

use arbitrary::Arbitrary;
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;

#[derive(Arbitrary, Debug)]
struct Input {
    route: u8,
    json_content_type: bool,
    body: Vec<u8>,
}

const ROUTES: [&str; 4] = ["/json", "/v1/acquire", "/v1/acquire/batch", "/v1/refill"];

fuzz_target!(|input: Input| {
    // One engine for the whole run, as in `sluice serve`: state left by earlier inputs (keys
    // at their cap, ad-hoc shapes) is part of what is fuzzed.
    static APP: OnceLock<axum::Router> = OnceLock::new();
    let app = APP.get_or_init(|| {
        sluice_rls::http_router(
            sluice_fuzz::shared_engine(),
            sluice_rls::RlsOptions {
                api_domain: "api".to_owned(),
                ..Default::default()
            },
        )
    });
    let route = ROUTES[usize::from(input.route) % ROUTES.len()];
    let mut request = http::Request::post(route);
    if input.json_content_type {
        request = request.header("content-type", "application/json");
    }
    let request = request.body(axum::body::Body::from(input.body)).unwrap();
    let runtime = sluice_fuzz::runtime();
    let (status, body) = runtime.block_on(async {
        let response = app.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, body)
    });
    assert!(
        status.is_success() || status.is_client_error(),
        "{route}: {status} {}",
        String::from_utf8_lossy(&body)
    );
    if status.is_success() {
        assert!(serde_json::from_slice::<serde_json::Value>(&body).is_ok());
    }
});
