//! Shared by the crate's integration tests: the workspace's binaries they run.

use std::path::PathBuf;
use std::process::Command;

/// The workspace binary `bin` of package `package`: `$var` if set, else next to the harness
/// in the target directory, built if missing.
pub fn binary(var: &str, package: &str, bin: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(var) {
        return PathBuf::from(p);
    }
    let harness = PathBuf::from(env!("CARGO_BIN_EXE_talon-jepsen"));
    let p = harness
        .parent()
        .expect("the harness binary has a directory")
        .join(bin);
    if !p.exists() {
        // `cargo nextest run --workspace` builds it; a lone `-p talon-jepsen` may not have.
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let st = Command::new(cargo)
            .args(["build", "-p", package, "--bin", bin])
            .status()
            .expect("run cargo build");
        assert!(st.success(), "cargo build -p {package} --bin {bin} failed");
    }
    assert!(p.exists(), "no {bin} at {}", p.display());
    p
}
