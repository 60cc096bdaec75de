//! Compiles bpf/*.bpf.c into BPF objects that src/lib.rs embeds.
//!
//! vmlinux.h is generated from the build machine's kernel BTF into OUT_DIR
//! (CO-RE relocations make the objects portable to other kernels); set
//! TAILSCOPE_VMLINUX_H to use a pre-generated one instead.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const OBJECTS: &[&str] = &["kcounters", "infer"];

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest.join("../..");
    let bpf_dir = root.join("bpf");
    let include = root.join("runtime/include");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());

    println!("cargo:rerun-if-changed={}", bpf_dir.display());
    println!(
        "cargo:rerun-if-changed={}",
        include.join("tailscope/abi.h").display()
    );
    println!("cargo:rerun-if-env-changed=TAILSCOPE_VMLINUX_H");
    println!("cargo:rerun-if-env-changed=CLANG");

    write_vmlinux_h(&out);

    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".into());
    for name in OBJECTS {
        let src = bpf_dir.join(format!("{name}.bpf.c"));
        let obj = out.join(format!("{name}.bpf.o"));
        let status = Command::new(&clang)
            .args([
                "-target", "bpf", "-mcpu=v3", "-O2", "-g", "-Wall", "-Werror",
            ])
            .arg("-D__TARGET_ARCH_x86")
            .arg(format!("-I{}", out.display()))
            .arg(format!("-I{}", include.display()))
            .arg(format!("-I{}", bpf_dir.display()))
            .arg("-c")
            .arg(&src)
            .arg("-o")
            .arg(&obj)
            .status()
            .unwrap_or_else(|e| panic!("cannot run {clang} (install clang >= 12): {e}"));
        assert!(status.success(), "clang failed on {}", src.display());
    }
}

fn write_vmlinux_h(out: &Path) {
    let dest = out.join("vmlinux.h");
    if let Ok(p) = env::var("TAILSCOPE_VMLINUX_H") {
        std::fs::copy(&p, &dest).unwrap_or_else(|e| panic!("copy {p}: {e}"));
        return;
    }
    let btf = "/sys/kernel/btf/vmlinux";
    let output = Command::new("bpftool")
        .args(["btf", "dump", "file", btf, "format", "c"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run bpftool to generate vmlinux.h: {e}"));
    assert!(
        output.status.success(),
        "bpftool btf dump {btf} failed: {}; set TAILSCOPE_VMLINUX_H to a vmlinux.h",
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::write(&dest, output.stdout).unwrap();
}
