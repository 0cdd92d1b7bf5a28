use clap::Parser;
use switchyard_certs::cli::Args;

fn main() -> anyhow::Result<()> {
    let written = Args::parse().run()?;
    if written.generated_ca {
        println!("generated a ca: keep ca.key safe, it can sign any identity");
    }
    for (dir, id) in &written.identities {
        println!("wrote {} ({id})", dir.display());
    }
    println!("wrote {}", written.kustomization.display());
    Ok(())
}
