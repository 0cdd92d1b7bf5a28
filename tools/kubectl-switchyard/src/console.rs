//! `console`: the elector's live console in a local browser. The elector serves the page on
//! its gRPC port under mutual TLS; a browser holds no Switchyard identity, so this command
//! listens on a loopback address and forwards each GET to the elector with the identity of
//! `--tls-cert`, as `kubectl proxy` does with the kubeconfig's. The elector decides what that
//! identity sees (failing keys: the operator's only).
//!
//! Like `kubectl proxy` (its `--accept-hosts`), it answers only requests addressed to a
//! loopback name: a web page that rebinds its own DNS name to 127.0.0.1 could otherwise read
//! the console with this identity from the user's browser.

use std::net::SocketAddr;

use axum::{
    Router,
    body::Body,
    extract::State,
    http::{Method, Request, Response, StatusCode, header},
};
use switchyard_runtime::{Role, error_chain};
use tonic::transport::Channel;
use tower_service::Service;

use crate::connect::{Connections, Error, Result};

#[derive(Clone)]
struct Upstream {
    address: String,
    channel: Channel,
}

/// Serves the console on `listen` until Ctrl-C; prints where first.
pub async fn run(connections: &Connections, listen: SocketAddr) -> Result<()> {
    if !listen.ip().is_loopback() {
        return Err(Error::Config(format!(
            "--listen: {listen} is not a loopback address: whoever reached it would see the \
             console as {}",
            identity(connections)
        )));
    }
    let (address, channel) = connections.elector_channel().await?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| Error::Config(format!("--listen {listen}: {e}")))?;
    let local = listener
        .local_addr()
        .map_err(|e| Error::Config(format!("--listen {listen}: {e}")))?;
    println!(
        "console: http://{local}/console/ (the elector at {address}, as {}); Ctrl-C stops it",
        identity(connections)
    );
    let app = Router::new()
        .fallback(forward)
        .with_state(Upstream { address, channel });
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(|e| Error::Output(error_chain(&e)))
}

fn identity(connections: &Connections) -> String {
    connections.dialer.identity().map_or_else(
        || "no identity (plaintext)".to_owned(),
        |identity| identity.to_string(),
    )
}

/// The host names the console answers to, as `kubectl proxy`'s default `--accept-hosts`.
const ACCEPTED_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

/// Whether a request's `Host` header names a loopback host (any port).
fn accepted_host(host: &str) -> bool {
    let name = match host.rsplit_once(':') {
        // `[::1]:8001`, `localhost:8001`; a bare `[::1]` has its colons inside brackets.
        Some((name, port)) if !port.contains(']') => name,
        _ => host,
    };
    ACCEPTED_HOSTS
        .iter()
        .any(|accepted| name.eq_ignore_ascii_case(accepted))
}

/// One GET, forwarded; the elector's answer, or a 502 that names why there is none.
async fn forward(State(upstream): State<Upstream>, request: Request<Body>) -> Response<Body> {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    if !accepted_host(host) {
        return plain(
            StatusCode::FORBIDDEN,
            format!(
                "host {host:?} is not accepted: the console answers requests to {} only",
                ACCEPTED_HOSTS.join(", ")
            ),
        );
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return plain(
            StatusCode::METHOD_NOT_ALLOWED,
            "the console is read-only: GET only".to_owned(),
        );
    }
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let outgoing = Request::builder()
        .method(request.method().clone())
        .uri(format!("http://{}{path}", upstream.address))
        .body(tonic::body::Body::empty());
    let outgoing = match outgoing {
        Ok(outgoing) => outgoing,
        Err(error) => return plain(StatusCode::BAD_REQUEST, format!("{path}: {error}")),
    };
    let mut channel = upstream.channel;
    let answer = async {
        std::future::poll_fn(|cx| channel.poll_ready(cx)).await?;
        channel.call(outgoing).await
    };
    match answer.await {
        Ok(response) => response.map(Body::new),
        Err(error) => plain(
            StatusCode::BAD_GATEWAY,
            format!(
                "the {} at {} is unreachable: {}",
                Role::Elector,
                upstream.address,
                error_chain(&error)
            ),
        ),
    }
}

fn plain(status: StatusCode, text: String) -> Response<Body> {
    let mut response = Response::new(Body::from(text + "\n"));
    *response.status_mut() = status;
    response
}

#[cfg(test)]
mod tests {
    use super::accepted_host;

    #[test]
    fn only_loopback_host_names_are_accepted_with_any_port() {
        for host in [
            "localhost",
            "localhost:8001",
            "LOCALHOST:1",
            "127.0.0.1:41234",
            "[::1]",
            "[::1]:8001",
        ] {
            assert!(accepted_host(host), "{host}");
        }
        for host in [
            "",
            "evil.example",
            "evil.example:8001",
            "127.0.0.1.evil.example",
            "localhost.evil.example:80",
            "[::2]:8001",
            "0.0.0.0:8001",
        ] {
            assert!(!accepted_host(host), "{host}");
        }
    }
}
