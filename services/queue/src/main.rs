use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    switchyard_queue::Args::parse().run().await?;
    Ok(())
}
