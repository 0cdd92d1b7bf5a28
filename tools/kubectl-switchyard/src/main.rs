//! `kubectl switchyard`: see [`kubectl_switchyard`].

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    use clap::Parser;
    kubectl_switchyard::Cli::parse().run().await
}
