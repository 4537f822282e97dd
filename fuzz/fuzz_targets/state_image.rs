#![no_main]
//! See `weir_core::fuzzing::STATE_IMAGE`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| weir_core::fuzzing::STATE_IMAGE.fuzz(data));
