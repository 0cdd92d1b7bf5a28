//! `switchyard-dev test`: every test binary of the workspace, several at a time.
//!
//! `cargo test` runs one test binary after another. Most of ours spend their time waiting on
//! a control plane (a rollout, a lease to expire, kube-controller-manager to converge), so
//! running a few at once takes much less wall time than their sum. Each binary still runs its
//! own tests the way cargo would (same working directory, same harness, its own threads);
//! its output goes to a log file and is printed in one piece when it fails.
//!
//! The binaries that took longest last time start first, so that the longest one does not
//! start last; their times are kept in `target/switchyard-test/durations`, and a clone
//! without them (CI's) takes those of the run recorded in docs/testing.md (`--seed`). Each
//! binary runs under `switchyard-dev reap`, which counts the CPU time of everything it
//! started (its control planes and services too).

use std::{
    collections::HashMap,
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

/// Prints every compiler message in cargo's JSON lines to stderr as rustc rendered it, and
/// returns the errors, each shortened to its last lines (where a linker's reason is).
fn diagnostics(messages: &str) -> Vec<String> {
    let mut errors = Vec::new();
    for line in messages.lines().filter(|l| l.starts_with('{')) {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if message["reason"] != "compiler-message" {
            continue;
        }
        let rendered = message["message"]["rendered"].as_str().unwrap_or_default();
        eprint!("{rendered}");
        if message["message"]["level"] == "error" {
            let lines: Vec<&str> = rendered.trim_end().lines().collect();
            let tail = &lines[lines.len().saturating_sub(ERROR_LINES)..];
            let skipped = lines.len() - tail.len();
            let mut text = tail.join("\n");
            if skipped > 0 {
                text = format!("({skipped} lines before) …\n{text}");
            }
            errors.push(text);
        }
    }
    errors
}

/// How many of an error's last lines the failure message keeps.
const ERROR_LINES: usize = 8;

/// The name in a package id: `path+file:///dir#name@0.1.0`, or `path+file:///dir/name#0.1.0`
/// when the directory has the package's name.
fn package_name(id: &str) -> Option<&str> {
    let (path, fragment) = id.rsplit_once('#')?;
    match fragment.split_once('@') {
        Some((name, _)) => Some(name),
        None => path.rsplit('/').next(),
    }
}

/// One binary's last run: wall seconds, and the CPU seconds of its whole process tree.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Timing {
    pub(crate) wall: f64,
    pub(crate) cpu: Option<f64>,
}

/// Longest first by the durations of the last run; binaries not timed yet go before all the
/// others, since nothing says they are short.
pub(crate) fn longest_first(binaries: &mut [TestBinary], durations: &HashMap<String, Timing>) {
    binaries.sort_by(|a, b| {
        let wall = |key| {
            durations
                .get(key)
                .map_or(f64::INFINITY, |t: &Timing| t.wall)
        };
        wall(&b.key).total_cmp(&wall(&a.key))
    });
}

/// `wall cpu key` lines (`-` for a CPU time not measured); `wall key` lines, as earlier
/// versions wrote them, too.
pub(crate) fn parse_durations(text: &str) -> HashMap<String, Timing> {
    text.lines()
        .filter_map(|line| {
            let (wall, rest) = line.split_once(' ')?;
            let wall = wall.parse().ok()?;
            let (cpu, key) = match rest.split_once(' ') {
                Some(("-", key)) => (None, key),
                Some((cpu, key)) if cpu.parse::<f64>().is_ok() => (cpu.parse().ok(), key),
                _ => (None, rest),
            };
            Some((key.to_owned(), Timing { wall, cpu }))
        })
        .collect()
}

fn format_durations(durations: &HashMap<String, Timing>) -> String {
    let mut lines: Vec<_> = durations
        .iter()
        .map(|(key, t)| format!("{:.1} {} {key}\n", t.wall, format_cpu(t.cpu)))
        .collect();
    lines.sort();
    lines.concat()
}

fn format_cpu(cpu: Option<f64>) -> String {
    cpu.map_or("-".to_owned(), |c| format!("{c:.1}"))
}

