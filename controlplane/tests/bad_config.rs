//! Bad configuration fails at start with one clear message naming the field, and a non-zero
//! exit, before anything is started.

mod common;
use common::*;
use std::process::Command;

const GOOD: &str = r#"[eal]
file_prefix = "ferroce-t-bad"
[dataplane]
lcores = [1]
[[ports]]
device = "net_null0"
addresses = ["10.5.0.1/24"]
"#;

fn run_with(config: &str, wrap: Option<&str>) -> (i32, String) {
    let dir = tmpdir(&format!("badcfg-{}", rand_suffix()));
    let path = dir.join(format!("c{}.toml", rand_suffix()));
    std::fs::write(&path, config).unwrap();
    let out = match wrap {
        Some(w) => sh_out(&format!("{w} {ROCED} --check --config {}", path.display())),
        None => Command::new(ROCED)
            .args(["--check", "--config"])
            .arg(&path)
            .output()
            .unwrap(),
    };
    let _ = std::fs::remove_dir_all(&dir);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

fn assert_rejected(config: &str, wrap: Option<&str>, field: &str, words: &str) {
    let (code, stderr) = run_with(config, wrap);
    assert_eq!(code, 2, "expected exit 2 for {field}, got {code}: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "want one message, got: {stderr}");
    assert!(
        lines[0].contains(field),
        "message does not name {field}: {}",
        lines[0]
    );
    assert!(
        lines[0].contains(words),
        "message lacks {words:?}: {}",
        lines[0]
    );
}

#[test]
fn the_good_config_is_accepted() {
    let (code, stderr) = run_with(GOOD, None);
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn unknown_vdev_is_named() {
    assert_rejected(
        &GOOD.replace("net_null0", "net_bogus0"),
        None,
        "ports[0].device",
        "unknown vdev driver",
    );
}

#[test]
fn overlapping_lcores_are_named() {
    assert_rejected(
        &GOOD.replace("lcores = [1]", "lcores = [1, 1]"),
        None,
        "dataplane.lcores[1]",
        "overlap",
    );
}

#[test]
fn bad_address_is_named() {
    assert_rejected(
        &GOOD.replace("10.5.0.1/24", "10.5.0.999/24"),
        None,
        "ports[0].addresses[0]",
        "not an IPv4 or IPv6",
    );
}

#[test]
fn unknown_field_and_bad_toml_are_named() {
    assert_rejected(
        &format!("{GOOD}speed = 5\n"),
        None,
        "speed",
        "unknown field",
    );
    assert_rejected("[eal\n", None, "config", "TOML");
}

#[test]
fn missing_file_is_named() {
    let out = Command::new(ROCED)
        .args(["--config", "/nonexistent/ferroce.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/ferroce.toml"));
}

#[test]
fn no_hugepages_is_named() {
    require_root();
    // A private mount namespace where /proc/meminfo reports no free hugepages: the real check,
    // on a machine that looks like one without hugepages, changing nothing outside.
    let dir = tmpdir("nohuge");
    let fake = dir.join("meminfo");
    let real = std::fs::read_to_string("/proc/meminfo").unwrap();
    let faked: String = real
        .lines()
        .map(|l| {
            if l.starts_with("HugePages_Free:") {
                "HugePages_Free:        0".to_string()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&fake, faked + "\n").unwrap();
    let wrap = format!(
        "unshare -m sh -c 'mount --bind {} /proc/meminfo && exec \"$0\" \"$@\"'",
        fake.display()
    );
    assert_rejected(GOOD, Some(&wrap), "eal.hugepages", "no free hugepages");
    // And without hugepages it is accepted.
    let (code, stderr) = run_with(
        &GOOD.replace("[eal]\n", "[eal]\nhugepages = false\n"),
        Some(&wrap),
    );
    assert_eq!(code, 0, "{stderr}");
}
