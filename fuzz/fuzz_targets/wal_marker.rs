#![no_main]
//! See `weir_io::fuzzing::WAL_MARKER`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| weir_io::fuzzing::WAL_MARKER.fuzz(data));