/// The timings in a document's recorded table (`--record`), by binary: what a clone
/// without timings of its own schedules by.
pub(crate) fn recorded_durations(document: &str) -> HashMap<String, Timing> {
    let Some(from) = document.find(RECORD_BEGIN) else {
        return HashMap::new();
    };
    let table = &document[from..];
    let table = &table[..table.find(RECORD_END).unwrap_or(table.len())];
    table
        .lines()
        .filter_map(|row| {
            let cells: Vec<&str> = row
                .trim()
                .trim_matches('|')
                .split('|')
                .map(str::trim)
                .collect();
            let key = cells
                .iter()
                .find_map(|c| c.strip_prefix('`')?.strip_suffix('`'))?;
            let wall = cells.first()?.parse().ok()?;
            let cpu = cells.get(1).and_then(|c| c.parse().ok());
            Some((key.to_owned(), Timing { wall, cpu }))
        })
        .collect()
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
    /// The exit status, or why the binary could not be run at all.
    status: Result<ExitStatus, String>,
    counts: Counts,
    took: Duration,
    /// CPU seconds of the binary and everything it started, when `reap` could count them.
    cpu: Option<f64>,
}

impl Finished {
    fn passed(&self) -> bool {
        self.status.as_ref().is_ok_and(ExitStatus::success)
    }
}

/// How many test binaries run at once.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Lanes {
    /// Binaries at once, of any kind.
    pub(crate) jobs: usize,
    /// More binaries beside those, if they are light: each used under [`LIGHT_CORES`] of
    /// CPU on average in its last run (it waits on timers: a CronJob's minute, a collector's
    /// quarantine), so it slows the others little.
    pub(crate) light: usize,
}

/// The average CPU use (cores) below which a binary is light: a tenth of what two binaries
/// at a time use together on the 2-core machine.
pub(crate) const LIGHT_CORES: f64 = 0.25;

/// A binary waiting to run.
struct Pending {
    key: String,
    log: PathBuf,
    command: Command,
    light: bool,
}

impl Pending {
    fn new(
        key: String,
        log: PathBuf,
        command: Command,
        durations: &HashMap<String, Timing>,
    ) -> Self {
        let light = durations.get(&key).is_some_and(Timing::is_light);
        Self {
            key,
            log,
            command,
            light,
        }
    }
}

impl Timing {
    /// Used under [`LIGHT_CORES`] on average; unmeasured is not light.
    pub(crate) fn is_light(&self) -> bool {
        self.cpu
            .is_some_and(|cpu| self.wall > 0.0 && cpu / self.wall < LIGHT_CORES)
    }
}

/// Which pending binary (in their order, longest first) may start now, with `heavy` binaries
/// that are not light and `running` in all running: the first one that keeps the binaries
/// that are not light within `jobs` and all of them within `jobs + light`.
fn admissible(pending: &[Pending], heavy: usize, running: usize, lanes: Lanes) -> Option<usize> {
    let jobs = lanes.jobs.max(1);
    if running >= jobs + lanes.light {
        return None;
    }
    pending
        .iter()
        .position(|p| heavy + usize::from(!p.light) <= jobs)
}

