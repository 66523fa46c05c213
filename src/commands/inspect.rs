//! `meshca inspect FILE`: decode a PEM certificate, chain or bundle.

use std::process::ExitCode;

use anyhow::Context;

use crate::cli::{InspectArgs, Output};
use crate::InvalidInput;

pub fn run(args: InspectArgs) -> anyhow::Result<ExitCode> {
    let data = meshca_files::read(
        &args.file,
        meshca_files::PEM_FILE_BYTES,
        meshca_files::PEM_FILE_BOUND,
    )
    .with_context(|| format!("cannot read {}", args.file.display()))?;
    let certs = meshca_ca::inspect_pem(&data)
        .map_err(|e| anyhow::Error::new(InvalidInput(format!("{}: {e}", args.file.display()))))?;
    match args.output {
        Output::Json => super::print_json(&certs)?,
        Output::Human => {
            for (i, c) in certs.iter().enumerate() {
                if i > 0 {
                    println!();
                }
                println!("certificate {} of {}", i + 1, certs.len());
                let ids = if c.spiffe_ids.is_empty() {
                    "(none)".to_owned()
                } else {
                    c.spiffe_ids.join(", ")
                };
                println!("  SPIFFE ID:   {ids}");
                println!("  subject:     {}", c.subject);
                println!("  issuer:      {}", c.issuer);
                println!("  serial:      {}", c.serial);
                println!("  valid:       {} to {}", c.not_before, c.not_after);
                println!("  key:         {}", c.key);
                println!("  CA:          {}", if c.is_ca { "yes" } else { "no" });
                println!("  sha256:      {}", c.fingerprint_sha256);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
