//! The merge of registrations with the configuration file, with hand-built registrations.

use super::*;
use crate::{
    Config, ControllerRef, EventKind, Mapper, NoOwners, Summary, WorkKey,
    config::{Rule, RuleKind},
};

const FILE: &str = r#"
resources:
  - {apiVersion: v1, kind: Pod, metadataOnly: true}
controllers:
  - name: apps/v1/ReplicaSet
    for: {apiVersion: apps/v1, kind: ReplicaSet}
    owns:
      - {apiVersion: v1, kind: Pod}
garbageCollector: {}
"#;
const WIDGET: &str = "example.com/v1/Widget";

fn gvk(api_version: &str, kind: &str) -> Gvk {
    Gvk::parse(api_version, kind).unwrap()
}

fn watch(api_version: &str, kind: &str) -> Watch {
    Watch {
        gvk: Some(gvk(api_version, kind)),
        ..Watch::default()
    }
}

fn metadata(watch: Watch) -> Watch {
    Watch {
        metadata_only: true,
        ..watch
    }
}

/// Widgets that own ConfigMaps and are named by a label on Secrets.
fn widgets() -> ControllerWatches {
    ControllerWatches {
        name: WIDGET.into(),
        reconciles: Some(watch("example.com/v1", "Widget")),
        owns: vec![watch("v1", "ConfigMap")],
        by_label: vec![Watch {
            label: "example.com/widget".into(),
            ..watch("v1", "Secret")
        }],
        by_namespace: vec![],
        by_selector: vec![],
        by_placement: vec![],
        by_name: vec![],
        namespaces: vec![],
    }
}

fn registration(registrant: &str, controllers: Vec<ControllerWatches>) -> Registration {
    Registration::new(registrant.into(), controllers).unwrap()
}

fn watches() -> Watches {
    Watches::new(
        Config::from_yaml(FILE).unwrap(),
        "the configuration file /etc/watcher.yaml",
    )
}

fn kinds(config: &Config) -> Vec<String> {
    config
        .resources
        .iter()
        .map(|r| {
            format!(
                "{}{}",
                r.gvk,
                if r.metadata_only { " (metadata)" } else { "" }
            )
        })
        .collect()
}

fn names(gvks: &[Gvk]) -> Vec<String> {
    gvks.iter().map(Gvk::to_string).collect()
}

fn keys(config: &Config, kind: &str, object: &Summary) -> Vec<String> {
    let resource = config
        .resources
        .iter()
        .position(|r| r.gvk.kind == kind)
        .unwrap();
    let mut out: Vec<WorkKey> = Vec::new();
    Mapper::new(config).keys(
        resource,
        EventKind::Added,
        None,
        object,
        &NoOwners,
        &mut out,
    );
    out.iter()
        .map(|k| format!("{} {}/{}", k.controller, k.namespace, k.name))
        .collect()
}

fn owned(name: &str, owner: (&str, &str, &str)) -> Summary {
    let (api_version, kind, owner) = owner;
    Summary::new(
        "ns",
        name,
        "1",
        None,
        [("example.com/widget", "w1")],
        [],
        Some(ControllerRef {
            api_version: api_version.into(),
            kind: kind.into(),
            name: owner.into(),
            uid: "u".into(),
        }),
    )
}

#[test]
fn a_registration_adds_its_kinds_after_the_files_and_its_end_removes_them() {
    let mut watches = watches();
    let file = watches.effective().clone();
    let (id, change) = watches
        .register(registration("r-0", vec![widgets()]))
        .unwrap();
    assert_eq!(
        names(&change.added),
        ["v1/ConfigMap", "v1/Secret", "example.com/v1/Widget"]
    );
    assert!(change.removed.is_empty() && change.replaced.is_empty());
    assert_eq!(change.rekeyed, [WIDGET]);
    let config = watches.effective();
    assert_eq!(
        kinds(config)[..2],
        ["v1/Pod (metadata)", "apps/v1/ReplicaSet"],
        "the file's resources keep their indices"
    );
    assert_eq!(config.rules[..file.rules.len()], file.rules[..]);
    assert_eq!(
        config.controllers(),
        ["apps/v1/ReplicaSet", WIDGET, "garbage-collector"]
    );
    let cm = owned("cm", ("example.com/v1", "Widget", "w1"));
    assert_eq!(keys(config, "ConfigMap", &cm), [format!("{WIDGET} ns/w1")]);
    assert_eq!(keys(config, "Secret", &cm), [format!("{WIDGET} ns/w1")]);

    let change = watches.unregister(id);
    assert_eq!(
        names(&change.removed),
        ["v1/ConfigMap", "v1/Secret", "example.com/v1/Widget"]
    );
    assert!(change.added.is_empty() && change.rekeyed.is_empty());
    assert_eq!(*watches.effective(), file);
    assert_eq!(watches.unregister(id), Change::default(), "already gone");
}

