//! `meshca validate`: check settings and resource files; print every error.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::SystemTime;

use meshca_keystore::MemoryKeystore;

use crate::cli::{Output, ValidateArgs};
use meshca_control::{check_world, CaSource, UpdateError};

#[derive(serde::Serialize)]
struct Report {
    valid: bool,
    directories: Vec<PathBuf>,
    errors: Vec<UpdateError>,
}

pub fn run(args: ValidateArgs) -> anyhow::Result<ExitCode> {
    let mut errors = Vec::new();
    let settings =
        match meshca_config::Settings::load(args.config.config.as_deref(), super::process_env()) {
            Ok(s) => Some(s),
            Err(e) => {
                errors.push(UpdateError {
                    file: args
                        .config
                        .config
                        .as_ref()
                        .map_or("(environment)".into(), |p| p.display().to_string()),
                    resource: "settings".into(),
                    field: String::new(),
                    message: e.to_string(),
                });
                None
            }
        };
    let dirs: Vec<PathBuf> = if args.dirs.is_empty() {
        settings.iter().map(|s| s.resources.clone()).collect()
    } else {
        args.dirs.clone()
    };
    if let Some(settings) = &settings {
        for dir in &dirs {
            let (resources, parse_errors) =
                meshca_config::load_dir_lenient(dir, &settings.limits.load());
            // Validation must not create CAs in the daemon's data directory: generated CAs go to memory.
            let keystore = MemoryKeystore::new();
            let src = CaSource {
                keystore: &keystore,
                settings,
                previous: None,
                now: SystemTime::now(),
            };
            if let Err(mut errs) = check_world(resources, parse_errors, &src) {
                errors.append(&mut errs);
            }
        }
    }
    let valid = errors.is_empty();
    match args.output {
        Output::Json => super::print_json(&Report {
            valid,
            directories: dirs,
            errors,
        })?,
        Output::Human => {
            for e in &errors {
                eprintln!("{e}");
            }
            if valid {
                let names: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
                println!("valid: settings and {}", names.join(", "));
            } else {
                eprintln!("{} error(s); nothing would be applied", errors.len());
            }
        }
    }
    Ok(if valid {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    })
}
