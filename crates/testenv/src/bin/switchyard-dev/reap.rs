//! `switchyard-dev reap`: runs one test binary as the child of a subreaper, so that the CPU
//! time of everything it started is counted, and nothing it started outlives it.
//!
//! A test binary starts control planes, services and tools; they die with the thread that
//! spawned them (`PR_SET_PDEATHSIG`), after the binary is gone, and would be reaped by init,
//! their CPU time counted nowhere. Here they are reparented to this process instead
//! (`PR_SET_CHILD_SUBREAPER`), which waits for every one of them: the CPU time of its
//! children then covers the binary's whole tree. `switchyard-dev test` schedules binaries by
//! that figure (a binary that mostly waits on a timer may run beside two others).

// Process plumbing (prctl, waitpid, getrusage, kill): each unsafe block says why it is sound.
#![allow(unsafe_code)]

use std::{
    ffi::OsString,
    os::unix::process::{CommandExt, ExitStatusExt},
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};

/// How long the binary's descendants have to exit after it, before they are killed.
const GRACE: Duration = Duration::from_secs(10);

/// Runs `program args`, waits for it and every process it left behind, writes the CPU
/// seconds of them all (user and system) to `cpu`, and returns the exit code to pass on
/// (128 + the signal for a binary killed by one, as a shell reports it).
pub(crate) fn reap(cpu: &Path, program: &OsString, args: &[OsString]) -> anyhow::Result<i32> {
    // SAFETY: sets a flag of this process; no memory is passed.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        bail!(
            "becoming a child subreaper: {}",
            std::io::Error::last_os_error()
        );
    }
    let mut command = Command::new(program);
    command.args(args);
    // SAFETY: the closure only calls prctl, which is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            // The binary goes with this process, as it went with `switchyard-dev test`.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = command
        .spawn()
        .with_context(|| format!("starting {}", program.to_string_lossy()))?;
    let status = wait_reaping(child.id() as libc::pid_t)?;
    let left = reap_descendants();
    if left > 0 {
        eprintln!(
            "switchyard-dev reap: killed {left} process(es) {} left running {GRACE:?} after it exited",
            program.to_string_lossy()
        );
    }
    std::fs::write(cpu, format!("{:.1}\n", children_cpu_seconds()))
        .with_context(|| format!("writing {}", cpu.display()))?;
    Ok(status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
}

/// Waits for the child `main`, reaping every other child meanwhile: an orphan reparented
/// here that exits is gone at once, as it would be under init (a harness that waits for a
/// daemon it detached to exit sees it exit).
fn wait_reaping(main: libc::pid_t) -> anyhow::Result<std::process::ExitStatus> {
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes the status into a local.
        let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
        if pid == main {
            return Ok(std::process::ExitStatus::from_raw(status));
        }
        if pid == -1 {
            let error = std::io::Error::last_os_error();
            if error.kind() != std::io::ErrorKind::Interrupted {
                bail!("waiting for the binary: {error}");
            }
        }
    }
}

/// Waits for every child (the binary's orphans, reparented here); those still running after
/// the grace period are killed. How many were killed.
fn reap_descendants() -> usize {
    let deadline = Instant::now() + GRACE;
    let mut killed = 0;
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes the status into a local.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        match pid {
            // No child left.
            -1 => return killed,
            // Some still running.
            0 if Instant::now() >= deadline => {
                for child in switchyard_testenv::children_of(std::process::id()) {
                    // SAFETY: a signal to a child of this process, which it has not reaped.
                    unsafe { libc::kill(child as libc::pid_t, libc::SIGKILL) };
                    killed += 1;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            0 => std::thread::sleep(Duration::from_millis(50)),
            _ => {}
        }
    }
}

/// User and system CPU seconds of every child this process reaped.
fn children_cpu_seconds() -> f64 {
    // SAFETY: getrusage fills a zeroed struct of its own type.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage);
        usage
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}
