#![no_main]
//! See `weir_io::fuzzing::FILE_LINES`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| weir_io::fuzzing::FILE_LINES.fuzz(data));
