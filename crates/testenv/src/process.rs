//! Child processes that never outlive the harness.
//!
//! Every child is spawned by one long-lived thread with `PR_SET_PDEATHSIG = SIGKILL`: the
//! kernel kills a child when the thread that forked it exits, so spawning from a short-lived
//! test or runtime thread would kill it early, while spawning from this thread kills it
//! exactly when the harness process ends, however it ends (panic, SIGINT, SIGKILL). Children
//! get their own process group so a terminal's Ctrl-C reaches only the harness, which then
//! stops them in order.

use std::{
    fs::File,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{
        OnceLock,
        mpsc::{self, Sender},
    },
    time::{Duration, Instant},
};

use crate::{Error, Result};

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

fn spawner() -> &'static Sender<SpawnRequest> {
    static SPAWNER: OnceLock<Sender<SpawnRequest>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("testenv-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
                // Keep the thread (the children's parent) alive until the process exits.
                loop {
                    std::thread::park();
                }
            })
            .expect("spawn the testenv spawner thread");
        tx
    })
}

/// A child process with its log file; stopped (SIGTERM, then SIGKILL) on drop.
#[derive(Debug)]
pub(crate) struct ManagedProcess {
    name: String,
    child: Child,
    log: PathBuf,
}

/// How long a process gets to exit after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

impl ManagedProcess {
    pub(crate) fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        envs: &[(&str, &str)],
        log: &Path,
    ) -> Result<Self> {
        let out = File::create(log)?;
        let err = out.try_clone()?;
        let mut command = Command::new(program);
        command
            .args(args)
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        set_parent_death_signal(&mut command);
        let (tx, rx) = mpsc::channel();
        let spawn_error = |source| Error::Spawn {
            name: name.to_owned(),
            source,
        };
        spawner()
            .send((command, tx))
            .map_err(|_| spawn_error(std::io::Error::other("spawner thread is gone")))?;
        let child = rx
            .recv()
            .map_err(|_| spawn_error(std::io::Error::other("spawner thread is gone")))?
            .map_err(spawn_error)?;
        Ok(Self {
            name: name.to_owned(),
            child,
            log: log.to_owned(),
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn log(&self) -> &Path {
        &self.log
    }

    /// The exit status if the process has exited.
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    pub(crate) fn signal(&self, signal: libc::c_int) {
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            send_signal(pid, signal);
        }
    }

    /// SIGTERM, wait up to `grace`, then SIGKILL. Returns the exit status.
    pub(crate) fn stop(&mut self, grace: Duration) -> Option<ExitStatus> {
        if let Some(status) = self.exited() {
            return Some(status);
        }
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Some(status) = self.exited() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        self.child.wait().ok()
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        self.stop(STOP_GRACE);
    }
}

/// Polls `healthy` until it returns true; fails if the process exits or `timeout` passes.
pub(crate) async fn wait_healthy<F, Fut>(
    process: &mut ManagedProcess,
    timeout: Duration,
    mut healthy: F,
) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = process.exited() {
            return Err(Error::Exited {
                name: process.name.clone(),
                status,
                log: process.log.clone(),
            });
        }
        if healthy().await {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Unhealthy {
                name: process.name.clone(),
                seconds: timeout.as_secs(),
                log: process.log.clone(),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Starts a process on freshly chosen ports, choosing again when a port was taken in the
/// meantime, so a port in use is never fatal.
pub(crate) async fn start_on_free_ports<T, F, Fut>(name: &str, mut attempt: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    const ATTEMPTS: usize = 5;
    for _ in 1..ATTEMPTS {
        match attempt().await {
            Err(Error::Exited { ref log, .. }) if log_has_port_conflict(log) => {
                tracing::info!(name, "port taken, retrying on another");
            }
            other => return other,
        }
    }
    attempt().await
}

pub(crate) fn log_has_port_conflict(log: &Path) -> bool {
    std::fs::read_to_string(log)
        .is_ok_and(|text| text.to_lowercase().contains("address already in use"))
}

#[allow(unsafe_code)]
fn set_parent_death_signal(command: &mut Command) {
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and only calls the
    // async-signal-safe functions prctl, getppid and _exit.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect.
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

#[allow(unsafe_code)]
pub(crate) fn send_signal(pid: libc::pid_t, signal: libc::c_int) {
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe {
        libc::kill(pid, signal);
    }
}

/// Runs `f` when the process exits normally (a test binary returns from `main` even when
/// tests failed), for what lives in a `static` and so is never dropped.
#[allow(unsafe_code)]
pub(crate) fn register_at_exit(f: extern "C" fn()) {
    // SAFETY: atexit only stores the function pointer; `f` does not unwind.
    unsafe {
        libc::atexit(f);
    }
}
