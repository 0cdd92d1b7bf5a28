use clap::Parser;
use switchyard_reconciler::sdk::Registry;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut controllers = Registry::default();
    controllers.register(switchyard_example_greeting::controller());
    switchyard_reconciler::Args::parse()
        .start(controllers)
        .await?
        .run()
        .await?;
    Ok(())
}
