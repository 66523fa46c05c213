//! `meshca drill` end to end, small: each scenario must see the failures the ordering gate prevents
//! when the gate is off, and none when it is on; the staged migrations none either way. Assertions are
//! on outcomes, never timings.

mod common;

use common::Env;
use serde_json::Value;

/// A size that still makes every proxy pair meet during the rotation window.
const ARGS: [&str; 8] = [
    "--proxies",
    "12",
    "--handshakes",
    "1500",
    "--seed",
    "3",
    "--output",
    "json",
];

fn drill_with(scenario: &str, gate: &str, more: &[&str]) -> (common::Run, Value) {
    let env = Env::new();
    let mut args = vec!["drill", scenario, "--gate", gate];
    args.extend(ARGS);
    args.extend(more);
    let run = env.cli(&args);
    let report = run.json();
    (run, report)
}

fn drill(gate: &str) -> (common::Run, Value) {
    drill_with("ca-rotation", gate, &[])
}

/// A clean run: exit 0, no failed handshake, no NACK, converged, the phases named.
fn assert_clean(run: &common::Run, report: &Value, change: &str) {
    assert_eq!(run.code(), Some(0), "{run}");
    assert_eq!(report["ok"], true, "{run}");
    assert_eq!(total(report, "failed"), 0, "{run}");
    assert!(total(report, "handshakes") >= 1500, "{run}");
    assert_eq!(phase_names(report), ["steady", change, "converged"]);
    assert!(report["converge_seconds"].is_number(), "{run}");
    assert_eq!(report["nacks"], 0, "{run}");
}

/// Failures only during the change, each naming who rejected whom and why, and exit 1.
fn assert_breaks(run: &common::Run, report: &Value, reason: &str) {
    assert_eq!(run.code(), Some(1), "{run}");
    assert_eq!(report["ok"], false, "{run}");
    assert_eq!(report["phases"][0]["failed"], 0, "steady is steady: {run}");
    let change = &report["phases"][1];
    assert!(change["failed"].as_u64().unwrap_or(0) > 0, "{run}");
    let failures = change["failures"].as_array().expect("a list");
    assert!(
        failures.iter().any(|f| f
            .as_str()
            .is_some_and(|f| f.contains("rejected") && f.contains(reason))),
        "{run}"
    );
    assert_eq!(
        report["phases"][2]["failed"], 0,
        "converged is clean: {run}"
    );
}

fn total(report: &Value, field: &str) -> u64 {
    report["phases"]
        .as_array()
        .expect("phases is a list")
        .iter()
        .map(|p| p[field].as_u64().expect("a count"))
        .sum()
}

fn phase_names(report: &Value) -> Vec<&str> {
    report["phases"]
        .as_array()
        .expect("phases is a list")
        .iter()
        .map(|p| p["name"].as_str().expect("a name"))
        .collect()
}

#[test]
fn without_the_gate_the_drill_reports_failed_handshakes_and_exits_1() {
    let (run, report) = drill("off");
    assert_eq!(run.code(), Some(1), "{run}");
    assert_eq!(report["scenario"], "ca-rotation");
    assert_eq!(report["gate"], false);
    assert_eq!(report["proxies"], 12);
    assert_eq!(report["ok"], false, "{run}");
    assert_eq!(phase_names(&report), ["steady", "rotation", "converged"]);
    assert!(total(&report, "handshakes") >= 1500, "{run}");
    // The rotation converges even without the gate; it just breaks handshakes on the way.
    assert!(report["converge_seconds"].is_number(), "{run}");
    assert_eq!(report["error"], Value::Null, "{run}");
    let steady = &report["phases"][0];
    assert_eq!(
        steady["failed"], 0,
        "nothing changes in the steady state: {run}"
    );
    let rotation = &report["phases"][1];
    assert!(rotation["failed"].as_u64().unwrap_or(0) > 0, "{run}");
    let failures = rotation["failures"].as_array().expect("a list");
    assert!(
        failures.iter().any(|f| f
            .as_str()
            .is_some_and(|f| f.contains("rejected") && f.contains("UnknownIssuer"))),
        "the failures name who rejected whom and why: {run}"
    );
    assert!(run.stderr.contains("resource update applied"), "{run}");
}

#[test]
fn with_the_gate_no_handshake_fails_and_the_drill_exits_0() {
    let (run, report) = drill("on");
    assert_eq!(report["gate"], true);
    assert_clean(&run, &report, "rotation");
}

