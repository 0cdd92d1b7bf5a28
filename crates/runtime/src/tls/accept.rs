//! The TLS side of a listener: each handshake on its own task, so a slow or hostile client
//! never holds up the others, and the listener closed as soon as its server stops.
//!
//! ```text
//!  TcpListener ─► accept ─► spawn: handshake (≤ HANDSHAKE_TIMEOUT) ─► mpsc ─► server
//! ```
//!
//! A connection closed before its first byte is a TCP probe and is let go quietly; any other
//! failed handshake is counted and logged.

use std::{net::SocketAddr, time::Duration};

use prometheus_client::metrics::counter::Counter;
use tokio::{
    net::{TcpListener, TcpStream},
    sync::mpsc,
};
use tokio_rustls::{TlsAcceptor, server::TlsStream};
use tracing::{debug, warn};

use crate::log_limiter::LogLimiter;

/// A client that never finishes its handshake gives up its slot after this long; a
/// Switchyard peer completes one in milliseconds.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshaken connections waiting for the server; more wait in the kernel's backlog.
const ACCEPT_QUEUE: usize = 64;
/// Pause after a failed accept (for example, out of file descriptors) before trying again.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// What the accept loop needs besides the listener.
#[derive(Clone)]
pub struct Handshakes {
    pub acceptor: TlsAcceptor,
    /// Counts failed handshakes (no common protocol, a certificate from another CA, an
    /// expired one).
    pub failures: Counter,
    /// Names the listener in logs.
    pub what: &'static str,
    /// Disable Nagle's algorithm on accepted sockets.
    pub nodelay: bool,
}

impl std::fmt::Debug for Handshakes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handshakes")
            .field("what", &self.what)
            .field("nodelay", &self.nodelay)
            .finish_non_exhaustive()
    }
}

/// The handshaken connections of [`accept`], as an HTTP server's listener (`axum::serve`):
/// an HTTPS server whose handshakes run on their own tasks.
#[derive(Debug)]
pub struct HttpsListener {
    addr: SocketAddr,
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
}

impl HttpsListener {
    /// Starts accepting on `listener`, bound at `addr`; it closes when this is dropped.
    pub fn new(addr: SocketAddr, listener: TcpListener, handshakes: Handshakes) -> Self {
        Self {
            addr,
            rx: accept(listener, handshakes),
        }
    }
}

impl axum::serve::Listener for HttpsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(accepted) => accepted,
            // The accept task has stopped: nothing more will arrive.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.addr)
    }
}

/// Accepts on `listener` until the returned receiver is dropped; then the listener closes.
pub fn accept(
    listener: TcpListener,
    handshakes: Handshakes,
) -> mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)> {
    let (tx, rx) = mpsc::channel(ACCEPT_QUEUE);
    tokio::spawn(accept_loop(listener, handshakes, tx));
    rx
}

async fn accept_loop(
    listener: TcpListener,
    handshakes: Handshakes,
    tx: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let limiter = std::sync::Arc::new(LogLimiter::default());
    loop {
        let accepted = tokio::select! {
            () = tx.closed() => return,
            accepted = listener.accept() => accepted,
        };
        let (tcp, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                warn!(%error, listener = handshakes.what, "accept failed");
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        if handshakes.nodelay {
            let _ = tcp.set_nodelay(true);
        }
        let handshakes = handshakes.clone();
        let limiter = limiter.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let handshake = async {
                // Closed before its first byte: a TCP probe (the elector's check that a member
                // is gone, a kubelet `tcpSocket` probe), not a refused handshake.
                if tcp.peek(&mut [0; 1]).await? == 0 {
                    return Ok(None);
                }
                handshakes.acceptor.accept(tcp).await.map(Some)
            };
            let error = match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                Ok(Ok(Some(tls))) => {
                    let _ = tx.send((tls, peer)).await;
                    return;
                }
                Ok(Ok(None)) => {
                    debug!(%peer, listener = handshakes.what, "connection closed before a handshake (a probe)");
                    return;
                }
                Ok(Err(error)) => error.to_string(),
                Err(_) => "timed out".to_owned(),
            };
            handshakes.failures.inc();
            if limiter.due(peer.ip().to_string()) {
                warn!(%peer, %error, listener = handshakes.what, "tls handshake failed (logged once a minute per peer)");
            }
        });
    }
}
