use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    switchyard_reconciler::Args::parse().run().await?;
    Ok(())
}
