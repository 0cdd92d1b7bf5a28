//! `switchyard-dev`, as `make cluster-up` / `make cluster-down` use it, and the promise that
//! no control-plane process outlives the harness, even when the harness is killed.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use switchyard_testenv::children_of;

const DEV: &str = env!("CARGO_BIN_EXE_switchyard-dev");

fn dev(args: &[&str], dir: &Path) -> std::process::Output {
    Command::new(DEV)
        .args(args)
        .arg("--dir")
        .arg(dir)
        .output()
        .expect("run switchyard-dev")
}

fn alive(pid: u32) -> bool {
    // A zombie has exited; only its entry in the table is left.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

fn wait_all_gone(pids: &[u32]) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left: Vec<u32> = pids.iter().copied().filter(|p| alive(*p)).collect();
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_detached_cluster_serves_kubectl_until_down() {
    let dir = tempfile::tempdir().expect("temp dir");
    let up = dev(&["up", "--detach", "--nodes", "2"], dir.path());
    let stdout = String::from_utf8_lossy(&up.stdout);
    assert!(
        up.status.success(),
        "up failed: {stdout}{}",
        String::from_utf8_lossy(&up.stderr)
    );
    let kubeconfig = dir.path().join("kubeconfig");
    assert!(
        stdout.contains(&format!("kubeconfig: {}", kubeconfig.display())),
        "{stdout}"
    );

    let again = dev(&["up", "--detach"], dir.path());
    assert!(
        !again.status.success(),
        "a second up on the same directory is refused"
    );
    assert!(String::from_utf8_lossy(&again.stderr).contains("already running"));

    let pid: u32 = std::fs::read_to_string(dir.path().join("pid"))
        .expect("pid file")
        .trim()
        .parse()
        .expect("pid");
    let processes = children_of(pid);
    assert_eq!(
        processes.len(),
        4,
        "etcd, kube-apiserver, kube-scheduler and kwok"
    );

    let kubectl = switchyard_testenv::Binaries::locate()
        .expect("binaries")
        .path("kubectl");
    let nodes = Command::new(kubectl)
        .args(["--kubeconfig"])
        .arg(&kubeconfig)
        .args(["get", "nodes", "--no-headers"])
        .stderr(Stdio::inherit())
        .output()
        .expect("kubectl get nodes");
    let nodes = String::from_utf8_lossy(&nodes.stdout);
    let ready: Vec<&str> = nodes
        .lines()
        .filter(|l| l.split_whitespace().nth(1) == Some("Ready"))
        .collect();
    assert_eq!(ready.len(), 2, "both nodes Ready:\n{nodes}");

    let down = dev(&["down"], dir.path());
    assert!(
        down.status.success(),
        "{}",
        String::from_utf8_lossy(&down.stderr)
    );
    let mut all = processes;
    all.push(pid);
    assert_eq!(
        wait_all_gone(&all),
        Vec::<u32>::new(),
        "nothing is left running"
    );
}

#[test]
fn killing_the_harness_kills_every_process_it_started() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut harness = Command::new(DEV)
        .args(["up", "--nodes", "1", "--dir"])
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the harness");
    let deadline = Instant::now() + Duration::from_secs(180);
    while !dir.path().join("ready").exists() {
        assert!(
            harness.try_wait().expect("wait").is_none(),
            "harness exited early"
        );
        assert!(Instant::now() < deadline, "control plane not ready in time");
        std::thread::sleep(Duration::from_millis(200));
    }
    let processes = children_of(harness.id());
    assert_eq!(
        processes.len(),
        4,
        "etcd, kube-apiserver, kube-scheduler and kwok"
    );

    // SIGKILL: no destructor, no signal handler, no atexit runs in the harness.
    harness.kill().expect("kill the harness");
    harness.wait().expect("reap the harness");
    assert_eq!(
        wait_all_gone(&processes),
        Vec::<u32>::new(),
        "no orphan survives the harness"
    );
}

#[test]
fn reap_counts_the_cpu_of_what_a_binary_left_behind_and_passes_its_exit_code_on() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cpu = dir.path().join("cpu");
    // The shell starts a busy grandchild in the background and exits at once: the
    // grandchild is orphaned, reparented to the reaper, waited for and counted.
    let script =
        "sh -c 'end=$(($(date +%s) + 2)); while [ $(date +%s) -lt $end ]; do :; done' & exit 3";
    let begun = Instant::now();
    let status = Command::new(DEV)
        .arg("reap")
        .arg("--cpu")
        .arg(&cpu)
        .args(["--", "sh", "-c", script])
        .status()
        .expect("run switchyard-dev reap");
    assert_eq!(status.code(), Some(3));
    assert!(
        begun.elapsed() >= Duration::from_secs(1),
        "the reaper waited for the grandchild"
    );
    let seconds: f64 = std::fs::read_to_string(&cpu)
        .expect("the CPU file")
        .trim()
        .parse()
        .expect("a number of seconds");
    assert!(seconds >= 0.5, "counted {seconds} CPU seconds");
}
