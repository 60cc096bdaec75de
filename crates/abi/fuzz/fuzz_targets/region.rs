//! libFuzzer target: every region parser over arbitrary bytes
//! (see tailscope_abi::fuzzing::exercise for the promises it checks).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    tailscope_abi::fuzzing::exercise(data);
});
