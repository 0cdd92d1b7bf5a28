use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    switchyard_elector::Args::parse().run().await?;
    Ok(())
}
