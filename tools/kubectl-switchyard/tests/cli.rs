//! The command line as a user meets it, without any service: every verb's `--help`, shell
//! completions, the identity flags anywhere on the line, and what a missing identity says.

use std::process::{Command, Output};

const VERBS: &[&str] = &["status", "top", "why", "drain", "console", "completion"];

fn plugin(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kubectl-switchyard"))
        .args(args)
        .env_remove("SWITCHYARD_TLS_CERT")
        .env_remove("SWITCHYARD_TLS_KEY")
        .env_remove("SWITCHYARD_TLS_CA")
        .env_remove("SWITCHYARD_INSECURE_PLAINTEXT")
        .output()
        .expect("kubectl-switchyard runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn every_verb_has_help_that_names_it_and_the_identity_flags() {
    let top = plugin(&["--help"]);
    assert!(top.status.success(), "{}", stderr(&top));
    for verb in VERBS {
        assert!(stdout(&top).contains(verb), "--help lists {verb}");
        let help = plugin(&[verb, "--help"]);
        assert!(help.status.success(), "{verb} --help: {}", stderr(&help));
        let text = stdout(&help);
        assert!(
            text.contains(&format!("Usage: kubectl switchyard {verb}")),
            "{verb} --help:\n{text}"
        );
        // The identity flags are global: documented, and for a CLI user, under every verb.
        assert!(
            text.contains("--tls-cert") && text.contains("switchyard-observer-tls"),
            "{verb} --help:\n{text}"
        );
    }
    let version = plugin(&["--version"]);
    assert!(stdout(&version).starts_with("kubectl-switchyard "));
}

#[test]
fn completions_are_printed_for_each_shell_without_an_identity() {
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef kubectl-switchyard"),
        ("fish", "complete -c kubectl-switchyard"),
    ] {
        let out = plugin(&["completion", shell]);
        assert!(out.status.success(), "{shell}: {}", stderr(&out));
        let script = stdout(&out);
        assert!(script.contains(marker), "{shell}:\n{script}");
        assert!(script.contains("drain"), "{shell} completes the verbs");
    }
    let out = plugin(&["completion", "tcsh"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("invalid value 'tcsh'"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_missing_or_partial_identity_is_named_before_anything_is_dialed() {
    let out = plugin(&["status", "--elector-addr=127.0.0.1:1"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no identity: give --tls-cert, --tls-key and --tls-ca"),
        "{}",
        stderr(&out)
    );
    // After the verb, like any kubectl flag.
    let out = plugin(&["status", "--elector-addr=127.0.0.1:1", "--tls-cert=/x.crt"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("--tls-cert, --tls-key and --tls-ca go together"),
        "{}",
        stderr(&out)
    );
    let out = plugin(&[
        "why",
        "replicaset/web",
        "--insecure-plaintext",
        "--tls-ca=/ca.crt",
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("cannot be used with"),
        "{}",
        stderr(&out)
    );
}

/// `status` with an unreachable apiserver, the kubeconfig found as kubectl finds it: the
/// problem names the server the resolved kubeconfig's context points at.
fn status_with(home: &std::path::Path, kubeconfig: Option<String>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kubectl-switchyard"));
    command
        .args(["status", "--insecure-plaintext", "--call-timeout=2s"])
        .env("HOME", home)
        .env_remove("KUBECONFIG")
        .env_remove("SWITCHYARD_ELECTOR_ADDR")
        .env_remove("SWITCHYARD_QUEUE_ADDR")
        .env_remove("SWITCHYARD_ADMIN_ADDR");
    if let Some(list) = kubeconfig {
        command.env("KUBECONFIG", list);
    }
    command.output().expect("kubectl-switchyard runs")
}

#[test]
fn the_kubeconfig_is_found_as_kubectl_finds_it() {
    let dir = tempfile::tempdir().unwrap();
    let context = "apiVersion: v1\nkind: Config\ncurrent-context: far\ncontexts:\n- name: far\n  context: {cluster: far, user: me, namespace: shop}\nusers:\n- name: me\n  user: {token: t}\n";
    let cluster = |port: u16| {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: far\n  cluster: {{server: \"https://127.0.0.1:{port}\"}}\n"
        )
    };
    // KUBECONFIG lists two files, merged: the context in one, its cluster in the other.
    let (first, second) = (dir.path().join("a.yaml"), dir.path().join("b.yaml"));
    std::fs::write(&first, context).unwrap();
    std::fs::write(&second, cluster(9)).unwrap();
    let list = std::env::join_paths([&first, &second]).unwrap();
    let empty_home = dir.path().join("nobody");
    let out = status_with(&empty_home, Some(list.to_string_lossy().into_owned()));
    assert!(
        stderr(&out).contains("the apiserver at https://127.0.0.1:9/ is unreachable"),
        "{}",
        stderr(&out)
    );
    // Without KUBECONFIG: ~/.kube/config.
    let home = dir.path().join("home");
    std::fs::create_dir_all(home.join(".kube")).unwrap();
    std::fs::write(
        home.join(".kube/config"),
        format!(
            "{context}{}",
            cluster(7).trim_start_matches("apiVersion: v1\nkind: Config\n")
        ),
    )
    .unwrap();
    let out = status_with(&home, None);
    assert!(
        stderr(&out).contains("the apiserver at https://127.0.0.1:7/ is unreachable"),
        "{}",
        stderr(&out)
    );
    // Neither: only the address flags, and none was given.
    let out = status_with(&empty_home, None);
    assert!(
        stderr(&out).contains("nothing to look at"),
        "{}",
        stderr(&out)
    );
}
