//! Python packages from PyPI that tests check waitd against, each in a
//! virtualenv of its own under the tests' scratch directory, made once.

use std::path::PathBuf;
use std::process::Command;

/// A Python that can run `import`: the one `env_var` names, or the virtualenv
/// `dir` under the tests' scratch directory, made with `package` when missing.
/// `needs` completes "the test needs …" in the error when it cannot be made.
pub fn python_with(env_var: &str, dir: &str, package: &str, import: &str, needs: &str) -> PathBuf {
    if let Ok(p) = std::env::var(env_var) {
        return PathBuf::from(p);
    }
    let venv = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(dir);
    let python = venv.join("bin/python");
    let has = |p: &PathBuf| {
        Command::new(p)
            .args(["-c", import])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if has(&python) {
        return python;
    }
    // --clear: a virtualenv left half made by an interrupted run is made again.
    let made = Command::new("python3")
        .args(["-m", "venv", "--clear"])
        .arg(&venv)
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        made,
        "the test needs {needs} (Debian: apt-get install python3 python3-venv), or {env_var} naming a Python that has the {package} package"
    );
    let installed = Command::new(venv.join("bin/pip"))
        .args(["install", "-q", "--disable-pip-version-check", package])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        installed && has(&python),
        "could not install {package} from PyPI into {}",
        venv.display()
    );
    python
}
