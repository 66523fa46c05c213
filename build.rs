//! Names the commit the binary is built from, for `meshca --version`: `MESHCA_COMMIT` when set (a build
//! from a source archive or in a container without the repository), else what git says of `HEAD`, else
//! `unknown`.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (out.status.success() && !text.is_empty()).then(|| text.to_owned())
}

fn main() {
    println!("cargo:rerun-if-env-changed=MESHCA_COMMIT");
    let commit = match std::env::var("MESHCA_COMMIT") {
        Ok(commit) if !commit.trim().is_empty() => commit.trim().to_owned(),
        _ => {
            // Built again when HEAD moves: HEAD itself, and the branch it names.
            if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
                println!("cargo:rerun-if-changed={dir}/HEAD");
                if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
                    println!("cargo:rerun-if-changed={dir}/{branch}");
                }
                println!("cargo:rerun-if-changed={dir}/packed-refs");
            }
            git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".to_owned())
        }
    };
    println!("cargo:rustc-env=MESHCA_COMMIT={commit}");
}
