//! `console`: the elector's live console in a local browser. The elector serves the page on
//! its gRPC port under mutual TLS; a browser holds no Switchyard identity, so this command
//! listens on a loopback address and forwards each GET to the elector with the identity of
//! `--tls-cert`, as `kubectl proxy` does with the kubeconfig's. The elector decides what that
//! identity sees (failing keys: the operator's only).

use std::net::SocketAddr;

use axum::{
    Router,
    body::Body,
    extract::State,
    http::{Method, Request, Response, StatusCode},
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

/// One GET, forwarded; the elector's answer, or a 502 that names why there is none.
async fn forward(State(upstream): State<Upstream>, request: Request<Body>) -> Response<Body> {
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
