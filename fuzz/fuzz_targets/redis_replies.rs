//! Replies a hostile or broken Redis could send (RESP bytes), through every decoder Sluice
//! reads them with: flush totals and entries, exact-mode script replies, `TIME`,
//! `CLUSTER SLOTS`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    sluice_store::fuzzing::decode_replies(data);
});
