#![no_main]
//! See `weir_io::fuzzing::TWOPHASE_STATE`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| weir_io::fuzzing::TWOPHASE_STATE.fuzz(data));
