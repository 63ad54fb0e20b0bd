//! `sluice.yaml`: any text gets a config or an error naming where, never a panic, and no error
//! shows a store password, nor does a parsed store's `Debug`.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use sluice_config::parse_service;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let result = parse_service(Path::new("sluice.yaml"), text);
    // A parsed store's `Debug` (what a log would show) never holds the password either.
    if let Ok(config) = &result
        && text.contains(":S3cretPass@")
    {
        let shown = format!("{:?} {:#?}", config.store, config.store);
        assert!(!shown.contains("S3cretPass"), "password in Debug: {shown}");
    }
    if let Err(error) = result {
        let message = error.to_string();
        assert!(message.contains("sluice.yaml"), "{message}");
        // The corpus writes its store passwords as `S3cretPass`: while the file holds one in a
        // URL (`://user:S3cretPass@`), no error may repeat it, however it quotes the file.
        if text.contains(":S3cretPass@") {
            assert!(!message.contains("S3cretPass"), "password in an error: {message}");
        }
    }
});
