//! RLQS usage reports as they arrive on a `StreamRateLimitQuotas` stream (protobuf bytes), kept
//! the way a stream keeps them: never more than twice the message's bytes held, every usage either
//! decoded or a clean error, every bucket id either read as a bucket or refused with a reason,
//! and a report written back reads the same; never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use sluice_rls::rlqs::{Bucket, WireReport};

fuzz_target!(|data: &[u8]| {
    let Ok(report) = WireReport::decode(data) else {
        return;
    };
    // The usages' buffer is sized once, at the first usage, for the rest of the message; a
    // domain field repeated after it is counted in both (the memory budget of `rlqs:` allows
    // for it: docs/RLQS.md).
    assert!(
        report.held_bytes() <= 2 * data.len() + 64,
        "{} bytes held for a message of {}",
        report.held_bytes(),
        data.len()
    );
    let options = sluice_rls::RlsOptions::default();
    let mut read = 0;
    for usage in report.usages() {
        read += 1;
        if let Ok(usage) = usage
            && let Some(id) = &usage.bucket_id
        {
            let _ = Bucket::read(id, &options);
        }
    }
    assert_eq!(read, report.len());
    let again = WireReport::decode(report.encode_to_vec().as_slice()).expect("written back");
    assert_eq!(again, report);
});