#[test]
fn replicas_registering_the_same_watches_share_every_rule_once() {
    let mut watches = watches();
    let (first, _) = watches
        .register(registration("r-0", vec![widgets()]))
        .unwrap();
    let once = watches.effective().clone();
    let mut ids = Vec::new();
    for replica in 1..4 {
        let (id, change) = watches
            .register(registration(&format!("r-{replica}"), vec![widgets()]))
            .unwrap();
        assert_eq!(
            change,
            Change::default(),
            "replica {replica} changed something"
        );
        ids.push(id);
    }
    assert_eq!(*watches.effective(), once);
    let cm = owned("cm", ("example.com/v1", "Widget", "w1"));
    assert_eq!(keys(watches.effective(), "ConfigMap", &cm).len(), 1);
    // The first replica goes: the others still need everything.
    assert_eq!(watches.unregister(first), Change::default());
    assert_eq!(watches.registrations(), 3);
    for id in &ids[..2] {
        assert_eq!(watches.unregister(*id), Change::default());
    }
    assert_eq!(watches.unregister(ids[2]).removed.len(), 3);
}

#[test]
fn distinct_watches_of_one_controller_are_merged_and_predicates_or_ed() {
    let mut watches = watches();
    let generation = ControllerWatches {
        reconciles: Some(Watch {
            predicates: vec![Predicate::GenerationChanged],
            ..watch("example.com/v1", "Widget")
        }),
        owns: vec![],
        by_label: vec![],
        by_namespace: vec![],
        ..widgets()
    };
    watches
        .register(registration("old", vec![generation.clone()]))
        .unwrap();
    let labels = ControllerWatches {
        reconciles: Some(Watch {
            predicates: vec![Predicate::LabelsChanged, Predicate::LabelsChanged],
            ..watch("example.com/v1", "Widget")
        }),
        ..widgets()
    };
    let (_, change) = watches.register(registration("new", vec![labels])).unwrap();
    assert_eq!(names(&change.added), ["v1/ConfigMap", "v1/Secret"]);
    assert_eq!(change.rekeyed, [WIDGET]);
    let widget_rules: Vec<&Rule> = watches
        .effective()
        .rules
        .iter()
        .filter(|r| r.controller == WIDGET)
        .collect();
    assert_eq!(widget_rules.len(), 3, "{widget_rules:?}");
    let for_rule = widget_rules
        .iter()
        .find(|r| r.kind == RuleKind::For)
        .unwrap();
    assert_eq!(
        for_rule.predicates,
        [Predicate::GenerationChanged, Predicate::LabelsChanged]
    );
    // A watch with no predicate passes every update: the merged rule does too.
    let (_, change) = watches
        .register(registration("any", vec![generation.clone()]))
        .unwrap();
    assert!(change.rekeyed.is_empty());
    let every = ControllerWatches {
        owns: vec![],
        by_label: vec![],
        by_namespace: vec![],
        ..widgets()
    };
    let (_, change) = watches
        .register(registration("every", vec![every]))
        .unwrap();
    assert_eq!(change.rekeyed, [WIDGET]);
    let for_rule = watches
        .effective()
        .rules
        .iter()
        .find(|r| r.controller == WIDGET && r.kind == RuleKind::For)
        .unwrap();
    assert!(for_rule.predicates.is_empty());
}

