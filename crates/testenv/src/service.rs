//! Runs a Switchyard service binary as a real process and checks what an operator relies on:
//! health, readiness, metrics, gRPC health and reflection, and a clean SIGTERM shutdown.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::Path,
    process::ExitStatus,
    time::{Duration, Instant},
};

use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};
use tonic_reflection::pb::v1::{
    ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
    server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
};

use switchyard_runtime::Role;

use crate::{
    Error, NetNs, Pki, Result,
    ports::free_port,
    process::{ManagedProcess, log_has_port_conflict, start_on_free_ports, wait_healthy},
};

/// How long a service gets to become ready and to exit after SIGTERM.
const SERVICE_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug)]
pub struct ServiceProcess {
    process: ManagedProcess,
    admin: SocketAddr,
    grpc: SocketAddr,
    http: reqwest::Client,
    _logs: tempfile::TempDir,
}

impl ServiceProcess {
    /// Starts `program` with its admin and gRPC ports on free loopback ports and waits until
    /// `/livez` answers and, for a Switchyard service, its gRPC port accepts connections (not
    /// for readiness: see [`Self::wait_ready`]).
    pub async fn start(program: &Path, args: &[&str], envs: &[(&str, &str)]) -> Result<Self> {
        Self::start_with_grpc(program, None, args, envs).await
    }

