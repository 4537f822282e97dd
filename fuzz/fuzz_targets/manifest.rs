#![no_main]
//! See `weir_core::fuzzing::MANIFEST`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| weir_core::fuzzing::MANIFEST.fuzz(data));