#[test]
fn a_kind_is_metadata_only_while_every_user_asks_for_metadata_only() {
    let mut watches = watches();
    let lean = ControllerWatches {
        name: "lean".into(),
        reconciles: Some(metadata(watch("v1", "ConfigMap"))),
        owns: vec![metadata(watch("v1", "Pod"))],
        ..ControllerWatches::default()
    };
    let (lean_id, change) = watches.register(registration("a", vec![lean])).unwrap();
    assert_eq!(names(&change.added), ["v1/ConfigMap"]);
    assert!(
        change.replaced.is_empty(),
        "the file's Pods are metadata-only too"
    );
    assert_eq!(kinds(watches.effective())[2], "v1/ConfigMap (metadata)");

    // Whole ConfigMaps and whole Pods for another controller: both informers replaced.
    let whole = ControllerWatches {
        name: "whole".into(),
        reconciles: Some(watch("v1", "ConfigMap")),
        owns: vec![watch("v1", "Pod")],
        ..ControllerWatches::default()
    };
    let (whole_id, change) = watches.register(registration("b", vec![whole])).unwrap();
    assert_eq!(names(&change.replaced), ["v1/ConfigMap", "v1/Pod"]);
    assert!(change.added.is_empty());
    assert_eq!(
        kinds(watches.effective()),
        ["v1/Pod", "apps/v1/ReplicaSet", "v1/ConfigMap"]
    );
    let change = watches.unregister(whole_id);
    assert_eq!(names(&change.replaced), ["v1/ConfigMap", "v1/Pod"]);
    assert_eq!(
        kinds(watches.effective()),
        [
            "v1/Pod (metadata)",
            "apps/v1/ReplicaSet",
            "v1/ConfigMap (metadata)"
        ]
    );
    assert_eq!(
        names(&watches.unregister(lean_id).removed),
        ["v1/ConfigMap"]
    );
}

#[test]
fn owns_through_caches_the_kind_between_metadata_only_at_its_index() {
    let mut watches = Watches::new(Config::from_yaml("{}").unwrap(), "the file");
    let deployments = ControllerWatches {
        name: "apps/v1/Deployment".into(),
        reconciles: Some(watch("apps/v1", "Deployment")),
        owns: vec![Watch {
            through: Some(gvk("apps/v1", "ReplicaSet")),
            ..watch("v1", "Pod")
        }],
        ..ControllerWatches::default()
    };
    let registration = registration("r", vec![deployments]);
    assert_eq!(
        registration
            .kinds()
            .map(|(g, field)| format!("{g} {field}"))
            .collect::<Vec<_>>(),
        [
            "v1/Pod controllers[0].owns[0].gvk",
            "apps/v1/Deployment controllers[0].reconciles.gvk",
            "apps/v1/ReplicaSet controllers[0].owns[0].through",
        ]
    );
    watches.register(registration).unwrap();
    let config = watches.effective();
    assert_eq!(
        kinds(config),
        [
            "v1/Pod",
            "apps/v1/Deployment",
            "apps/v1/ReplicaSet (metadata)"
        ]
    );
    let through = config
        .rules
        .iter()
        .find_map(|r| match &r.kind {
            RuleKind::Owns { through, .. } => *through,
            _ => None,
        })
        .unwrap();
    assert_eq!(config.resources[through].gvk.kind, "ReplicaSet");
}

#[test]
fn a_controller_the_file_names_must_declare_the_files_watches() {
    let mut watches = watches();
    let same = ControllerWatches {
        name: "apps/v1/ReplicaSet".into(),
        reconciles: Some(watch("apps/v1", "ReplicaSet")),
        owns: vec![metadata(watch("v1", "Pod"))],
        ..ControllerWatches::default()
    };
    let (_, change) = watches
        .register(registration("r-0", vec![same.clone()]))
        .unwrap();
    assert_eq!(change, Change::default());
    assert_eq!(watches.effective(), watches.file());

    let other = ControllerWatches {
        owns: vec![watch("v1", "Secret")],
        ..same
    };
    let error = watches
        .register(registration("r-1", vec![widgets(), other]))
        .unwrap_err();
    assert!(matches!(error, WatchesError::Conflict { .. }));
    assert_eq!(
        error.to_string(),
        "controllers[1]: \"apps/v1/ReplicaSet\" of registrant \"r-1\" declares other watches \
         than controllers[0] of the configuration file /etc/watcher.yaml: only in the file: \
         owns v1/Pod; only in the registration: owns v1/Secret"
    );
    assert_eq!(
        watches.registrations(),
        1,
        "nothing of the refused one is kept"
    );
    assert_eq!(watches.effective(), watches.file());

    let collector = ControllerWatches {
        name: "garbage-collector".into(),
        ..widgets()
    };
    let error = watches
        .check(&registration("r-2", vec![collector]))
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "controllers[0].name: \"garbage-collector\" is the garbage collector's \
         (garbageCollector.controller of the configuration file /etc/watcher.yaml)"
    );
}

