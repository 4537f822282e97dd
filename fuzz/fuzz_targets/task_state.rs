#![no_main]
//! See `weir_core::fuzzing::TASK_STATE`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| weir_core::fuzzing::TASK_STATE.fuzz(data));