#[test]
fn migrating_to_meshidentity_in_one_step_breaks_nothing_with_the_gate_and_breaks_handshakes_without(
) {
    let (run, report) = drill_with("migrate-to-meshidentity", "on", &[]);
    assert_eq!(report["scenario"], "migrate-to-meshidentity");
    assert_clean(&run, &report, "migration");
    let (run, report) = drill_with("migrate-to-meshidentity", "off", &[]);
    assert_breaks(&run, &report, "UnknownIssuer");
}

#[test]
fn moving_to_a_new_trust_domain_in_one_step_breaks_nothing_with_the_gate_and_breaks_handshakes_without(
) {
    let (run, report) = drill_with("trust-domain", "on", &[]);
    assert_eq!(report["scenario"], "trust-domain");
    assert_clean(&run, &report, "migration");
    let (run, report) = drill_with("trust-domain", "off", &[]);
    assert_breaks(&run, &report, "UnknownIssuer");
}

#[test]
fn the_egress_drill_breaks_nothing_with_the_gate_and_breaks_handshakes_without() {
    let (run, report) = drill_with("egress", "on", &[]);
    assert_eq!(report["scenario"], "egress");
    assert_clean(&run, &report, "rotation");
    assert!(
        run.stderr
            .contains("defaults.mesh switched to the other mesh"),
        "{run}"
    );
    let (run, report) = drill_with("egress", "off", &[]);
    assert_breaks(&run, &report, "UnknownIssuer");
    // The egress calls nobody: it is only ever the server of a handshake.
    let failures = report["phases"][1]["failures"].as_array().expect("a list");
    assert!(
        failures
            .iter()
            .filter_map(Value::as_str)
            .all(|f| f.contains("→ egress-1")),
        "{run}"
    );
}

#[test]
fn the_workload_drill_behind_two_agents_breaks_nothing_with_the_gate_and_breaks_handshakes_without()
{
    let (run, report) = drill_with("workload", "on", &["--agent"]);
    assert_eq!(report["scenario"], "workload");
    assert_eq!(report["agents"], 2, "{run}");
    assert_clean(&run, &report, "rotation");
    for agent in ["host-a", "host-b"] {
        assert!(
            run.stderr
                .contains(&format!("agent connected agent={agent}")),
            "{agent} served its workloads: {run}"
        );
    }
    let (run, report) = drill_with("workload", "off", &["--agent"]);
    assert_breaks(&run, &report, "UnknownIssuer");
}

#[test]
fn the_staged_flows_break_nothing_even_without_the_gate() {
    for scenario in ["migrate-to-meshidentity", "trust-domain"] {
        for gate in ["on", "off"] {
            let (run, report) = drill_with(scenario, gate, &["--staged"]);
            assert_clean(&run, &report, "migration");
            for step in ["provider-less MeshIdentity", "selects every dataplane"] {
                assert!(run.stderr.contains(step), "{scenario}, gate {gate}: {run}");
            }
        }
    }
}

#[test]
fn human_output_names_each_phase() {
    let env = Env::new();
    let run = env.cli(&[
        "drill",
        "ca-rotation",
        "--proxies",
        "4",
        "--handshakes",
        "60",
        "--gate",
        "off",
    ]);
    for line in ["steady: ", "rotation: ", "converged: "] {
        assert!(run.stdout.contains(line), "{run}");
    }
    assert!(run.stdout.contains("handshakes"), "{run}");
    // With or without failures the verdict matches the exit code.
    match run.code() {
        Some(0) => assert!(run.stdout.contains("ok: no failed handshake"), "{run}"),
        Some(1) => assert!(run.stdout.contains("FAILED: "), "{run}"),
        other => panic!("unexpected exit {other:?}: {run}"),
    }
}

#[test]
fn bad_sizes_are_usage_errors() {
    let env = Env::new();
    let run = env.cli(&["drill", "ca-rotation", "--proxies", "1"]);
    assert_eq!(run.code(), Some(2), "{run}");
    assert!(run.stderr.contains("--proxies"), "{run}");
    let run = env.cli(&["drill", "nonsense"]);
    assert_eq!(run.code(), Some(2), "{run}");
    let run = env.cli(&["drill", "ca-rotation", "--agent"]);
    assert_eq!(run.code(), Some(2), "{run}");
    assert!(
        run.stderr.contains("--agent goes with the workload drill"),
        "{run}"
    );
    let run = env.cli(&[
        "drill",
        "workload",
        "--postgres",
        "postgres://x@127.0.0.1/db",
    ]);
    assert_eq!(run.code(), Some(2), "{run}");
    assert!(run.stderr.contains("--postgres URL goes with"), "{run}");
    for scenario in ["ca-rotation", "egress"] {
        let run = env.cli(&["drill", scenario, "--staged"]);
        assert_eq!(run.code(), Some(2), "{run}");
        assert!(run.stderr.contains("--staged"), "{run}");
    }
}
