//! What packages install beside the binary, generated from the command line's definition: shell
//! completions (`meshca completions SHELL`) and man pages (`meshca manpages DIR`).

use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use clap::CommandFactory;

use crate::cli::{Cli, CompletionsArgs, ManpagesArgs};

/// `meshca completions SHELL`: the script on stdout (a reader that stops early is no error).
pub fn completions(args: CompletionsArgs) -> anyhow::Result<ExitCode> {
    let mut command = Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, "meshca", &mut script);
    match std::io::stdout().write_all(&script) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(e).context("cannot write the script")
        }
        _ => Ok(ExitCode::SUCCESS),
    }
}

/// `meshca manpages DIR`: `meshca.1` and one page per command, `meshca-<command>[-<subcommand>].1`,
/// hidden commands left out.
pub fn manpages(args: ManpagesArgs) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("cannot create {}", args.dir.display()))?;
    let mut command = Cli::command();
    command.build();
    let written = write_pages(&command, "meshca", &args.dir)?;
    eprintln!("wrote {written} man pages into {}", args.dir.display());
    Ok(ExitCode::SUCCESS)
}

/// Writes the page of `command` as `name.1`, then its subcommands' as `name-<sub>.1`; how many.
fn write_pages(command: &clap::Command, name: &str, dir: &Path) -> anyhow::Result<usize> {
    let page = command
        .clone()
        .name(name.to_owned())
        .display_name(name.to_owned());
    let mut roff = Vec::new();
    clap_mangen::Man::new(page)
        .render(&mut roff)
        .with_context(|| format!("cannot render the man page of {name}"))?;
    let path = dir.join(format!("{name}.1"));
    std::fs::write(&path, roff).with_context(|| format!("cannot write {}", path.display()))?;
    let mut written = 1;
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        if sub.get_name() == "help" {
            continue;
        }
        written += write_pages(sub, &format!("{name}-{}", sub.get_name()), dir)?;
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_visible_command_gets_a_page_naming_it() {
        let dir = tempfile::tempdir().expect("a directory");
        manpages(ManpagesArgs {
            dir: dir.path().to_owned(),
        })
        .expect("written");
        for page in [
            "meshca.1",
            "meshca-serve.1",
            "meshca-bundle-show.1",
            "meshca-agent.1",
        ] {
            let text = std::fs::read_to_string(dir.path().join(page))
                .unwrap_or_else(|e| panic!("{page}: {e}"));
            let name = page.trim_end_matches(".1");
            assert!(text.contains(".TH "), "{page}: a roff title");
            assert!(text.contains(name), "{page} names {name}");
        }
        assert!(
            !dir.path().join("meshca-manpages.1").exists(),
            "hidden commands have no page"
        );
    }
}
