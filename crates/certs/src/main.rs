use std::process::ExitCode;

use clap::Parser;
use switchyard_certs::cli::Args;

fn main() -> ExitCode {
    match Args::parse().run() {
        Ok(written) => {
            if written.generated_ca {
                println!("generated a ca: keep ca.key safe, it can sign any identity");
            }
            for (dir, id) in &written.identities {
                println!("wrote {} ({id})", dir.display());
            }
            println!("wrote {}", written.kustomization.display());
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("switchyard-certs: {error}");
            ExitCode::FAILURE
        }
    }
}