    /// Like [`Self::start`], with the gRPC port at `grpc` when given: a service restarted
    /// where its clients were told to find it.
    ///
    /// A Switchyard service gets its role's certificate from the shared test [`Pki`] unless
    /// `args` name their own (`--tls-cert`) or ask for `--insecure-plaintext`.
    pub async fn start_with_grpc(
        program: &Path,
        grpc: Option<SocketAddr>,
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> Result<Self> {
        Self::launch(program, None, grpc, args, envs).await
    }

    /// Like [`Self::start`], inside `netns`: the admin and gRPC ports listen on the
    /// namespace's end of its veth ([`NetNs::inner`]).
    pub async fn start_in_netns(
        netns: &NetNs,
        program: &Path,
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> Result<Self> {
        Self::launch(program, Some(netns), None, args, envs).await
    }

    async fn launch(
        program: &Path,
        netns: Option<&NetNs>,
        grpc: Option<SocketAddr>,
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> Result<Self> {
        let name = program
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "service".to_owned());
        let logs = tempfile::Builder::new()
            .prefix("switchyard-service-")
            .tempdir()?;
        let http = reqwest::Client::new();
        let host: IpAddr = netns.map_or(Ipv4Addr::LOCALHOST, NetNs::inner).into();
        let (process, admin, grpc) = start_on_free_ports(&name, || async {
            let admin = SocketAddr::new(host, free_port()?);
            let grpc = match grpc {
                Some(grpc) => grpc,
                None => SocketAddr::new(host, free_port()?),
            };
            let mut all_args = vec![
                format!("--admin-addr={admin}"),
                format!("--grpc-addr={grpc}"),
            ];
            all_args.extend(args.iter().map(|a| (*a).to_owned()));
            let own_tls = args
                .iter()
                .any(|a| a.starts_with("--tls-cert") || a.starts_with("--insecure-plaintext"))
                || envs.iter().any(|(k, _)| {
                    *k == "SWITCHYARD_TLS_CERT" || *k == "SWITCHYARD_INSECURE_PLAINTEXT"
                });
            if let Some(role) = crate::tls::role_of_program(program).filter(|_| !own_tls) {
                all_args.extend(Pki::shared().flags(role));
            }
            let log = logs.path().join(format!("{name}.log"));
            let mut process = match netns {
                None => ManagedProcess::spawn(&name, program, &all_args, envs, &log)?,
                Some(netns) => {
                    let mut wrapped = netns.wrap();
                    wrapped.push(program.display().to_string());
                    wrapped.extend(all_args);
                    ManagedProcess::spawn(&name, Path::new("ip"), &wrapped, envs, &log)?
                }
            };
            let url = format!("http://{admin}/livez");
            wait_healthy(&mut process, SERVICE_TIMEOUT, || async {
                http.get(&url)
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
            })
            .await?;
            // `/livez` answers before the service's setup is done, and a Switchyard service
            // binds its gRPC port at the end of it, without waiting on any peer: a caller
            // dialing now could be refused. An exit is the caller's to read
            // ([`Self::exited`]), unless the port was taken (retried on other ports).
            if crate::tls::role_of_program(program).is_some() {
                let bound = wait_healthy(&mut process, SERVICE_TIMEOUT, || async {
                    tokio::net::TcpStream::connect(grpc).await.is_ok()
                })
                .await;
                match bound {
                    Err(Error::Exited { ref log, .. }) if !log_has_port_conflict(log) => {}
                    other => other?,
                }
            }
            Ok((process, admin, grpc))
        })
        .await?;
        Ok(Self {
            process,
            admin,
            grpc,
            http,
            _logs: logs,
        })
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }

    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc
    }

    /// Status code and body of an admin-port path.
    pub async fn admin_get(&self, path: &str) -> Result<(u16, String)> {
        let response = self
            .http
            .get(format!("http://{}{path}", self.admin))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .map_err(|e| Error::Setup(format!("GET {path}: {e}")))?;
        let status = response.status().as_u16();
        let body = response
            .text()
            .await
            .map_err(|e| Error::Setup(format!("GET {path}: {e}")))?;
        Ok((status, body))
    }

    /// Status code and body of a POST to an admin-port path (`/debug/panic/<task>`).
    pub async fn admin_post(&self, path: &str) -> Result<(u16, String)> {
        let response = self
            .http
            .post(format!("http://{}{path}", self.admin))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .map_err(|e| Error::Setup(format!("POST {path}: {e}")))?;
        let status = response.status().as_u16();
        let body = response
            .text()
            .await
            .map_err(|e| Error::Setup(format!("POST {path}: {e}")))?;
        Ok((status, body))
    }

    /// Waits, at most `within`, for the process to exit by itself; its status and log.
    pub async fn exited(&mut self, within: Duration) -> Option<(ExitStatus, String)> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(status) = self.process.exited() {
                return Some((status, self.log()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    /// Waits until `/readyz` answers 200.
    pub async fn wait_ready(&mut self) -> Result<()> {
        let url = format!("http://{}/readyz", self.admin);
        let http = self.http.clone();
        wait_healthy(&mut self.process, SERVICE_TIMEOUT, || async {
            http.get(&url)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        })
        .await
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The resident memory of the process now (`VmRSS`), in bytes.
    pub fn resident_bytes(&self) -> Option<u64> {
        resident_bytes(self.process.pid())
    }

    /// The log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.process.log()).unwrap_or_default()
    }

    /// Kills the process at once (SIGKILL) and returns its log.
    pub fn kill(mut self) -> String {
        self.process.signal(libc::SIGKILL);
        while self.process.exited().is_none() {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.log()
    }

    /// Freezes the process (SIGSTOP): it holds its ports and answers nothing, as a stalled
    /// process does.
    pub fn pause(&self) {
        self.process.signal(libc::SIGSTOP);
    }

    /// Lets a paused process run again (SIGCONT).
    pub fn resume(&self) {
        self.process.signal(libc::SIGCONT);
    }

    /// Sends SIGTERM and waits for the process to exit.
    pub async fn terminate(mut self) -> Result<(ExitStatus, String)> {
        self.process.signal(libc::SIGTERM);
        let deadline = Instant::now() + SERVICE_TIMEOUT;
        loop {
            if let Some(status) = self.process.exited() {
                return Ok((status, self.log()));
            }
            if Instant::now() > deadline {
                return Err(Error::Setup(format!(
                    "{} did not exit within {} s of SIGTERM; log:\n{}",
                    self.process.name(),
                    SERVICE_TIMEOUT.as_secs(),
                    self.log()
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The resident memory of process `pid` now (`VmRSS`), in bytes.
pub fn resident_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// The processes whose parent is `pid` now, from /proc.
pub fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            std::fs::read_to_string(format!("/proc/{child}/stat"))
                .ok()
                .and_then(|stat| parent_of(&stat))
                == Some(pid)
        })
        .collect()
}

/// The parent pid in a `/proc/<pid>/stat` line: the second field after the command name,
/// which is in parentheses and may hold spaces and parentheses of its own.
fn parent_of(stat: &str) -> Option<u32> {
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The CPU time process `pid` has used so far (user and system, every thread), in seconds.
#[allow(unsafe_code)]
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; the fields after its `)` are plain.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    // utime and stime are fields 14 and 15 of stat(5), 12th and 13th after the name.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // SAFETY: sysconf reads a constant of the running system.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks > 0).then(|| (utime + stime) as f64 / ticks as f64)
}

/// The checks every service binary must pass: ready on `/readyz`, `/livez` ok, `/metrics`
/// in the text format with the service's build info, the gRPC health service SERVING,
/// reflection listing the health service, and exit 0 within the bound after SIGTERM.
pub async fn assert_service_lifecycle(program: &Path, service: &str, envs: &[(&str, &str)]) {
    let mut process = ServiceProcess::start(program, &[], envs)
        .await
        .unwrap_or_else(|e| panic!("{service} starts: {e}"));
    process
        .wait_ready()
        .await
        .unwrap_or_else(|e| panic!("{service} becomes ready: {e}\n{}", process.log()));

    let (status, body) = process.admin_get("/livez").await.expect("GET /livez");
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    let (status, metrics) = process.admin_get("/metrics").await.expect("GET /metrics");
    assert_eq!(status, 200);
    assert!(
        metrics.contains(&format!("switchyard_build_info{{service=\"{service}\"")),
        "metrics carry the build info of {service}:\n{metrics}"
    );
    if let Err(error) = crate::exposition::parse(&metrics) {
        panic!("/metrics of {service} is not valid OpenMetrics text: {error}\n{metrics}");
    }

    let role = crate::tls::role_of_program(program).expect("a Switchyard service binary");
    let channel = Pki::shared()
        .channel(Role::Observer, role, process.grpc_addr())
        .await
        .expect("connect to the gRPC port over mutual TLS");
    let health = HealthClient::new(channel.clone())
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health check");
    assert_eq!(health.into_inner().status(), ServingStatus::Serving);
    let services = list_services(channel).await;
    assert!(
        services.iter().any(|s| s == "grpc.health.v1.Health"),
        "reflection lists the health service: {services:?}"
    );

    let (status, log) = process.terminate().await.expect("exits after SIGTERM");
    assert!(
        status.success(),
        "{service} exits 0 after SIGTERM, got {status}:\n{log}"
    );
    assert!(
        log.contains("shutting down") && log.contains("stopped"),
        "{service} logs its drain:\n{log}"
    );
}

/// The services a server's reflection lists.
pub async fn list_services(channel: tonic::transport::Channel) -> Vec<String> {
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = ServerReflectionClient::new(channel)
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("reflection stream")
        .into_inner();
    let response = responses
        .message()
        .await
        .expect("reflection response")
        .expect("one response");
    match response.message_response {
        Some(MessageResponse::ListServicesResponse(list)) => {
            list.service.into_iter().map(|s| s.name).collect()
        }
        other => panic!("unexpected reflection response {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parent_is_read_past_a_command_with_parentheses() {
        assert_eq!(parent_of("4242 (a (b) c) S 17 4242 17 0"), Some(17));
        assert_eq!(parent_of("garbage"), None);
    }
}
