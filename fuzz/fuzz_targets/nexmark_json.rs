#![no_main]
//! See `weir_io::fuzzing::NEXMARK_JSON`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| weir_io::fuzzing::NEXMARK_JSON.fuzz(data));
