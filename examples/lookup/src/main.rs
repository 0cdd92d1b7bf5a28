use clap::Parser;
use switchyard_example_lookup::{Service, controller};
use switchyard_sdk::Registry;

/// The reconciler's flags, and where the lookup service is.
#[derive(Debug, Parser)]
#[command(name = "switchyard-example-lookup", version, about)]
struct Flags {
    /// The lookup service: each reconcile asks `GET <url>?q=<query>`
    #[arg(long, env = "LOOKUP_URL")]
    lookup_url: String,
    #[command(flatten)]
    reconciler: switchyard_sdk::Args,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Flags::parse();
    let mut controllers = Registry::default();
    controllers.register(controller(Service::new(&args.lookup_url)?));
    args.reconciler.start(controllers).await?.run().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_flags_are_the_reconcilers_and_the_lookup_url() {
        Flags::command().debug_assert();
        let flags = Flags::try_parse_from([
            "switchyard-example-lookup",
            "--lookup-url=http://127.0.0.1:8080/lookup",
            "--watcher-addr=127.0.0.1:1",
            "--queue-addr=127.0.0.1:2",
            "--tls-cert=tls.crt",
            "--tls-key=tls.key",
            "--tls-ca=ca.crt",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(Service::new(&flags.lookup_url).is_ok());
        let error = Service::new("ftp://x").unwrap_err().to_string();
        assert!(error.starts_with("--lookup-url: ftp://x"), "{error}");
        let error = Service::new("no url").unwrap_err().to_string();
        assert!(error.starts_with("--lookup-url: \"no url\""), "{error}");
    }
}
