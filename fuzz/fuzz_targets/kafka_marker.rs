#![no_main]
//! See `weir_io::fuzzing::KAFKA_MARKER`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| weir_io::fuzzing::KAFKA_MARKER.fuzz(data));
