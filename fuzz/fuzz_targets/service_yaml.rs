//! `sluice.yaml`: any text gets a config or an error naming where, never a panic, and no error
//! shows a store password.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use sluice_config::parse_service;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(error) = parse_service(Path::new("sluice.yaml"), text) {
        let message = error.to_string();
        assert!(message.contains("sluice.yaml"), "{message}");
        // The corpus writes its store passwords as `S3cretPass`: while the file holds one in a
        // URL (`://user:S3cretPass@`), no error may repeat it, however it quotes the file.
        if text.contains(":S3cretPass@") {
            assert!(!message.contains("S3cretPass"), "password in an error: {message}");
        }
    }
});
