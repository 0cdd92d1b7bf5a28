//! The routes: discovery (`/apis`, the group, its one resource) and the metric's values,
//! answered as the apiserver answers (JSON, errors as a `meta/v1` Status).

use std::{collections::BTreeMap, sync::Arc, time::SystemTime};

use axum::{
    Router,
    extract::{Path, RawQuery, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use serde_json::{Value, json};
use switchyard_selector::Selector;
use tracing::debug;

use crate::{
    BACKLOG_METRIC, Backlog, CONTROLLER_LABEL, GROUP, GROUP_VERSION, Peers, ShuttingDown, VERSION,
    label_value,
};

/// The longest labelSelector read: an HPA's metric selector names a few controllers, and
/// the apiserver's own URL limit is far above what one needs; a longer one is refused before
/// it is parsed.
const MAX_SELECTOR_BYTES: usize = 4096;

#[derive(Clone, Debug)]
pub(crate) struct ApiState<B> {
    pub backlog: B,
    pub peers: Option<Peers>,
}

/// Keys not done per controller, in the order the controllers were first reported.
#[derive(Debug, Default)]
pub(crate) struct Totals(Vec<(Arc<str>, u64)>);

impl Totals {
    /// Adds `keys` to `controller`'s total (a handful of controllers: a scan is cheapest).
    pub(crate) fn add(&mut self, controller: &str, keys: u64) {
        match self.0.iter_mut().find(|(name, _)| **name == *controller) {
            Some((_, total)) => *total += keys,
            None => self.0.push((Arc::from(controller), keys)),
        }
    }
}

pub(crate) fn router<B: Backlog>(state: ApiState<B>) -> Router {
    Router::new()
        .route("/apis", get(api_group_list))
        .route("/apis/external.metrics.k8s.io", get(api_group))
        .route("/apis/external.metrics.k8s.io/v1beta1", get(api_resources))
        .route(
            "/apis/external.metrics.k8s.io/v1beta1/namespaces/{namespace}/{metric}",
            get(metric_values::<B>),
        )
        .fallback(|| async {
            status(
                StatusCode::NOT_FOUND,
                "NotFound",
                "the external metrics API serves /apis/external.metrics.k8s.io/v1beta1 and \
                 /apis/external.metrics.k8s.io/v1beta1/namespaces/{namespace}/{metric}"
                    .to_owned(),
            )
        })
        .with_state(state)
}

fn group_json() -> Value {
    let version = json!({"groupVersion": GROUP_VERSION, "version": VERSION});
    json!({
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": GROUP,
        "versions": [version],
        "preferredVersion": version,
    })
}

async fn api_group_list() -> Response {
    ok(json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [group_json()]}))
}

async fn api_group() -> Response {
    ok(group_json())
}

async fn api_resources() -> Response {
    ok(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": GROUP_VERSION,
        "resources": [{
            "name": BACKLOG_METRIC,
            "singularName": "",
            "namespaced": true,
            "kind": "ExternalMetricValueList",
            "verbs": ["get"],
        }],
    }))
}

async fn metric_values<B: Backlog>(
    State(state): State<ApiState<B>>,
    Path((namespace, metric)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    if let Err(reason) = validate_dns_label(&namespace) {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!("namespace {namespace:?}: {reason}"),
        );
    }
    if metric != BACKLOG_METRIC {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("external metric {metric:?} not found: this server serves {BACKLOG_METRIC}"),
        );
    }
    let raw_selector = form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .find(|(k, _)| k == "labelSelector")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    if raw_selector.len() > MAX_SELECTOR_BYTES {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!(
                "labelSelector: {} bytes, at most {MAX_SELECTOR_BYTES}",
                raw_selector.len()
            ),
        );
    }
    let selector = match Selector::parse(&raw_selector) {
        Ok(selector) => selector,
        Err(error) => {
            return status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                format!("labelSelector {error}"),
            );
        }
    };
    let Ok(entries) = state.backlog.backlog().await else {
        return status(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            ShuttingDown.to_string(),
        );
    };
    let mut backlog = Totals::default();
    for (controller, keys) in entries {
        backlog.add(&controller, keys);
    }
    if let Some(peers) = &state.peers
        && let Err(message) = peers.add_to(&mut backlog).await
    {
        return status(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            message,
        );
    }
    let timestamp = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    let items: Vec<Value> = backlog
        .0
        .iter()
        .map(|(name, value)| (label_value(name), value))
        .filter(|(label, _)| selector.matches(BTreeMap::from([(CONTROLLER_LABEL, label.as_str())])))
        .map(|(label, value)| {
            json!({
                "metricName": BACKLOG_METRIC,
                "metricLabels": {CONTROLLER_LABEL: label},
                "timestamp": timestamp,
                "value": value.to_string(),
            })
        })
        .collect();
    debug!(%namespace, selector = %raw_selector, items = items.len(), "external metric read");
    ok(json!({
        "kind": "ExternalMetricValueList",
        "apiVersion": GROUP_VERSION,
        "metadata": {},
        "items": items,
    }))
}

