//! placeholder; owned by the BPF work