/// Runs one binary under `switchyard-dev reap`; a binary that cannot be started counts as
/// failed, with the reason, and the others still run.
async fn run_one(key: String, log: PathBuf, mut command: Command) -> Finished {
    let begun = Instant::now();
    let cpu_file = cpu_file(&log);
    let _ = std::fs::remove_file(&cpu_file);
    let status = async {
        let file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        command
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .kill_on_drop(true);
        // An executable another process still holds open for writing (a linker, a fork of a
        // process that had it open) cannot be started for a moment: ETXTBSY. Try again.
        let mut attempts = 0;
        loop {
            match command.status().await {
                Err(error)
                    if error.kind() == std::io::ErrorKind::ExecutableFileBusy && attempts < 20 =>
                {
                    attempts += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                result => break result.with_context(|| format!("starting {key}")),
            }
        }
    }
    .await
    .map_err(|e| format!("{e:#}"));
    // A test may print bytes that are not UTF-8 (a child process's log); they are shown
    // replaced, never a reason to stop.
    let output = read_log(&log);
    let cpu = std::fs::read_to_string(&cpu_file)
        .ok()
        .and_then(|c| c.trim().parse().ok());
    Finished {
        key,
        log,
        status,
        counts: counts(&output),
        took: begun.elapsed(),
        cpu,
    }
}

/// Where `switchyard-dev reap` writes the CPU seconds of the binary whose output is `log`.
fn cpu_file(log: &Path) -> PathBuf {
    log.with_extension("cpu")
}

/// `program`, run by `switchyard-dev reap` (`dev`, this executable's path), which writes the
/// CPU seconds of its tree to [`cpu_file`] of `log`.
fn reaped(dev: &Path, program: &Path, log: &Path) -> Command {
    let mut command = Command::new(dev);
    command
        .arg("reap")
        .arg("--cpu")
        .arg(cpu_file(log))
        .arg("--")
        .arg(program);
    command
}

fn read_log(log: &Path) -> String {
    std::fs::read(log)
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .unwrap_or_default()
}

/// Where `switchyard-dev test --record` writes the table of times in a document.
const RECORD_BEGIN: &str = "<!-- switchyard-dev test --record: begin -->";
const RECORD_END: &str = "<!-- switchyard-dev test --record: end -->";

/// One run of the suite, as `--record` reports it.
pub(crate) struct Run {
    pub(crate) date: String,
    pub(crate) commit: String,
    pub(crate) machine: String,
    pub(crate) lanes: Lanes,
    pub(crate) wall: Duration,
    pub(crate) counts: Counts,
    /// `(key, timing, passed)`, in any order.
    pub(crate) binaries: Vec<(String, Timing, bool)>,
}

/// The Markdown block `--record` puts between the markers: the run, then every binary,
/// longest first.
pub(crate) fn report(run: &Run) -> String {
    let mut binaries = run.binaries.clone();
    binaries.sort_by(|a, b| b.1.wall.total_cmp(&a.1.wall).then_with(|| a.0.cmp(&b.0)));
    let sum: f64 = binaries.iter().map(|b| b.1.wall).sum();
    let cpu: f64 = binaries.iter().filter_map(|b| b.1.cpu).sum();
    let mut out = format!(
        "{RECORD_BEGIN}\n\
         Recorded by `switchyard-dev test --record docs/testing.md` on {}, at {}, on {}: \
         {} passed, {} failed, {} ignored; {} test binaries and the doc tests, {} at a time \
         and {} more of the light ones, in {:.0} s of wall time ({:.0} s summed, {:.0} CPU seconds).\n\n\
         | seconds | CPU seconds | test binary (package directory, kind, target) | result |\n\
         |--:|--:|---|---|\n",
        run.date,
        run.commit,
        run.machine,
        run.counts.passed,
        run.counts.failed,
        run.counts.ignored,
        binaries.len().saturating_sub(1),
        run.lanes.jobs,
        run.lanes.light,
        run.wall.as_secs_f64(),
        sum,
        cpu,
    );
    for (key, timing, passed) in &binaries {
        let mark = if *passed { "ok" } else { "failed" };
        out.push_str(&format!(
            "| {:.1} | {} | `{key}` | {mark} |\n",
            timing.wall,
            format_cpu(timing.cpu)
        ));
    }
    out.push_str(RECORD_END);
    out
}

/// `document` with the block between the markers replaced by `block` (markers included);
/// an error if the markers are missing, so a typo never appends a second table.
pub(crate) fn replace_record(document: &str, block: &str) -> anyhow::Result<String> {
    replace_between(document, RECORD_BEGIN, RECORD_END, block)
}

/// `document` with everything from the `begin` line to the `end` line replaced by `block`;
/// an error naming the marker that is missing.
pub(crate) fn replace_between(
    document: &str,
    begin: &str,
    end: &str,
    block: &str,
) -> anyhow::Result<String> {
    let from = document
        .find(begin)
        .with_context(|| format!("no {begin:?} line to write at"))?;
    let to = document[from..]
        .find(end)
        .map(|i| from + i + end.len())
        .with_context(|| format!("no {end:?} after {begin:?}"))?;
    Ok(format!("{}{block}{}", &document[..from], &document[to..]))
}

/// What `program args` printed, trimmed; `None` if it could not run or failed.
pub(crate) fn output(program: &str, args: &[&str]) -> Option<String> {
    std::process::Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
}

/// The machine in a few words: cores, CPU model and memory, as the figures depend on them.
pub(crate) fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .map_or("unknown memory".to_owned(), |kib| {
            format!("{} GiB", (kib + (1 << 19)) >> 20)
        });
    format!("{cores} cores {cpu}, {memory}").replace('\t', " ")
}