#[test]
fn predicates_are_part_of_the_watches_compared_with_the_file() {
    let watches = watches();
    let filtered = ControllerWatches {
        name: "apps/v1/ReplicaSet".into(),
        reconciles: Some(Watch {
            predicates: vec![Predicate::GenerationChanged],
            ..watch("apps/v1", "ReplicaSet")
        }),
        owns: vec![watch("v1", "Pod")],
        ..ControllerWatches::default()
    };
    let error = watches
        .check(&registration("r", vec![filtered]))
        .unwrap_err()
        .to_string();
    assert!(
        error.ends_with(
            "only in the file: for apps/v1/ReplicaSet; only in the registration: \
             for apps/v1/ReplicaSet [GenerationChanged]"
        ),
        "{error}"
    );
}

#[test]
fn replicas_batching_a_watch_differently_get_the_shorter_period() {
    let batched = |ms: Option<u64>| ControllerWatches {
        owns: vec![Watch {
            batch_period: ms.map(Duration::from_millis),
            ..watch("v1", "ConfigMap")
        }],
        ..widgets()
    };
    let period = |watches: &Watches| {
        watches
            .effective()
            .rules
            .iter()
            .find(|r| r.controller == WIDGET && matches!(r.kind, RuleKind::Owns { .. }))
            .unwrap()
            .batch_period
    };
    let mut watches = watches();
    let (slow, _) = watches
        .register(registration("a", vec![batched(Some(500))]))
        .unwrap();
    assert_eq!(period(&watches), Some(Duration::from_millis(500)));
    let (_, change) = watches
        .register(registration("b", vec![batched(Some(100))]))
        .unwrap();
    assert_eq!(change.rekeyed, [WIDGET]);
    assert_eq!(period(&watches), Some(Duration::from_millis(100)));
    let (now, _) = watches
        .register(registration("c", vec![batched(None)]))
        .unwrap();
    assert_eq!(period(&watches), None, "one replica wants its keys at once");
    watches.unregister(now);
    watches.unregister(slow);
    assert_eq!(period(&watches), Some(Duration::from_millis(100)));
    let error = Registration::new("r".into(), vec![batched(Some(61_000))])
        .unwrap_err()
        .to_string();
    assert_eq!(
        error,
        "controllers[0].owns[0].batch_period: 1m 1s is longer than 1m"
    );
}