fn ok(body: Value) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// A `meta/v1` Status, as the apiserver answers errors.
fn status(code: StatusCode, reason: &str, message: String) -> Response {
    let body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    });
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn validate_dns_label(label: &str) -> Result<(), String> {
    let ok = !label.is_empty()
        && label.len() <= 63
        && label
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !label.starts_with('-')
        && !label.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{label:?} is not a DNS label (1 to 63 lowercase letters, digits or '-', \
             beginning and ending with a letter or digit)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::watch;

    use super::*;
    use crate::Peer;

    /// A queue that reports fixed entries, or is shutting down.
    #[derive(Clone, Debug)]
    struct Fixed(Option<Vec<(usize, u64)>>);

    impl Backlog for Fixed {
        async fn backlog(&self) -> Result<Vec<(Arc<str>, u64)>, ShuttingDown> {
            // Every known controller reported, then the fixed entries by index.
            let mut entries: Vec<(Arc<str>, u64)> =
                CONTROLLERS.iter().map(|c| (Arc::from(*c), 0)).collect();
            for (i, keys) in self.0.clone().ok_or(ShuttingDown)? {
                let name = CONTROLLERS
                    .get(i)
                    .map_or_else(|| format!("example.com/v1/C{i}"), |c| (*c).to_owned());
                entries.push((Arc::from(name), keys));
            }
            Ok(entries)
        }
    }

    const CONTROLLERS: [&str; 2] = ["apps/v1/ReplicaSet", "apps/v1/Deployment"];

    /// Member `q0`'s view of `members`, dialing the others as a queue member does.
    fn peers_of(members: watch::Receiver<Option<Vec<Peer>>>) -> Peers {
        Peers::new(
            members,
            "q0".into(),
            switchyard_testenv::Pki::shared().dialer(switchyard_runtime::Role::Queue),
        )
    }

    fn state(backlog: Fixed, peers: Option<Peers>) -> ApiState<Fixed> {
        ApiState { backlog, peers }
    }

    async fn get(
        state: ApiState<Fixed>,
        namespace: &str,
        metric: &str,
        query: &str,
    ) -> (u16, Value) {
        let response = metric_values(
            State(state),
            Path((namespace.to_owned(), metric.to_owned())),
            RawQuery(Some(query.to_owned())),
        )
        .await;
        let code = response.status().as_u16();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        (code, serde_json::from_slice(&body).unwrap())
    }

    fn values(body: &Value) -> Vec<(String, String)> {
        body["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|item| {
                (
                    item["metricLabels"][CONTROLLER_LABEL]
                        .as_str()
                        .unwrap()
                        .to_owned(),
                    item["value"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect()
    }

    #[tokio::test]
    async fn backlog_per_controller_filtered_by_the_selector() {
        // Entries of one controller add up; a controller that became known while the queue
        // ran (index 7 here) is listed after those reported first.
        let fixed = Fixed(Some(vec![(0, 5), (1, 2), (0, 25), (7, 100)]));
        let (code, body) = get(state(fixed.clone(), None), "switchyard", BACKLOG_METRIC, "").await;
        assert_eq!(code, 200, "{body}");
        assert_eq!(body["kind"], "ExternalMetricValueList");
        assert_eq!(
            values(&body),
            pairs(&[
                ("apps.v1.ReplicaSet", "30"),
                ("apps.v1.Deployment", "2"),
                ("example.com.v1.C7", "100")
            ])
        );
        let (_, body) = get(
            state(fixed.clone(), None),
            "switchyard",
            BACKLOG_METRIC,
            "labelSelector=controller%20notin%20%28apps.v1.ReplicaSet%29",
        )
        .await;
        assert_eq!(
            values(&body),
            pairs(&[("apps.v1.Deployment", "2"), ("example.com.v1.C7", "100")])
        );
        let (_, body) = get(
            state(fixed, None),
            "switchyard",
            BACKLOG_METRIC,
            "labelSelector=controller%3Dapps.v1.Pod",
        )
        .await;
        assert_eq!(values(&body), []);
    }

    #[tokio::test]
    async fn bad_requests_are_a_status_naming_what_is_wrong() {
        let fixed = Fixed(Some(vec![]));
        for (namespace, metric, query, code, says) in [
            (
                "switchyard",
                BACKLOG_METRIC,
                "labelSelector=controller%20in%20(a",
                400,
                "labelSelector \"controller in (a\": unclosed '('",
            ),
            (
                "switchyard",
                BACKLOG_METRIC,
                "labelSelector=a,,b",
                400,
                "labelSelector \"a,,b\": empty requirement at offset 2",
            ),
            (
                "Bad_NS",
                BACKLOG_METRIC,
                "",
                400,
                "namespace \"Bad_NS\": \"Bad_NS\" is not a DNS label",
            ),
            (
                "switchyard",
                BACKLOG_METRIC,
                &format!("labelSelector={}", "a".repeat(4097)),
                400,
                "labelSelector: 4097 bytes, at most 4096",
            ),
            (
                "switchyard",
                "cpu",
                "",
                404,
                "external metric \"cpu\" not found: this server serves switchyard_queue_backlog",
            ),
        ] {
            let (got, body) = get(state(fixed.clone(), None), namespace, metric, query).await;
            assert_eq!(got, code, "{body}");
            assert_eq!(body["kind"], "Status");
            assert_eq!(body["code"], code);
            let message = body["message"].as_str().unwrap();
            assert!(message.starts_with(says), "{message}");
        }
    }

    #[tokio::test]
    async fn unavailable_rather_than_partial() {
        let (code, body) = get(state(Fixed(None), None), "switchyard", BACKLOG_METRIC, "").await;
        assert_eq!(
            (code, body["message"].as_str()),
            (503, Some("the queue is shutting down"))
        );

        // A member that does not know the members yet cannot answer for the whole queue.
        let (_tx, members) = watch::channel(None);
        let peers = peers_of(members);
        let (code, body) = get(
            state(Fixed(Some(vec![])), Some(peers)),
            "switchyard",
            BACKLOG_METRIC,
            "",
        )
        .await;
        assert_eq!(code, 503, "{body}");
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .contains("member list is not known")
        );

        // A member that does not answer makes the whole answer unavailable, naming it.
        let gone = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let (_tx, members) = watch::channel(Some(vec![
            Peer {
                id: "q0".into(),
                address: "127.0.0.1:1".into(),
            },
            Peer {
                id: "q1".into(),
                address: gone.to_string(),
            },
        ]));
        let peers = peers_of(members);
        let (code, body) = get(
            state(Fixed(Some(vec![])), Some(peers)),
            "switchyard",
            BACKLOG_METRIC,
            "",
        )
        .await;
        assert_eq!(code, 503, "{body}");
        let message = body["message"].as_str().unwrap();
        assert!(
            message.starts_with(&format!(
                "queue member q1 at {gone} did not report its backlog"
            )),
            "{message}"
        );

        // Alone in the member list, it answers with its own backlog.
        let (_tx, members) = watch::channel(Some(vec![Peer {
            id: "q0".into(),
            address: "127.0.0.1:1".into(),
        }]));
        let peers = peers_of(members);
        let (code, body) = get(
            state(Fixed(Some(vec![(1, 4)])), Some(peers)),
            "switchyard",
            BACKLOG_METRIC,
            "",
        )
        .await;
        assert_eq!(code, 200, "{body}");
        assert_eq!(
            values(&body),
            pairs(&[("apps.v1.ReplicaSet", "0"), ("apps.v1.Deployment", "4")])
        );
    }
}
