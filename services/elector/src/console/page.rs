//! The console's HTML, rendered on the server from the last sample. The only script reloads
//! the body every two seconds; every figure is in the markup, so the page reads the same
//! without it.

use std::{
    fmt::Write as _,
    time::{Duration, SystemTime},
};

use switchyard_proto::{elector::v1 as elector_pb, queue::v1 as pb};
use switchyard_runtime::authz::Caller;

use super::{Backlog, FailingKeys, Snapshot};

/// The page around a body.
pub(crate) fn frame(body: &str) -> String {
    format!(
        r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Switchyard console</title>
<style>{STYLE}</style>
</head>
<body>
<main id="console">{body}</main>
<script>{SCRIPT}</script>
</body>
</html>
"#
    )
}

const STYLE: &str = "
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #1d232a; }
h1 { font-size: 1.3em; margin: 0 0 .2em; } h2 { font-size: 1.1em; margin: 1.4em 0 .4em; }
.meta { color: #5b6570; }
table { border-collapse: collapse; } td, th { padding: .2em .8em .2em 0; text-align: left; }
th { font-weight: 600; border-bottom: 1px solid #ccd; } td.n { text-align: right; }
#shards { display: grid; grid-template-columns: repeat(32, 1.4em); gap: 2px; margin: .4em 0 .8em; }
.shard { height: 1.4em; border-radius: 2px; font-size: 9px; color: #fff; text-align: center;
  line-height: 1.4em; }
.shard.releasing { opacity: .55; } .shard.unassigned { background: #b9bec4; }
.swatch { display: inline-block; width: .9em; height: .9em; border-radius: 2px;
  vertical-align: middle; }
.error { color: #b3261e; } svg { vertical-align: middle; }
";

/// Reloads the body in place; keeps the current one when a reload fails.
const SCRIPT: &str = "
setInterval(async () => {
  try {
    const r = await fetch('/console/body', {cache: 'no-store'});
    if (r.ok) document.getElementById('console').innerHTML = await r.text();
  } catch (e) {}
}, 2000);
";

/// The body: shard map, backlog, reconcilers and failing keys.
pub(crate) fn body(
    snapshot: &Snapshot,
    failing: &FailingKeys,
    trace_url: Option<&str>,
    caller: Option<&Caller>,
) -> String {
    let mut html = String::new();
    let viewer = caller.map_or_else(
        || "anyone (plaintext)".to_owned(),
        |c| c.identity.to_string(),
    );
    let sampled = snapshot.history.back().map(|(at, _)| *at).map_or_else(
        || "not yet".to_owned(),
        |at| humantime::format_rfc3339_seconds(at).to_string(),
    );
    let _ = write!(
        html,
        r#"<h1>Switchyard</h1><p class="meta">sampled <span id="sampled-at">{}</span>, every {:?}; viewed as {}</p>"#,
        esc(&sampled),
        snapshot.interval,
        esc(&viewer)
    );
    shard_map(&mut html, snapshot);
    backlog(&mut html, snapshot);
    reconcilers(&mut html, snapshot);
    failing_keys(&mut html, failing, trace_url);
    html
}

/// A member's colour: hues a golden angle apart, by its place among the members.
fn colour(index: usize) -> String {
    format!("hsl({:.0}, 62%, 42%)", (index as f64 * 137.508) % 360.0)
}

fn shard_map(html: &mut String, snapshot: &Snapshot) {
    let Some(map) = &snapshot.map else {
        html.push_str("<h2>Shards</h2><p>The shard map has not been read from etcd yet.</p>");
        return;
    };
    let leader = if map.leader_id.is_empty() {
        "none"
    } else {
        &map.leader_id
    };
    let _ = write!(
        html,
        r#"<h2>Shards</h2><p><span id="shard-count">{}</span> shards, revision {}; elector leader <span id="leader">{}</span></p>"#,
        map.shard_count,
        map.revision,
        esc(leader)
    );
    let place = |id: &str| snapshot.replicas.iter().position(|r| r.id == id);
    html.push_str(r#"<div id="shards">"#);
    for shard in &map.shards {
        let state = elector_pb::ShardState::try_from(shard.state)
            .unwrap_or(elector_pb::ShardState::Unspecified);
        let (class, style) = match (state, place(&shard.member_id)) {
            (elector_pb::ShardState::Unassigned, _) | (_, None) => ("unassigned", String::new()),
            (elector_pb::ShardState::Releasing, Some(i)) => {
                ("releasing", format!("background:{}", colour(i)))
            }
            (_, Some(i)) => ("active", format!("background:{}", colour(i))),
        };
        let _ = write!(
            html,
            r#"<div class="shard {class}" style="{style}" data-owner="{}" title="shard {} · {} · {} · epoch {}">{}</div>"#,
            esc(&shard.member_id),
            shard.shard,
            esc(if shard.member_id.is_empty() {
                "no owner"
            } else {
                &shard.member_id
            }),
            class,
            shard.epoch,
            shard.shard
        );
    }
    html.push_str("</div>");
    html.push_str(
        r#"<table id="replicas"><tr><th></th><th>queue replica</th><th>address</th><th>shards</th><th></th></tr>"#,
    );
    for (i, replica) in snapshot.replicas.iter().enumerate() {
        let note = match (&replica.error, replica.draining) {
            (Some(error), _) => format!(r#"<span class="error">{}</span>"#, esc(error)),
            (None, true) => "draining".to_owned(),
            (None, false) => String::new(),
        };
        let _ = write!(
            html,
            r#"<tr data-replica="{id}"><td><span class="swatch" style="background:{}"></span></td><td>{id}</td><td>{}</td><td class="n shards">{}</td><td>{note}</td></tr>"#,
            colour(i),
            esc(&replica.address),
            replica.shards,
            id = esc(&replica.id),
        );
    }
    html.push_str("</table>");
}

fn backlog(html: &mut String, snapshot: &Snapshot) {
    let span = snapshot
        .history
        .front()
        .zip(snapshot.history.back())
        .map(|((first, _), (last, _))| last.duration_since(*first).unwrap_or_default())
        .unwrap_or_default();
    let _ = write!(
        html,
        r#"<h2>Backlog</h2><table id="backlog"><tr><th>controller</th><th>queued</th><th>in flight</th><th>retrying</th><th>oldest</th><th>queued + in flight, last {}</th></tr>"#,
        short(span)
    );
    let latest = snapshot.history.back().map(|(_, backlog)| backlog);
    for (controller, now) in latest.into_iter().flatten() {
        let _ = write!(
            html,
            r#"<tr data-controller="{}"><td>{}</td><td class="n depth">{}</td><td class="n in-flight">{}</td><td class="n retrying">{}</td><td class="n">{}</td><td>{}</td></tr>"#,
            esc(controller),
            esc(controller),
            now.depth,
            now.in_flight,
            now.retrying,
            short(now.oldest),
            sparkline(snapshot, controller)
        );
    }
    html.push_str("</table>");
}

/// The controller's queued plus in-flight keys over the history, as a line.
fn sparkline(snapshot: &Snapshot, controller: &str) -> String {
    const WIDTH: f64 = 240.0;
    const HEIGHT: f64 = 28.0;
    let values: Vec<u64> = snapshot
        .history
        .iter()
        .map(|(_, backlog)| {
            backlog
                .get(controller)
                .map_or(0, |b: &Backlog| b.depth + b.in_flight)
        })
        .collect();
    let max = values.iter().copied().max().unwrap_or(0).max(1) as f64;
    let step = if values.len() > 1 {
        WIDTH / (values.len() - 1) as f64
    } else {
        0.0
    };
    let mut points = String::new();
    for (i, value) in values.iter().enumerate() {
        let _ = write!(
            points,
            "{:.1},{:.1} ",
            i as f64 * step,
            HEIGHT - 1.0 - (*value as f64 / max) * (HEIGHT - 2.0)
        );
    }
    format!(
        r##"<svg width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="peak {}"><polyline fill="none" stroke="#2f6fb3" stroke-width="1.5" points="{}"/></svg> <span class="meta">peak {}</span>"##,
        max as u64,
        points.trim_end(),
        max as u64
    )
}

fn reconcilers(html: &mut String, snapshot: &Snapshot) {
    html.push_str(
        r#"<h2>Reconcilers</h2><table id="reconcilers"><tr><th>worker</th><th>queue replica</th><th>controllers</th><th>credits</th><th>in flight</th><th>reconciles/s</th></tr>"#,
    );
    for r in &snapshot.reconcilers {
        let controllers = if r.controllers.is_empty() {
            "all".to_owned()
        } else {
            r.controllers.join(", ")
        };
        let _ = write!(
            html,
            r#"<tr data-worker="{}"><td>{}</td><td>{}</td><td>{}</td><td class="n">{}</td><td class="n">{}</td><td class="n">{}</td></tr>"#,
            esc(&r.worker_id),
            esc(&r.worker_id),
            esc(&r.replica),
            esc(&controllers),
            r.credits,
            r.in_flight,
            r.per_second
                .map_or_else(|| "…".to_owned(), |rate| format!("{rate:.1}"))
        );
    }
    html.push_str("</table>");
}

fn failing_keys(html: &mut String, failing: &FailingKeys, trace_url: Option<&str>) {
    html.push_str("<h2>Failing keys</h2>");
    let (keys, total, errors) = match failing {
        FailingKeys::NotAllowed => {
            html.push_str(
                r#"<p id="failing-denied">Shown to the switchyard-operator identity only, as <code>kubectl switchyard why</code> is.</p>"#,
            );
            return;
        }
        FailingKeys::Listed {
            keys,
            total,
            errors,
        } => (keys, total, errors),
    };
    if keys.is_empty() && errors.is_empty() {
        html.push_str(r#"<p id="failing-total">None: every key's last reconcile succeeded.</p>"#);
        return;
    }
    let _ = write!(
        html,
        r#"<p>Keys with failures not yet forgotten: <span id="failing-total">{total}</span>{}</p>"#,
        if keys.len() as u64 == *total {
            String::new()
        } else {
            format!("; the {} with the most", keys.len())
        }
    );
    for error in errors {
        let _ = write!(html, r#"<p class="error">{}</p>"#, esc(error));
    }
    html.push_str(
        r#"<table id="failing"><tr><th>key</th><th>failures</th><th>now</th><th>last error</th><th>trace</th><th>queue replica</th></tr>"#,
    );
    for failing in keys {
        let key = &failing.key;
        let name = key.key.as_ref().map_or_else(String::new, |k| {
            if k.namespace.is_empty() {
                format!("{} {}", k.controller, k.name)
            } else {
                format!("{} {}/{}", k.controller, k.namespace, k.name)
            }
        });
        let last = key.last_outcome.as_ref();
        let error = last.map_or("", |l| l.error.as_str());
        let trace = last.map_or("", |l| l.trace_id.as_str());
        let trace = match (trace, trace_url) {
            ("", _) => String::new(),
            (id, Some(url)) => format!(
                r#"<a href="{}">{}</a>"#,
                esc(&url.replace("{trace_id}", id)),
                esc(id)
            ),
            (id, None) => esc(id),
        };
        let _ = write!(
            html,
            r#"<tr><td class="key">{}</td><td class="n failures">{}</td><td>{}</td><td class="last-error">{}</td><td class="trace">{}</td><td>{}</td></tr>"#,
            esc(&name),
            key.failures,
            phase(key),
            esc(error),
            trace,
            esc(&failing.replica)
        );
    }
    html.push_str("</table>");
}

fn phase(key: &pb::DescribeKeyResponse) -> String {
    let at = |t: Option<&prost_types::Timestamp>| {
        t.and_then(|t| SystemTime::try_from(*t).ok())
            .map(|t| humantime::format_rfc3339_seconds(t).to_string())
            .unwrap_or_default()
    };
    match pb::KeyPhase::try_from(key.phase).unwrap_or(pb::KeyPhase::Unspecified) {
        pb::KeyPhase::Queued => "queued".to_owned(),
        pb::KeyPhase::Delayed => format!("backing off until {}", at(key.ready_at.as_ref())),
        pb::KeyPhase::Leased => format!("leased to {}", esc(&key.worker_id)),
        pb::KeyPhase::Absent | pb::KeyPhase::Unspecified => "not held".to_owned(),
    }
}

/// A duration as the page shows it: 850ms, 12s, 3m20s.
fn short(d: Duration) -> String {
    let secs = d.as_secs();
    match secs {
        0 => format!("{}ms", d.as_millis()),
        1..60 => format!("{secs}s"),
        _ => format!("{}m{:02}s", secs / 60, secs % 60),
    }
}

/// Text for HTML content and attribute values.
fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_errors_are_escaped() {
        assert_eq!(
            esc(r#"<script>"a" & 'b'</script>"#),
            "&lt;script&gt;&quot;a&quot; &amp; &#39;b&#39;&lt;/script&gt;"
        );
    }

    #[test]
    fn durations_read_short() {
        assert_eq!(short(Duration::from_millis(850)), "850ms");
        assert_eq!(short(Duration::from_secs(12)), "12s");
        assert_eq!(short(Duration::from_secs(200)), "3m20s");
    }

    #[test]
    fn a_failing_keys_trace_links_through_the_template() {
        let key = pb::DescribeKeyResponse {
            key: Some(switchyard_proto::common::v1::WorkKey {
                controller: "apps/v1/ReplicaSet".into(),
                namespace: "web".into(),
                name: "<api>".into(),
            }),
            failures: 3,
            last_outcome: Some(pb::LastOutcome {
                error: "quota \"pods\" exceeded".into(),
                trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let failing = FailingKeys::Listed {
            keys: vec![super::super::Failing {
                replica: "q0".into(),
                key,
            }],
            total: 1,
            errors: vec![],
        };
        let mut html = String::new();
        failing_keys(
            &mut html,
            &failing,
            Some("https://jaeger.example/trace/{trace_id}"),
        );
        assert!(
            html.contains(
                r#"<a href="https://jaeger.example/trace/4bf92f3577b34da6a3ce929d0e0e4736">"#
            ),
            "{html}"
        );
        assert!(html.contains("web/&lt;api&gt;"), "{html}");
        assert!(html.contains("quota &quot;pods&quot; exceeded"), "{html}");

        let mut plain = String::new();
        failing_keys(&mut plain, &failing, None);
        assert!(!plain.contains("<a "), "no template, no link: {plain}");
        let mut denied = String::new();
        failing_keys(&mut denied, &FailingKeys::NotAllowed, None);
        assert!(denied.contains("failing-denied") && !denied.contains("api"));
    }
}