#[test]
fn malformed_registrations_name_the_field() {
    let error = |registrant: &str, controllers: Vec<ControllerWatches>| {
        Registration::new(registrant.into(), controllers)
            .unwrap_err()
            .to_string()
    };
    let with = |f: fn(&mut ControllerWatches)| {
        let mut c = widgets();
        f(&mut c);
        error("r", vec![c])
    };
    assert_eq!(error("", vec![widgets()]), "registrant: required");
    assert_eq!(error("r", vec![]), "controllers: at least one is required");
    assert_eq!(
        error("r", vec![widgets(), widgets()]),
        "controllers[1].name: \"example.com/v1/Widget\" is already used by controllers[0]"
    );
    assert!(error(&"r".repeat(254), vec![widgets()]).starts_with("registrant: is 254"));
    assert_eq!(with(|c| c.name.clear()), "controllers[0].name: required");
    assert!(with(|c| c.reconciles = None).starts_with("controllers[0].reconciles: required"));
    assert_eq!(
        with(|c| c.owns.push(Watch::default())),
        "controllers[0].owns[1].gvk: required"
    );
    let kind = |c: &mut ControllerWatches| {
        c.owns.push(watch("v1", "Pod"));
        c.owns[1].gvk.as_mut().unwrap().kind = "pod".into();
    };
    assert_eq!(
        with(kind),
        "controllers[0].owns[1].gvk.kind: \"pod\" must be a CamelCase name such as ReplicaSet"
    );
    assert_eq!(
        with(|c| c
            .reconciles
            .as_mut()
            .unwrap()
            .gvk
            .as_mut()
            .unwrap()
            .version
            .clear()),
        "controllers[0].reconciles.gvk.version: required"
    );
    assert!(
        with(|c| c.by_label[0].gvk.as_mut().unwrap().group = "Example.com".into())
            .starts_with("controllers[0].by_label[0].gvk.group: \"Example.com\"")
    );
    assert_eq!(
        with(|c| c.by_label[0].label.clear()),
        "controllers[0].by_label[0].label: required: the label whose value names the object to key"
    );
    assert_eq!(
        with(|c| c.owns[0].label = "x".into()),
        "controllers[0].owns[0].label: only a by_label watch names a label"
    );
    assert_eq!(
        with(|c| c.reconciles.as_mut().unwrap().through = Some(gvk("v1", "Pod"))),
        "controllers[0].reconciles.through: only an owns watch maps through an owner"
    );
    assert!(
        with(|c| c.owns[0].through = Some(gvk("v1", "ConfigMap")))
            .starts_with("controllers[0].owns[0].through: v1/ConfigMap is the owned kind itself")
    );
    assert!(
        with(|c| c.owns[0].through = Some(gvk("example.com/v1", "Widget"))).starts_with(
            "controllers[0].owns[0].through: example.com/v1/Widget is the reconciled kind"
        )
    );
    assert_eq!(
        with(|c| c.owns = vec![watch("v1", "Pod"); MAX_WATCHES + 1]),
        "controllers[0].owns: 101 given; at most 100"
    );
    assert_eq!(
        with(|c| c.owns[0].label_selector = "tier in web".into()),
        "controllers[0].owns[0].label_selector: \"tier in web\": \"tier in web\": the values of \
         in must be in parentheses, as in \"key in (a,b)\""
    );
    assert_eq!(
        with(|c| c.namespaces = vec!["team-a".into(), "".into()]),
        "controllers[0].namespaces[1]: \"\" is not a namespace name (a DNS label of at most 63 \
         characters)"
    );
    assert_eq!(
        with(|c| c.by_namespace.push(watch("v1", "ConfigMap"))),
        "controllers[0].by_namespace[0]: maps to the object's Namespace, so the reconciled kind \
         must be v1/Namespace, not example.com/v1/Widget"
    );
}

#[test]
fn a_namespace_mapping_keys_the_namespace_of_the_changed_object() {
    let accounts = ControllerWatches {
        name: "serviceaccount".into(),
        reconciles: Some(watch("v1", "Namespace")),
        owns: vec![],
        by_label: vec![],
        by_namespace: vec![metadata(watch("v1", "ServiceAccount"))],
        by_selector: vec![],
        by_placement: vec![],
        by_name: vec![],
        namespaces: vec![],
    };
    let mut watches = watches();
    watches.register(registration("r", vec![accounts])).unwrap();
    let config = watches.effective();
    let account = Summary::new("team-a", "default", "1", None, [], [], None);
    assert_eq!(
        keys(config, "ServiceAccount", &account),
        ["serviceaccount /team-a"]
    );
    let namespace = Summary::new("", "team-a", "1", None, [], [], None);
    assert_eq!(
        keys(config, "Namespace", &namespace),
        ["serviceaccount /team-a"]
    );
}

