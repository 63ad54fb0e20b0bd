//! Replies a hostile or broken etcd could send (protobuf bytes of a transaction reply),
//! through every reader of the etcd store: flush totals, entries and previous totals, a
//! failed compare's counter, the live-instance count.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    sluice_store::fuzzing::decode_etcd_reply(data);
});