/// Builds the test binaries, runs them `jobs` at a time (and the doc tests as one more job),
/// and fails if any of them failed. `args` go to every test binary (a filter, `--nocapture`).
/// With `record`, the times of every binary replace the recorded table in that document.
pub(crate) async fn test(
    lanes: Lanes,
    args: Vec<String>,
    record: Option<PathBuf>,
    seed: Option<PathBuf>,
) -> anyhow::Result<()> {
    let jobs = lanes.jobs.max(1);
    // Read before the build, which may link this executable again at the same path (linux
    // then names the running one `… (deleted)`).
    let dev = std::env::current_exe().context("this executable")?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let workspace = std::env::current_dir()?;
    let state = workspace.join("target/switchyard-test");
    let logs = state.join("logs");
    std::fs::create_dir_all(&logs)?;
    if let Some(document) = &record {
        // Fail before an hour of tests rather than after.
        replace_record(&std::fs::read_to_string(document)?, "")
            .with_context(|| format!("--record {}", document.display()))?;
    }

    let built = Command::new(&cargo)
        .args([
            "test",
            "--locked",
            "--workspace",
            "--no-run",
            "--message-format=json",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("running cargo test --no-run")?
        .wait_with_output()
        .await?;
    let messages = String::from_utf8_lossy(&built.stdout);
    let errors = diagnostics(&messages);
    if !built.status.success() {
        // Last, where a CI log's tail shows it: what the compiler or the linker said, and how
        // much room the build had (a full disk fails the link of whichever binary is last).
        let free = output("df", &["-Ph", "target"])
            .and_then(|df| df.lines().nth(1).map(str::to_owned))
            .unwrap_or_else(|| "unknown".into());
        bail!(
            "building the tests failed ({}); target's filesystem: {free}; {} error(s):\n{}",
            built.status,
            errors.len(),
            errors.join("\n")
        );
    }
    let mut binaries = test_binaries(&messages, &workspace)?;
    let durations_path = state.join("durations");
    let mut durations = match std::fs::read_to_string(&durations_path) {
        Ok(text) => parse_durations(&text),
        Err(_) => seed
            .as_ref()
            .and_then(|document| std::fs::read_to_string(document).ok())
            .map(|document| recorded_durations(&document))
            .unwrap_or_default(),
    };
    longest_first(&mut binaries, &durations);
    println!(
        "running {} test binaries and the doc tests, {jobs} at a time and {} more of those \
         that mostly wait; logs in {}",
        binaries.len(),
        lanes.light,
        logs.display()
    );

    let mut pending = Vec::new();
    for binary in &binaries {
        let log = logs.join(format!("{}.log", binary.key.replace(['/', ' '], "_")));
        let mut command = reaped(&dev, &binary.executable, &log);
        command
            .args(&args)
            .current_dir(&binary.dir)
            .env("CARGO_MANIFEST_DIR", &binary.dir)
            .env("CARGO_PKG_NAME", &binary.package);
        pending.push(Pending::new(binary.key.clone(), log, command, &durations));
    }
    // The doc tests are quick: they start once the longest binaries have.
    let log = logs.join("doc-tests.log");
    let mut doc = reaped(&dev, Path::new(&cargo), &log);
    doc.args(["test", "--locked", "--workspace", "--doc"])
        .current_dir(&workspace);
    pending.insert(
        jobs.min(pending.len()),
        Pending::new("doc tests".to_owned(), log, doc, &durations),
    );

    let started = Instant::now();
    let mut running = JoinSet::new();
    // Whether each running binary counts as light, by key.
    let mut light_running: HashMap<String, bool> = HashMap::new();
    let mut total = Counts::default();
    let mut failed = Vec::new();
    let mut times = Vec::new();
    loop {
        loop {
            let heavy = light_running.values().filter(|light| !**light).count();
            let Some(next) = admissible(&pending, heavy, light_running.len(), lanes) else {
                break;
            };
            let Pending {
                key,
                log,
                command,
                light,
            } = pending.remove(next);
            light_running.insert(key.clone(), light);
            running.spawn(run_one(key, log, command));
        }
        let Some(joined) = running.join_next().await else {
            break;
        };
        let finished = joined.context("a test binary's task")?;
        light_running.remove(&finished.key);
        total.passed += finished.counts.passed;
        total.failed += finished.counts.failed;
        total.ignored += finished.counts.ignored;
        let seconds = finished.took.as_secs_f64();
        if finished.passed() {
            println!(
                "ok      {seconds:7.1} s  {} ({} passed)",
                finished.key, finished.counts.passed
            );
        } else {
            let how = match &finished.status {
                Ok(status) => status.to_string(),
                Err(error) => error.clone(),
            };
            println!(
                "FAILED  {seconds:7.1} s  {} ({how}); its output, {}:",
                finished.key,
                finished.log.display()
            );
            let log = read_log(&finished.log);
            println!("{log}");
            failed.push((finished.key.clone(), panics(&log)));
        }
        let timing = Timing {
            wall: seconds,
            cpu: finished.cpu,
        };
        times.push((finished.key.clone(), timing, finished.passed()));
        durations.insert(finished.key, timing);
    }
    let wall = started.elapsed();
    std::fs::write(&durations_path, format_durations(&durations))?;
    println!(
        "{} passed, {} failed, {} ignored; {} test binaries and the doc tests in {:.0} s",
        total.passed,
        total.failed,
        total.ignored,
        binaries.len(),
        wall.as_secs_f64()
    );
    if let Some(document) = &record {
        let run = Run {
            date: output("date", &["-u", "+%F"]).unwrap_or_else(|| "unknown".into()),
            commit: output("git", &["rev-parse", "--short", "HEAD"])
                .unwrap_or_else(|| "unknown".into()),
            machine: machine(),
            lanes,
            wall,
            counts: total,
            binaries: times,
        };
        let text = std::fs::read_to_string(document)?;
        std::fs::write(document, replace_record(&text, &report(&run))?)?;
        println!("recorded the times in {}", document.display());
    }
    if !failed.is_empty() {
        // Last, where a CI log's tail shows it: which binaries failed and where they panicked.
        println!("{} test binaries failed:", failed.len());
        for (key, panics) in &failed {
            println!("  {key}");
            for line in panics {
                println!("    {line}");
            }
        }
        let keys: Vec<&str> = failed.iter().map(|(k, _)| k.as_str()).collect();
        bail!("failed: {}", keys.join(", "));
    }
    Ok(())
}

/// The first few panics in a test binary's output: each `panicked at` line and the message
/// line after it, shortened.
fn panics(log: &str) -> Vec<String> {
    let lines: Vec<&str> = log.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if line.contains(" panicked at ") {
            let message = lines.get(i + 1).copied().unwrap_or_default();
            let mut text = format!("{} {}", line.trim(), message.trim());
            if text.len() > 300 {
                let cut = (0..=300)
                    .rev()
                    .find(|&c| text.is_char_boundary(c))
                    .unwrap_or(0);
                text.truncate(cut);
                text.push('…');
            }
            out.push(text);
            if out.len() == 3 {
                break;
            }
        }
    }
    out
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
    fn a_failed_build_names_each_error_by_its_last_lines() {
        let linker = (0..20)
            .map(|i| format!("note: line {i}"))
            .chain(["collect2: error: ld returned 1 exit status".to_owned()])
            .collect::<Vec<_>>()
            .join("\n");
        let messages = [
            serde_json::json!({"reason": "compiler-message", "message": {"level": "warning", "rendered": "warning: unused\n"}}),
            serde_json::json!({"reason": "compiler-message", "message": {"level": "error", "rendered": "error[E0308]: mismatched types\n"}}),
            serde_json::json!({"reason": "compiler-message", "message": {"level": "error", "rendered": format!("error: linking with `cc` failed\n{linker}\n")}}),
            serde_json::json!({"reason": "build-finished", "success": false}),
        ]
        .map(|m| m.to_string())
        .join("\n");
        let errors = diagnostics(&messages);
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert_eq!(errors[0], "error[E0308]: mismatched types");
        assert!(
            errors[1].starts_with("(14 lines before) …\nnote: line 13"),
            "{}",
            errors[1]
        );
        assert!(
            errors[1].ends_with("ld returned 1 exit status"),
            "{}",
            errors[1]
        );
    }

    #[test]
    fn the_summary_names_where_each_failed_binary_panicked() {
        let log = "running 2 tests\n\nthread 'a' (12) panicked at tests/x.rs:3:5:\nthe key was lost\nstack backtrace:\n   0: x\n";
        assert_eq!(
            panics(log),
            ["thread 'a' (12) panicked at tests/x.rs:3:5: the key was lost"]
        );
        assert!(panics("test result: ok").is_empty());
    }

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
        let timing = |wall, cpu| Timing { wall, cpu };
        let durations = parse_durations(&format_durations(&HashMap::from([
            ("short".to_owned(), timing(1.5, None)),
            ("long".to_owned(), timing(300.0, Some(20.0))),
        ])));
        assert_eq!(durations["long"], timing(300.0, Some(20.0)));
        longest_first(&mut binaries, &durations);
        let keys: Vec<_> = binaries.iter().map(|b| b.key.as_str()).collect();
        assert_eq!(keys, ["new", "long", "short"]);
        // Earlier versions wrote `wall key`.
        assert_eq!(
            parse_durations("12.5 tests test soak\n")["tests test soak"],
            timing(12.5, None)
        );
    }

    #[test]
    fn a_clone_without_timings_takes_those_of_the_recorded_run() {
        let run = Run {
            date: "2026-11-30".to_owned(),
            commit: "abc1234".to_owned(),
            machine: "2 cores, 24 GiB".to_owned(),
            lanes: Lanes { jobs: 2, light: 1 },
            wall: Duration::from_secs(100),
            counts: Counts::default(),
            binaries: vec![
                (
                    "tests test soak".to_owned(),
                    Timing {
                        wall: 72.1,
                        cpu: Some(60.0),
                    },
                    true,
                ),
                (
                    "doc tests".to_owned(),
                    Timing {
                        wall: 4.0,
                        cpu: None,
                    },
                    true,
                ),
            ],
        };
        let document = format!("# Testing\n\n{}\n", report(&run));
        let seeded = recorded_durations(&document);
        assert_eq!(seeded.len(), 2, "{seeded:?}");
        assert_eq!(seeded["tests test soak"].cpu, Some(60.0));
        assert_eq!(seeded["doc tests"].wall, 4.0);
        // The table before CPU seconds were counted: wall seconds only.
        let old = format!(
            "{RECORD_BEGIN}\n| seconds | test binary | result |\n|--:|---|---|\n| 91.2 | `services/reconciler test podgc` | ok |\n{RECORD_END}\n"
        );
        assert_eq!(
            recorded_durations(&old)["services/reconciler test podgc"],
            Timing {
                wall: 91.2,
                cpu: None
            }
        );
        assert!(recorded_durations("no table").is_empty());
    }

    #[test]
    fn light_binaries_run_beside_the_others_and_never_in_their_place() {
        let pending = |light: &[bool]| -> Vec<Pending> {
            light
                .iter()
                .enumerate()
                .map(|(i, light)| Pending {
                    key: i.to_string(),
                    log: PathBuf::new(),
                    command: Command::new("true"),
                    light: *light,
                })
                .collect()
        };
        let lanes = Lanes { jobs: 2, light: 1 };
        // Two lanes free: the longest, whatever it is.
        assert_eq!(admissible(&pending(&[false, true]), 0, 0, lanes), Some(0));
        // Two heavy ones running: only a light one, past the heavy ones ahead of it.
        assert_eq!(admissible(&pending(&[false, true]), 2, 2, lanes), Some(1));
        assert_eq!(admissible(&pending(&[false, false]), 2, 2, lanes), None);
        // Three running: nothing more.
        assert_eq!(admissible(&pending(&[true]), 2, 3, lanes), None);
        // Light ones never keep a heavy one from its lane.
        assert_eq!(admissible(&pending(&[false]), 0, 2, lanes), Some(0));
        assert_eq!(admissible(&pending(&[false]), 1, 2, lanes), Some(0));
        // Without light lanes, as before: `jobs` at a time.
        let two = Lanes { jobs: 2, light: 0 };
        assert_eq!(admissible(&pending(&[true]), 2, 2, two), None);
        assert_eq!(admissible(&pending(&[true]), 1, 1, two), Some(0));
        // A light binary is one that used under a quarter of a core.
        assert!(
            Timing {
                wall: 100.0,
                cpu: Some(20.0)
            }
            .is_light()
        );
        assert!(
            !Timing {
                wall: 100.0,
                cpu: Some(30.0)
            }
            .is_light()
        );
        assert!(
            !Timing {
                wall: 100.0,
                cpu: None
            }
            .is_light()
        );
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

    #[test]
    fn a_record_replaces_only_the_block_between_its_markers() {
        let run = Run {
            date: "2026-11-28".to_owned(),
            commit: "abc1234".to_owned(),
            machine: "2 cores, 24 GiB".to_owned(),
            lanes: Lanes { jobs: 2, light: 1 },
            wall: Duration::from_secs(600),
            counts: Counts {
                passed: 5,
                failed: 1,
                ignored: 0,
            },
            binaries: vec![
                (
                    "doc tests".to_owned(),
                    Timing {
                        wall: 20.0,
                        cpu: Some(31.0),
                    },
                    true,
                ),
                (
                    "tests test soak".to_owned(),
                    Timing {
                        wall: 120.04,
                        cpu: Some(80.26),
                    },
                    true,
                ),
                (
                    "services/queue test fuzz".to_owned(),
                    Timing {
                        wall: 3.0,
                        cpu: None,
                    },
                    false,
                ),
            ],
        };
        let block = report(&run);
        let lines: Vec<_> = block.lines().collect();
        assert!(lines[1].contains("on 2026-11-28, at abc1234, on 2 cores, 24 GiB"));
        assert!(lines[1].contains(
            "5 passed, 1 failed, 0 ignored; 2 test binaries and the doc tests, 2 at a time and 1 more of the light ones,"
        ));
        assert!(lines[1].contains("in 600 s of wall time (143 s summed, 111 CPU seconds)"));
        assert_eq!(
            &lines[5..8],
            [
                "| 120.0 | 80.3 | `tests test soak` | ok |",
                "| 20.0 | 31.0 | `doc tests` | ok |",
                "| 3.0 | - | `services/queue test fuzz` | failed |",
            ]
        );

        let document =
            format!("# Testing\n\nbefore\n\n{RECORD_BEGIN}\nold\n{RECORD_END}\n\nafter\n");
        let recorded = replace_record(&document, &block).unwrap();
        assert_eq!(
            recorded,
            format!("# Testing\n\nbefore\n\n{block}\n\nafter\n")
        );
        assert_eq!(replace_record(&recorded, &block).unwrap(), recorded);
        assert!(replace_record("# no markers\n", &block).is_err());
        assert!(replace_record(&format!("{RECORD_BEGIN}\n"), &block).is_err());
    }

    #[test]
    fn a_log_that_is_not_utf8_is_read_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("bytes.log");
        std::fs::write(
            &log,
            b"test result: ok. 2 passed; 0 failed; 0 ignored\n\xff\xfe\n",
        )
        .unwrap();
        let output = read_log(&log);
        assert!(output.contains('\u{fffd}'));
        assert_eq!(counts(&output).passed, 2);
        assert_eq!(read_log(&dir.path().join("missing.log")), "");
    }
}
