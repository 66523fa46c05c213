//! `meshca agent`'s settings: what it refuses before it starts (exit 2, naming the setting), and
//! the agent running from a token `meshca token --type agent` minted.

mod common;

use common::Env;

/// Runs `meshca agent ARGS` with `vars` set and expects exit 2 with `expected` in its error.
fn refused(env: &Env, vars: &[(&str, &str)], args: &[&str], expected: &str) {
    let mut full = vec!["agent"];
    full.extend_from_slice(args);
    let mut cmd = env.command(&full);
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let run = env.cli_with(cmd, &full);
    assert_eq!(run.code(), Some(2), "{run}");
    assert!(
        run.stderr.contains(expected),
        "expected {expected:?} in: {run}"
    );
}

#[test]
fn missing_or_bad_agent_settings_exit_2_naming_the_setting() {
    let env = Env::new();
    let token = env.root().join("agent.token");
    std::fs::write(&token, "not a token\n").expect("write");
    let token = token.to_str().expect("utf-8");
    refused(
        &env,
        &[],
        &["--token-file", token],
        "agent.servers: no meshca server named",
    );
    refused(
        &env,
        &[],
        &["--server", "ca.example:5678"],
        "agent.tokenFile: no agent token",
    );
    refused(
        &env,
        &[],
        &["--server", "ca.example", "--token-file", token],
        "--server: agent.servers: \"ca.example\" is not a server address",
    );
    refused(
        &env,
        &[("MESHCA_AGENT_SERVERS", "ca.example:0")],
        &["--token-file", token],
        "MESHCA_AGENT_SERVERS: agent.servers:",
    );
    refused(
        &env,
        &[],
        &[
            "--server",
            "ca.example:5678",
            "--token-file",
            "/nonexistent/meshca/agent.token",
        ],
        "agent.tokenFile: cannot read /nonexistent/meshca/agent.token",
    );
    refused(
        &env,
        &[],
        &["--server", "ca.example:5678", "--token-file", token],
        "holds no usable agent token",
    );
    refused(
        &env,
        &[],
        &[
            "--server",
            "ca.example:5678",
            "--token-file",
            token,
            "--listen",
            "127.0.0.1:1",
        ],
        "--listen: agent.listen: 127.0.0.1:1 is a TCP address",
    );
}

#[test]
fn settings_file_servers_are_read_and_a_proxy_token_is_refused() {
    let env = Env::new();
    let proxy = env.token("default", "web-1", &[]);
    let settings = env.root().join("agent.yaml");
    std::fs::write(
        &settings,
        format!(
            "agent:\n  servers: [\"unix:///nonexistent/sds.sock\"]\n  tokenFile: {}\n  listen: unix://{}\n  admin: 127.0.0.1:0\n",
            proxy.file.display(),
            env.root().join("workload.sock").display()
        ),
    )
    .expect("write");
    let settings = settings.to_str().expect("utf-8");
    refused(
        &env,
        &[],
        &["--config", settings],
        "it is a default.web-1 token",
    );
}

#[test]
fn the_agent_runs_from_an_agent_token_and_says_it_is_not_ready_without_a_server() {
    let env = Env::new();
    let token = env.agent_token("host-1");
    let token_file = env.root().join("agent.token");
    std::fs::write(&token_file, token).expect("write");
    let admin = common::free_addr();
    let socket = env.root().join("agent").join("workload.sock");
    let admin_text = admin.to_string();
    let listen = format!("unix://{}", socket.display());
    let mut agent = env.spawn(&[
        "agent",
        "--server",
        "unix:///nonexistent/meshca/sds.sock",
        "--token-file",
        token_file.to_str().expect("utf-8"),
        "--listen",
        &listen,
        "--admin",
        &admin_text,
    ]);
    let ready = common::wait_for("the agent's admin listener", || {
        if let Some(status) = agent.exited() {
            panic!("meshca agent exited ({status}):\n{}", agent.log());
        }
        common::http_get(admin, "/ready").ok()
    });
    assert_eq!(ready.status, 503, "{ready:?}");
    assert!(ready.body.contains("no state received"), "{ready:?}");
    let status = common::wait_for("a failed connection in the status", || {
        let response = common::http_get(admin, "/api/status").ok()?;
        let json: serde_json::Value = serde_json::from_str(&response.body).ok()?;
        json["server"]["lastError"].is_string().then_some(json)
    });
    assert_eq!(status["agent"], "host-1", "{status}");
    assert!(status["server"]["connected"].is_null(), "{status}");
    assert!(socket.exists(), "the Workload API socket is bound");
    let log = agent.log();
    assert!(log.contains("no meshca server answers"), "{log}");
    let exit = agent.stop().expect("it exits");
    assert!(exit.success(), "{exit:?}");
}
