use clap::Parser;
use switchyard_reconciler::sdk::Registry;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut registry = Registry::default();
    registry.register(switchyard_example_greeting::GreetingController);
    let rt = switchyard_reconciler::Args::parse().start(registry).await?;
    rt.run().await?;
    Ok(())
}
