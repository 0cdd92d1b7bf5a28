//! `switchyard-dev test`: every test binary of the workspace, several at a time.
//!
//! `cargo test` runs one test binary after another. Most of ours spend their time waiting on
//! a control plane (a rollout, a lease to expire, kube-controller-manager to converge), so
//! running a few at once takes much less wall time than their sum. Each binary still runs its
//! own tests the way cargo would (same working directory, same harness, its own threads);
//! its output goes to a log file and is printed in one piece when it fails.
//!
//! The binaries that took longest last time start first, so that the longest one does not
//! start last; their times are kept in `target/switchyard-test/durations`.

use std::{
    collections::{HashMap, VecDeque},
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use tokio::{process::Command, task::JoinSet};

/// One test executable cargo built, and where cargo would run it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TestBinary {
    /// `<package directory, relative to the workspace> <kind> <target>`: unique in the
    /// workspace and stable between builds (the executable's name has a hash in it).
    pub(crate) key: String,
    pub(crate) executable: PathBuf,
    /// The package's directory: cargo runs a test binary there.
    pub(crate) dir: PathBuf,
    pub(crate) package: String,
}

/// The test binaries in the JSON lines `cargo test --no-run --message-format=json*` prints.
pub(crate) fn test_binaries(messages: &str, workspace: &Path) -> anyhow::Result<Vec<TestBinary>> {
    let mut binaries = Vec::new();
    for line in messages.lines().filter(|l| l.starts_with('{')) {
        let message: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("a cargo message: {line}"))?;
        if message["reason"] != "compiler-artifact" || message["profile"]["test"] != true {
            continue;
        }
        let Some(executable) = message["executable"].as_str() else {
            continue;
        };
        let manifest = message["manifest_path"]
            .as_str()
            .context("a test artifact without a manifest_path")?;
        let dir = Path::new(manifest)
            .parent()
            .context("a manifest_path without a directory")?;
        let target = &message["target"];
        let name = target["name"].as_str().unwrap_or_default();
        let kind = target["kind"][0].as_str().unwrap_or_default();
        let relative = dir.strip_prefix(workspace).unwrap_or(dir);
        let package = message["package_id"]
            .as_str()
            .and_then(package_name)
            .unwrap_or(name)
            .to_owned();
        binaries.push(TestBinary {
            key: format!("{} {kind} {name}", relative.display()),
            executable: executable.into(),
            dir: dir.to_owned(),
            package,
        });
    }
    Ok(binaries)
}

/// The name in a package id: `path+file:///dir#name@0.1.0`, or `path+file:///dir/name#0.1.0`
/// when the directory has the package's name.
fn package_name(id: &str) -> Option<&str> {
    let (path, fragment) = id.rsplit_once('#')?;
    match fragment.split_once('@') {
        Some((name, _)) => Some(name),
        None => path.rsplit('/').next(),
    }
}

/// Longest first by the durations of the last run; binaries not timed yet go before all the
/// others, since nothing says they are short.
pub(crate) fn longest_first(binaries: &mut [TestBinary], durations: &HashMap<String, f64>) {
    binaries.sort_by(|a, b| {
        let a = durations.get(&a.key).copied().unwrap_or(f64::INFINITY);
        let b = durations.get(&b.key).copied().unwrap_or(f64::INFINITY);
        b.total_cmp(&a)
    });
}

pub(crate) fn parse_durations(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter_map(|line| {
            let (seconds, key) = line.split_once(' ')?;
            Some((key.to_owned(), seconds.parse().ok()?))
        })
        .collect()
}

fn format_durations(durations: &HashMap<String, f64>) -> String {
    let mut lines: Vec<_> = durations
        .iter()
        .map(|(key, seconds)| format!("{seconds:.1} {key}\n"))
        .collect();
    lines.sort();
    lines.concat()
}

/// The counts in the libtest summary lines of one binary's output
/// (`test result: ok. 3 passed; 0 failed; 1 ignored; ...`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Counts {
    pub(crate) passed: u64,
    pub(crate) failed: u64,
    pub(crate) ignored: u64,
}