#[test]
fn a_registration_needs_every_kind_it_names_granted_to_its_account() {
    let config = Config::from_yaml(&format!(
        "{FILE}registrations:
  - serviceAccount: widgets-switchyard-reconciler
    kinds:
      - {{apiVersion: example.com/v1, kind: Widget, objects: full}}
      - {{apiVersion: v1, kind: ConfigMap}}
"
    ))
    .unwrap();
    let granted = "widgets-switchyard-reconciler";
    let check = |controllers: Vec<ControllerWatches>, account: &str| {
        registration("widgets-0", controllers)
            .check_access(&config, account)
            .map_err(|denied| denied.to_string())
    };
    let metadata_maps = ControllerWatches {
        owns: vec![metadata(watch("v1", "ConfigMap"))],
        ..widgets()
    };
    // Whole ConfigMaps, granted as metadata.
    assert_eq!(
        check(vec![widgets()], granted).unwrap_err(),
        "controllers[0].owns[0].gvk: v1/ConfigMap is granted to service account \
         \"widgets-switchyard-reconciler\" as metadata only; watch it with metadata_only, or \
         grant it objects: full"
    );
    // Secrets, named by a label watch, granted not at all.
    assert_eq!(
        check(vec![metadata_maps.clone()], granted).unwrap_err(),
        "controllers[0].by_label[0].gvk: v1/Secret is not granted to service account \
         \"widgets-switchyard-reconciler\" (the watcher configuration's registrations)"
    );
    let allowed = ControllerWatches {
        by_label: vec![],
        by_namespace: vec![],
        by_selector: vec![],
        by_placement: vec![],
        by_name: vec![],
        ..metadata_maps
    };
    assert_eq!(check(vec![allowed.clone()], granted), Ok(()));
    // The kind between the owned and the owner needs a grant too, if only as metadata.
    let through = ControllerWatches {
        owns: vec![Watch {
            through: Some(gvk("apps/v1", "Deployment")),
            ..metadata(watch("v1", "ConfigMap"))
        }],
        ..allowed.clone()
    };
    assert_eq!(
        check(vec![through], granted).unwrap_err(),
        "controllers[0].owns[0].through: apps/v1/Deployment is not granted to service account \
         \"widgets-switchyard-reconciler\" (the watcher configuration's registrations)"
    );
    // Another account has none of these grants.
    assert_eq!(
        check(vec![allowed], "switchyard-reconciler").unwrap_err(),
        "controllers[0].owns[0].gvk: v1/ConfigMap is not granted to service account \
         \"switchyard-reconciler\" (the watcher configuration's registrations)"
    );
    // The file's kinds are any account's, as the file caches them: Pods as metadata.
    let pods = |pods: Watch| ControllerWatches {
        name: "apps/v1/ReplicaSet".into(),
        reconciles: Some(watch("apps/v1", "ReplicaSet")),
        owns: vec![pods],
        by_label: vec![],
        by_namespace: vec![],
        by_selector: vec![],
        by_placement: vec![],
        by_name: vec![],
        namespaces: vec![],
    };
    assert_eq!(
        check(
            vec![pods(metadata(watch("v1", "Pod")))],
            "any-switchyard-reconciler"
        ),
        Ok(())
    );
    assert!(
        check(vec![pods(watch("v1", "Pod"))], "any-switchyard-reconciler")
            .unwrap_err()
            .starts_with("controllers[0].owns[0].gvk: v1/Pod is granted to service account")
    );
}

#[test]
fn watches_of_one_kind_with_other_label_selectors_are_rules_of_their_own() {
    let mut watches = watches();
    let selecting = |selector: &str| ControllerWatches {
        owns: vec![Watch {
            label_selector: selector.into(),
            ..watch("v1", "ConfigMap")
        }],
        by_label: vec![],
        ..widgets()
    };
    watches
        .register(registration("a", vec![selecting("tier=web")]))
        .unwrap();
    watches
        .register(registration("b", vec![selecting(" tier=api ")]))
        .unwrap();
    let owns: Vec<Option<&str>> = watches
        .effective()
        .rules
        .iter()
        .filter(|r| r.controller == WIDGET && matches!(r.kind, RuleKind::Owns { .. }))
        .map(|r| r.label_selector.as_deref())
        .collect();
    assert_eq!(owns, [Some("tier=api"), Some("tier=web")]);
}

#[test]
fn registrations_of_one_controller_in_other_namespaces_add_up() {
    let mut watches = watches();
    let scoped = |namespaces: &[&str]| ControllerWatches {
        namespaces: namespaces.iter().map(|n| n.to_string()).collect(),
        ..widgets()
    };
    watches
        .register(registration("a", vec![scoped(&["team-b", "team-a"])]))
        .unwrap();
    watches
        .register(registration(
            "b",
            vec![scoped(&["team-a", "team-b", "team-a"])],
        ))
        .unwrap();
    watches
        .register(registration("c", vec![scoped(&["team-c"])]))
        .unwrap();
    let mut fors: Vec<Vec<String>> = watches
        .effective()
        .rules
        .iter()
        .filter(|r| r.controller == WIDGET && r.kind == RuleKind::For)
        .map(|r| r.namespaces.clone())
        .collect();
    fors.sort();
    assert_eq!(fors, [vec!["team-a", "team-b"], vec!["team-c"]]);
}
