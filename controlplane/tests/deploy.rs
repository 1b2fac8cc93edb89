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
    let o = Command::new("systemd-analyze")
        .arg("verify")
        .arg(dir.join("roced@a.service"))
        .output()
        .expect("systemd-analyze (Debian's systemd package) runs");
    let _ = std::fs::remove_dir_all(&dir);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.success(), said)
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
