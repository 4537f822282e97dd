#![no_main]
//! See `weir_io::fuzzing::WAL_SINK_STATE`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| weir_io::fuzzing::WAL_SINK_STATE.fuzz(data));
