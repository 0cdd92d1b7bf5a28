//! Generates the gRPC code from `switchyard/**/*.proto` with a protoc that ships in a
//! crates.io package, so a fresh machine builds with no manual step.

use std::{env, path::PathBuf};

const PROTOS: &[&str] = &[
    "switchyard/common/v1/common.proto",
    "switchyard/queue/v1/queue.proto",
    "switchyard/elector/v1/elector.proto",
    "switchyard/watcher/v1/watcher.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let well_known = protoc_bin_vendored::include_path()?;
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);

    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc);
    let includes = [PathBuf::from("."), well_known];
    let protos: Vec<PathBuf> = PROTOS.iter().map(PathBuf::from).collect();
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("switchyard_descriptor.bin"))
        .compile_with_config(config, &protos, &includes)?;

    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    Ok(())
}
