use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    switchyard_watcher::Args::parse().run().await?;
    Ok(())
}
