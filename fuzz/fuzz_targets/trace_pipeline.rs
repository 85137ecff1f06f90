#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| symm_tests::fuzz::trace_pipeline(data));
