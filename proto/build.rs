//! Compiles the .proto files with protox, a pure-Rust protobuf compiler, so building Talon
//! needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/talon.proto", "proto/raft.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .bytes(".talon.raft.v1")
        .compile_fds(fds)?;
    Ok(())
}
