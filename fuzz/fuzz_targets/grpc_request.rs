//! Envoy RLS `ShouldRateLimit` requests as they arrive on the wire (protobuf bytes) into the
//! engine: a decision with one status per descriptor, or `INVALID_ARGUMENT`, `NOT_FOUND` or
//! `FAILED_PRECONDITION` with a message; never another error, never a panic.
#![no_main]

use std::sync::OnceLock;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    static SERVICE: OnceLock<sluice_rls::RateLimitGrpc> = OnceLock::new();
    let service = SERVICE.get_or_init(|| {
        sluice_rls::RateLimitGrpc::new(sluice_fuzz::shared_engine(), Default::default())
    });
    let runtime = sluice_fuzz::runtime();
    // The hot lane's path (`sluice serve` answers a message already read this way): any bytes
    // get one whole response message or a status, never a panic.
    match runtime.block_on(service.answer_message(data)) {
        Ok(framed) => {
            let (prefix, message) = framed.split_at(5);
            assert_eq!(prefix[0], 0);
            assert_eq!(
                u32::from_be_bytes(prefix[1..5].try_into().unwrap()) as usize,
                message.len()
            );
            assert!(RateLimitResponse::decode(message).is_ok());
        }
        Err(status) => assert!(
            matches!(
                status.code(),
                tonic::Code::Internal
                    | tonic::Code::InvalidArgument
                    | tonic::Code::NotFound
                    | tonic::Code::FailedPrecondition
            ),
            "{status:?}"
        ),
    }
    let Ok(request) = RateLimitRequest::decode(data) else {
        return;
    };
    let descriptors = request.descriptors.len();
    match runtime.block_on(service.should_rate_limit(tonic::Request::new(request))) {
        Ok(response) => assert_eq!(response.get_ref().statuses.len(), descriptors),
        // Malformed, unknown domain, or an operation the rule does not support.
        Err(status) => assert!(
            matches!(
                status.code(),
                tonic::Code::InvalidArgument
                    | tonic::Code::NotFound
                    | tonic::Code::FailedPrecondition
            ),
            "{status:?}"
        ),
    }
});
