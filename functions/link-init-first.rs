//! The build script of each Lambda function: link the code its start-up runs ahead of the
//! rest of the binary, so a cold start maps few pages of it.
//!
//! A function's `init-order.ld` (made by `scripts/init-order.py`, which runs the function's
//! init under callgrind) names the functions init ran, by their symbols with the parts that
//! differ between builds and targets (crate hashes, which crate's copy) wildcarded; linked
//! with it, lld gathers them in one output section, `.text.init`, in front of `.text`.
//! Unordered, the same code is spread over a 7 MiB binary, and the kernel maps 64 KiB
//! around every page that faults: twice the memory at the first `next` (docs/aws.md). The
//! script only moves code; a symbol it names that no longer exists matches nothing.
use std::{env, path::PathBuf};

fn main() {
    let script =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR")).join("init-order.ld");
    println!("cargo::rerun-if-changed={}", script.display());
    // Linux (ELF) only: the script is a GNU linker script (lld, GNU ld and zig's lld read it).
    let linux = env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux");
    if linux && script.is_file() {
        println!("cargo::rustc-link-arg-bins=-Wl,-T,{}", script.display());
        // RUSTFLAGS in the environment replaces .cargo/config.toml's flags: without v0 names,
        // the script's patterns find the standard library's functions only.
        let flags = env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
        let v0 = flags
            .split('\x1f')
            .any(|flag| flag.ends_with("symbol-mangling-version=v0"));
        if !v0 {
            println!(
                "cargo::warning=init's code will be only partly linked first: add `-C \
                 symbol-mangling-version=v0` to RUSTFLAGS (see .cargo/config.toml)"
            );
        }
    }
}
