//! Reaching the services: gRPC with the installation's mutual TLS (the server's role
//! checked), and the admin ports over plain HTTP. Every failure names what was unreachable,
//! where, and why.

use std::{error::Error as _, future::Future, time::Duration};

use switchyard_proto::{
    elector::v1::{GetShardMapRequest, ShardMap, elector_client::ElectorClient},
    queue::v1::queue_client::QueueClient,
};
use switchyard_runtime::{Dialer, Role, error_chain};
use tonic::{Code, transport::Channel};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A flag is missing or wrong; the message names it.
    #[error("{0}")]
    Config(String),
    #[error("the {what} at {address} is unreachable: {reason}")]
    Unreachable {
        what: &'static str,
        address: String,
        reason: String,
    },
    #[error("the {what} at {address} refused {call}: {reason}")]
    Refused {
        what: &'static str,
        address: String,
        call: &'static str,
        reason: String,
    },
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Timeout(String),
    #[error("writing the output: {0}")]
    Output(String),
    /// The command answered, but some of what it asked was unreachable.
    #[error("{count} problem(s); the first: {first}")]
    Degraded { count: usize, first: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug)]
pub struct Connections {
    pub dialer: Dialer,
    electors: Vec<String>,
    pub queues: Vec<String>,
    pub admins: Vec<String>,
    pub timeout: Duration,
    http: reqwest::Client,
}

impl Connections {
    pub fn new(args: &crate::ConnectArgs) -> Result<Self> {
        let dialer = Dialer::from_args(&args.tls.args()?).map_err(|e| {
            Error::Config(format!(
                "--tls-cert/--tls-key/--tls-ca: {}",
                error_chain(&e)
            ))
        })?;
        let timeout: Duration = args.call_timeout.into();
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| Error::Config(error_chain(&e)))?;
        let clean = |list: &[String]| -> Vec<String> {
            list.iter()
                .map(|a| a.trim().to_owned())
                .filter(|a| !a.is_empty())
                .collect()
        };
        Ok(Self {
            dialer,
            electors: clean(&args.elector_addr),
            queues: clean(&args.queue_addr),
            admins: clean(&args.admin_addr),
            timeout,
            http,
        })
    }

    /// A channel to the `peer` at `address`, connected now.
    async fn channel(&self, what: &'static str, address: &str, peer: Role) -> Result<Channel> {
        let unreachable = |reason: String| Error::Unreachable {
            what,
            address: address.to_owned(),
            reason,
        };
        let endpoint = self
            .dialer
            .endpoint(address, peer)
            .map_err(|e| unreachable(error_chain(&e)))?
            .connect_timeout(self.timeout)
            .timeout(self.timeout);
        match tokio::time::timeout(self.timeout, self.dialer.connect(&endpoint, peer)).await {
            Ok(Ok(channel)) => Ok(channel),
            Ok(Err(error)) => Err(unreachable(
                error
                    .source()
                    .map_or_else(|| error.to_string(), error_chain),
            )),
            Err(_) => Err(unreachable(format!(
                "no connection within {:?}",
                self.timeout
            ))),
        }
    }

    pub async fn queue(&self, address: &str) -> Result<QueueClient<Channel>> {
        Ok(QueueClient::new(
            self.channel("queue replica", address, Role::Queue).await?,
        ))
    }

    pub fn has_elector(&self) -> bool {
        !self.electors.is_empty()
    }

    /// The first elector that answers, and its address.
    pub async fn elector(&self) -> Result<(String, ElectorClient<Channel>)> {
        let (address, channel) = self.elector_channel().await?;
        Ok((address, ElectorClient::new(channel)))
    }

    /// A connection to the first elector replica that answers, and its address.
    pub async fn elector_channel(&self) -> Result<(String, Channel)> {
        if self.electors.is_empty() {
            return Err(Error::Config(
                "--elector-addr (or SWITCHYARD_ELECTOR_ADDR): required to find the queue \
                 replicas and the shard map; an elector inside the cluster is reached with \
                 `kubectl -n switchyard port-forward svc/switchyard-elector 8443` and \
                 --elector-addr=127.0.0.1:8443"
                    .into(),
            ));
        }
        let mut last = None;
        for address in &self.electors {
            match self.channel("elector", address, Role::Elector).await {
                Ok(channel) => return Ok((address.clone(), channel)),
                Err(error) => last = Some(error),
            }
        }
        Err(last.unwrap_or_else(|| Error::Config("--elector-addr: empty".into())))
    }

    /// The shard map, from the first elector that answers.
    pub async fn shard_map(&self) -> Result<(String, ShardMap)> {
        let (address, mut client) = self.elector().await?;
        let map = call("elector", &address, "GetShardMap", self.timeout, async {
            client.get_shard_map(GetShardMapRequest {}).await
        })
        .await?;
        Ok((address, map))
    }

    /// GET `path` on the admin port at `address`: the status code and the body.
    pub async fn admin_get(&self, address: &str, path: &str) -> Result<(u16, String)> {
        let unreachable = |reason: String| Error::Unreachable {
            what: "admin port",
            address: address.to_owned(),
            reason,
        };
        let response = self
            .http
            .get(format!("http://{address}{path}"))
            .send()
            .await
            .map_err(|e| unreachable(error_chain(&e)))?;
        let status = response.status().as_u16();
        let body = response
            .text()
            .await
            .map_err(|e| unreachable(error_chain(&e)))?;
        Ok((status, body))
    }
}

/// One unary call with a deadline, its refusal named.
pub async fn call<T>(
    what: &'static str,
    address: &str,
    name: &'static str,
    timeout: Duration,
    request: impl Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T> {
    match tokio::time::timeout(timeout, request).await {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) => Err(refused(what, address, name, &status)),
        Err(_) => Err(Error::Unreachable {
            what,
            address: address.to_owned(),
            reason: format!("no answer to {name} within {timeout:?}"),
        }),
    }
}

/// A status a service answered, as an error that names it.
pub fn refused(
    what: &'static str,
    address: &str,
    call: &'static str,
    status: &tonic::Status,
) -> Error {
    let hint = match status.code() {
        Code::PermissionDenied => {
            "; it needs the switchyard-operator identity (--tls-cert of switchyard-operator-tls)"
        }
        Code::Unauthenticated => "; pass --tls-cert, --tls-key and --tls-ca",
        _ => "",
    };
    match status.code() {
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => {
            Error::Unreachable {
                what,
                address: address.to_owned(),
                reason: format!("{call}: {}", status.message()),
            }
        }
        code => Error::Refused {
            what,
            address: address.to_owned(),
            call,
            reason: format!("{code:?}: {}{hint}", status.message()),
        },
    }
}
