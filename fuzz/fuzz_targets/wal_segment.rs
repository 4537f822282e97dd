#![no_main]
//! See `weir_io::fuzzing::WAL_SEGMENT`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| weir_io::fuzzing::WAL_SEGMENT.fuzz(data));
