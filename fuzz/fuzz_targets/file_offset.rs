#![no_main]
//! See `weir_io::fuzzing::FILE_OFFSET`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| weir_io::fuzzing::FILE_OFFSET.fuzz(data));
