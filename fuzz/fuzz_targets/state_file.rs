#![no_main]
//! See `weir_core::fuzzing::STATE_FILE`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| weir_core::fuzzing::STATE_FILE.fuzz(data));
