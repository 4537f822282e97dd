#![no_main]
//! See `weir_io::fuzzing::KAFKA_OFFSET`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| weir_io::fuzzing::KAFKA_OFFSET.fuzz(data));
