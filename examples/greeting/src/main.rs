use switchyard_sdk::Registry;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut controllers = Registry::default();
    controllers
        .register(switchyard_example_greeting::controller())
        .webhooks(switchyard_example_greeting::webhooks::webhooks());
    switchyard_sdk::run(controllers).await?;
    Ok(())
}
