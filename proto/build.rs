//! Compiles the .proto files with protox, a pure-Rust protobuf compiler, so building Talon
//! needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/talon.proto", "proto/raft.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    // Bodies and chunks as `Bytes`: a request is cloned for every attempt and handed on
    // to the Raft command without copying its payload.
    tonic_prost_build::configure()
        .bytes(".talon.raft.v1")
        .bytes(".talon.v1.WriteSmallRequest.body")
        .bytes(".talon.v1.PutChunkRequest.data")
        .compile_fds(fds)?;
    Ok(())
}
