//! The deployment files (issue 22): the systemd unit passes `systemd-analyze verify`, with its
//! ExecStart pointed at the roced this build made (the unit names /usr/local/bin/roced, where
//! its install steps put it).

use std::path::Path;
use std::process::Command;

const UNIT: &str = "roced@.service";

/// `systemd-analyze verify` of `text` as roced@a.service: its exit status and what it printed.
fn verify(text: &str, tag: &str) -> (bool, String) {
    let dir = std::env::temp_dir().join(format!("ferroce-unit-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(UNIT), text).unwrap();
    let r = run_checker(
        "systemd-analyze",
        &["verify"],
        &[dir.join("roced@a.service")],
    );
    let _ = std::fs::remove_dir_all(&dir);
    r
}

#[test]
fn the_systemd_unit_passes_systemd_analyze_verify() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/systemd")
        .join(UNIT);
    let unit = std::fs::read_to_string(&path).unwrap();
    assert!(
        unit.contains("ExecStart=/usr/local/bin/roced --config /etc/ferroce/%i.toml"),
        "{unit}"
    );
    let here = unit.replace("/usr/local/bin/roced", env!("CARGO_BIN_EXE_roced"));
    // Clean: no error, and no warning either (systemd-analyze exits 0 on unknown keys).
    let (ok, said) = verify(&here, "good");
    assert!(ok && said.trim().is_empty(), "{}: {said}", path.display());
    // The check is real: a misspelt key is reported, a missing binary fails.
    let (_, said) = verify(&here.replace("LockPersonality=", "LockPersonalty="), "typo");
    assert!(said.contains("Unknown key"), "{said}");
    let (ok, _) = verify(
        &unit.replace("/usr/local/bin/roced", "/nonexistent/roced"),
        "gone",
    );
    assert!(!ok, "a unit whose binary is missing verified");
}

/// deploy/kubernetes/, the manifests an operator applies (`kubectl apply -k`).
fn manifests() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes")
}

/// A checker's exit status and output on `files`.
fn run_checker(cmd: &str, args: &[&str], files: &[std::path::PathBuf]) -> (bool, String) {
    let o = Command::new(cmd)
        .args(args)
        .args(files)
        .output()
        .unwrap_or_else(|e| panic!("{cmd} (scripts/setup.sh installs it): {e}"));
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.success(), said)
}

#[test]
fn the_kubernetes_manifests_pass_the_api_schemas() {
    let dir = manifests();
    let kustomization = std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap();
    let listed: Vec<&str> = kustomization
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- "))
        .collect();
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    on_disk.sort();
    let mut sorted = listed.clone();
    sorted.sort();
    assert_eq!(sorted, on_disk, "kustomization.yaml lists every manifest");

    // The API's own kinds, strictly (unknown fields fail), against Kubernetes 1.37's schemas.
    let core: Vec<_> = ["namespace", "secret", "configmap", "daemonset", "service"]
        .iter()
        .map(|f| dir.join(format!("{f}.yaml")))
        .collect();
    let (ok, said) = run_checker("kubernetes-validate", &["--strict"], &core);
    assert!(ok, "{said}");
    assert_eq!(
        said.matches(" passed for resource ").count(),
        core.len(),
        "{said}"
    );
    // The ServiceMonitor against the Prometheus Operator's CRD schema.
    let sm = [dir.join("servicemonitor.yaml")];
    let (ok, said) = run_checker("node", &[NODE_CHECK], &sm);
    assert!(ok && said.contains("passed ServiceMonitor/roced"), "{said}");
    // NetworkAttachmentDefinition has no published schema to check against: its one field is
    // a CNI config, which must be JSON naming a plugin.
    let nad = std::fs::read_to_string(dir.join("networks.yaml")).unwrap();
    let cni = nad.split("config: |").nth(1).expect("spec.config").trim();
    assert!(
        cni.starts_with('{') && cni.contains("\"cniVersion\"") && cni.contains("\"type\""),
        "{cni}"
    );

    // What the DaemonSet promises: Guaranteed QoS with whole CPUs, hugepages requested as
    // limited, the health probe, the config and token mounted.
    let ds = std::fs::read_to_string(dir.join("daemonset.yaml")).unwrap();
    for want in [
        "cpu: \"2\"",
        "hugepages-2Mi: 1Gi",
        "medium: HugePages",
        "path: /v1/health",
        "maxUnavailable: 1",
        "name: roced-config",
        "secretName: roced-api",
    ] {
        assert!(ds.contains(want), "daemonset.yaml lacks {want}");
    }
    let cm = std::fs::read_to_string(dir.join("configmap.yaml")).unwrap();
    assert!(
        cm.contains("lcores = \"auto\"")
            && cm.contains("token_file = \"/etc/ferroce-token/token\"")
    );

    // The checks are real: a misspelt field and a wrong type are refused.
    let tmp = std::env::temp_dir().join(format!("ferroce-k8s-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let bad_ds = tmp.join("daemonset.yaml");
    std::fs::write(&bad_ds, ds.replace("readinessProbe:", "readinessProbes:")).unwrap();
    let (ok, said) = run_checker("kubernetes-validate", &["--strict"], &[bad_ds]);
    assert!(!ok && said.contains("readinessProbes"), "{said}");
    let bad_sm = tmp.join("servicemonitor.yaml");
    let text = std::fs::read_to_string(&sm[0]).unwrap();
    std::fs::write(&bad_sm, text.replace("port: api", "port: 7470")).unwrap();
    let (ok, said) = run_checker("node", &[NODE_CHECK], &[bad_sm]);
    assert!(!ok && said.contains("port must be string"), "{said}");
    let _ = std::fs::remove_dir_all(&tmp);
}

/// The Prometheus Operator CRD check (tests/deploy/crd_check.mjs).
const NODE_CHECK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/deploy/crd_check.mjs");

#[test]
fn the_kubernetes_config_is_one_roced_takes() {
    // The ConfigMap's roced.toml parses and checks as roced would read it, but for what only
    // the pod has (the Multus port, its CPUs and the token file).
    let cm = std::fs::read_to_string(manifests().join("configmap.yaml")).unwrap();
    let toml: String = cm
        .split("roced.toml: |\n")
        .nth(1)
        .expect("data.roced.toml")
        .lines()
        .map(|l| l.strip_prefix("    ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    let c = controlplane::config::Config::parse(&toml, "configmap.yaml").unwrap();
    assert_eq!(c.dataplane.lcores, controlplane::config::Lcores::Auto);
    assert_eq!(c.api.token_file, "/etc/ferroce-token/token");
    assert_eq!(c.api.listen, "0.0.0.0:7470");
}