pub(crate) fn counts(output: &str) -> Counts {
    let mut counts = Counts::default();
    for line in output.lines() {
        let Some(summary) = line.strip_prefix("test result: ") else {
            continue;
        };
        for part in summary.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(what), Some(number)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(number) = number.parse::<u64>() else {
                continue;
            };
            match what {
                "passed" => counts.passed += number,
                "failed" => counts.failed += number,
                "ignored" => counts.ignored += number,
                _ => {}
            }
        }
    }
    counts
}

struct Finished {
    key: String,
    log: PathBuf,
    status: ExitStatus,
    counts: Counts,
    took: Duration,
}

async fn run_one(key: String, log: PathBuf, mut command: Command) -> anyhow::Result<Finished> {
    let file = std::fs::File::create(&log)?;
    let begun = Instant::now();
    let status = command
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .kill_on_drop(true)
        .status()
        .await
        .with_context(|| format!("starting {key}"))?;
    let output = std::fs::read_to_string(&log).unwrap_or_default();
    Ok(Finished {
        key,
        log,
        status,
        counts: counts(&output),
        took: begun.elapsed(),
    })
}

/// Builds the test binaries, runs them `jobs` at a time (and the doc tests as one more job),
/// and fails if any of them failed. `args` go to every test binary (a filter, `--nocapture`).
pub(crate) async fn test(jobs: usize, args: Vec<String>) -> anyhow::Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let workspace = std::env::current_dir()?;
    let state = workspace.join("target/switchyard-test");
    let logs = state.join("logs");
    std::fs::create_dir_all(&logs)?;

    let built = Command::new(&cargo)
        .args([
            "test",
            "--locked",
            "--workspace",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("running cargo test --no-run")?
        .wait_with_output()
        .await?;
    if !built.status.success() {
        bail!("building the tests failed ({})", built.status);
    }
    let mut binaries = test_binaries(&String::from_utf8_lossy(&built.stdout), &workspace)?;
    let durations_path = state.join("durations");
    let mut durations =
        parse_durations(&std::fs::read_to_string(&durations_path).unwrap_or_default());
    longest_first(&mut binaries, &durations);
    println!(
        "running {} test binaries and the doc tests, {jobs} at a time; logs in {}",
        binaries.len(),
        logs.display()
    );

    let mut pending = VecDeque::new();
    for binary in &binaries {
        let mut command = Command::new(&binary.executable);
        command
            .args(&args)
            .current_dir(&binary.dir)
            .env("CARGO_MANIFEST_DIR", &binary.dir)
            .env("CARGO_PKG_NAME", &binary.package);
        let log = logs.join(format!("{}.log", binary.key.replace(['/', ' '], "_")));
        pending.push_back((binary.key.clone(), log, command));
    }
    // The doc tests are quick: they start once the longest binaries have.
    let mut doc = Command::new(&cargo);
    doc.args(["test", "--locked", "--workspace", "--doc"])
        .current_dir(&workspace);
    pending.insert(
        jobs.min(pending.len()),
        ("doc tests".to_owned(), logs.join("doc-tests.log"), doc),
    );

    let started = Instant::now();
    let mut running = JoinSet::new();
    let mut total = Counts::default();
    let mut failed = Vec::new();
    loop {
        while running.len() < jobs.max(1) {
            let Some((key, log, command)) = pending.pop_front() else {
                break;
            };
            running.spawn(run_one(key, log, command));
        }
        let Some(joined) = running.join_next().await else {
            break;
        };
        let finished = joined??;
        total.passed += finished.counts.passed;
        total.failed += finished.counts.failed;
        total.ignored += finished.counts.ignored;
        let seconds = finished.took.as_secs_f64();
        if finished.status.success() {
            println!(
                "ok      {seconds:7.1} s  {} ({} passed)",
                finished.key, finished.counts.passed
            );
        } else {
            println!(
                "FAILED  {seconds:7.1} s  {} ({}); its output, {}:",
                finished.key,
                finished.status,
                finished.log.display()
            );
            println!("{}", std::fs::read_to_string(&finished.log)?);
            failed.push(finished.key.clone());
        }
        durations.insert(finished.key, seconds);
    }
    std::fs::write(&durations_path, format_durations(&durations))?;
    println!(
        "{} passed, {} failed, {} ignored; {} test binaries and the doc tests in {:.0} s",
        total.passed,
        total.failed,
        total.ignored,
        binaries.len(),
        started.elapsed().as_secs_f64()
    );
    if !failed.is_empty() {
        bail!("failed: {}", failed.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MESSAGES: &str = r#"{"reason":"compiler-artifact","package_id":"path+file:///w/tests#switchyard-tests@0.1.0","manifest_path":"/w/tests/Cargo.toml","target":{"kind":["test"],"name":"soak"},"profile":{"test":true},"executable":"/w/target/debug/deps/soak-1f2e"}
{"reason":"compiler-artifact","package_id":"path+file:///w/services/queue#switchyard-queue@0.1.0","manifest_path":"/w/services/queue/Cargo.toml","target":{"kind":["lib"],"name":"switchyard_queue"},"profile":{"test":false},"executable":null}
{"reason":"compiler-artifact","package_id":"path+file:///w/services/queue#switchyard-queue@0.1.0","manifest_path":"/w/services/queue/Cargo.toml","target":{"kind":["lib"],"name":"switchyard_queue"},"profile":{"test":true},"executable":"/w/target/debug/deps/switchyard_queue-9a8b"}
{"reason":"compiler-artifact","package_id":"path+file:///w/crates/selector#0.1.0","manifest_path":"/w/crates/selector/Cargo.toml","target":{"kind":["example"],"name":"demo"},"profile":{"test":false},"executable":"/w/target/debug/examples/demo-77"}
{"reason":"build-finished","success":true}"#;

    #[test]
    fn test_binaries_are_the_artifacts_built_with_the_test_harness() {
        let binaries = test_binaries(MESSAGES, Path::new("/w")).unwrap();
        assert_eq!(
            binaries,
            vec![
                TestBinary {
                    key: "tests test soak".to_owned(),
                    executable: "/w/target/debug/deps/soak-1f2e".into(),
                    dir: "/w/tests".into(),
                    package: "switchyard-tests".to_owned(),
                },
                TestBinary {
                    key: "services/queue lib switchyard_queue".to_owned(),
                    executable: "/w/target/debug/deps/switchyard_queue-9a8b".into(),
                    dir: "/w/services/queue".into(),
                    package: "switchyard-queue".to_owned(),
                },
            ]
        );
    }

    #[test]
    fn a_package_id_names_its_package_either_way() {
        assert_eq!(
            package_name("path+file:///w/tests#switchyard-tests@0.1.0"),
            Some("switchyard-tests")
        );
        assert_eq!(
            package_name("path+file:///w/crates/selector#0.1.0"),
            Some("selector")
        );
    }

    #[test]
    fn untimed_binaries_go_first_then_the_longest() {
        let binary = |key: &str| TestBinary {
            key: key.to_owned(),
            executable: PathBuf::new(),
            dir: PathBuf::new(),
            package: String::new(),
        };
        let mut binaries = vec![binary("short"), binary("new"), binary("long")];
        let durations = parse_durations(&format_durations(&HashMap::from([
            ("short".to_owned(), 1.5),
            ("long".to_owned(), 300.0),
        ])));
        longest_first(&mut binaries, &durations);
        let keys: Vec<_> = binaries.iter().map(|b| b.key.as_str()).collect();
        assert_eq!(keys, ["new", "long", "short"]);
    }

    #[test]
    fn counts_add_up_every_summary_line() {
        let output = "running 2 tests\n\
            test a ... ok\n\
            test result: ok. 2 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s\n\
            test result: FAILED. 4 passed; 3 failed; 0 ignored; 0 measured; 0 filtered out; finished in 9.2s\n";
        assert_eq!(
            counts(output),
            Counts {
                passed: 6,
                failed: 3,
                ignored: 1
            }
        );
    }
}
