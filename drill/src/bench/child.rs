//! The fleet in its own process (`meshca bench sds-client`, hidden; `bench workload` uses it too), so
//! that the bench process's memory is the daemon's alone, as an operator would see it.
//!
//! The parent talks to the child with one JSON object per line: on the child's stdin a [`ToChild::Plan`],
//! later a [`ToChild::Arm`]; on its stdout [`FromChild`] answers. The child arms its clock before it
//! answers `Armed`, and the parent starts the rotation only after reading that, so the latencies the
//! child reports can only be too long, never too short. The child exits when its stdin closes.

use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

use super::fleet::{FleetPlan, Reach, StreamFleet};

/// What the parent sends.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
enum ToChild {
    /// Open these streams; give up on setup or rotation after `timeout_seconds`.
    Plan {
        plan: FleetPlan,
        timeout_seconds: f64,
    },
    /// Start the rotation clock.
    Arm,
}

/// What the child answers.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
enum FromChild {
    /// Every stream holds its secrets.
    Ready { setup_seconds: f64, rss_bytes: u64 },
    /// The clock runs.
    Armed,
    /// How the rotation reached the streams.
    Reached(Reach),
    /// The child could not go on.
    Failed { error: String },
}

/// The parent's handle on a child fleet.
#[derive(Debug)]
pub struct ChildFleet {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    /// How long the child may take to answer (its own timeout plus a margin).
    patience: Duration,
}

/// How long past its own timeout a child may take before the parent gives up on it.
const MARGIN: Duration = Duration::from_secs(10);

impl ChildFleet {
    /// Starts `meshca bench sds-client` from this executable and hands it the plan.
    pub async fn spawn(plan: FleetPlan, timeout: Duration) -> anyhow::Result<ChildFleet> {
        let exe = std::env::current_exe().context("cannot find the meshca executable")?;
        let mut child = tokio::process::Command::from(meshca_daemon::children::without_secrets(
            std::process::Command::new(&exe),
        ))
        .args(["bench", "sds-client"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {} bench sds-client", exe.display()))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(anyhow!("the client process has no stdin or stdout pipe"));
        };
        let mut fleet = ChildFleet {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
            patience: timeout + MARGIN,
        };
        fleet
            .send(&ToChild::Plan {
                plan,
                timeout_seconds: timeout.as_secs_f64(),
            })
            .await?;
        Ok(fleet)
    }

    async fn send(&mut self, message: &ToChild) -> anyhow::Result<()> {
        let mut line = serde_json::to_vec(message)?;
        line.push(b'\n');
        self.stdin
            .write_all(&line)
            .await
            .context("the client process stopped reading")?;
        self.stdin
            .flush()
            .await
            .context("the client process stopped reading")
    }

    async fn receive(&mut self) -> anyhow::Result<FromChild> {
        let line = tokio::time::timeout(self.patience, self.lines.next_line())
            .await
            .map_err(|_| anyhow!("the client process said nothing for {:?}", self.patience))?
            .context("cannot read from the client process")?
            .ok_or_else(|| anyhow!("the client process exited"))?;
        match serde_json::from_str(&line)
            .with_context(|| format!("the client process said {line:?}"))?
        {
            FromChild::Failed { error } => Err(anyhow!("the client process failed: {error}")),
            message => Ok(message),
        }
    }

    /// Waits until every stream holds its secrets; returns the setup time and the child's memory.
    pub async fn wait_ready(&mut self) -> anyhow::Result<(f64, u64)> {
        match self.receive().await? {
            FromChild::Ready {
                setup_seconds,
                rss_bytes,
            } => Ok((setup_seconds, rss_bytes)),
            other => Err(anyhow!("the client process answered {other:?}, not ready")),
        }
    }

    /// Starts the child's rotation clock and returns once it runs.
    pub async fn arm(&mut self) -> anyhow::Result<()> {
        self.send(&ToChild::Arm).await?;
        match self.receive().await? {
            FromChild::Armed => Ok(()),
            other => Err(anyhow!("the client process answered {other:?}, not armed")),
        }
    }

    /// The child's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Waits for the child's report on the rotation.
    pub async fn wait_reached(&mut self) -> anyhow::Result<Reach> {
        match self.receive().await? {
            FromChild::Reached(reach) => Ok(reach),
            other => Err(anyhow!(
                "the client process answered {other:?}, not a report"
            )),
        }
    }

    /// Closes the child's stdin (it then exits) and waits for it, killing it if it lingers.
    pub async fn stop(self) {
        let ChildFleet {
            mut child, stdin, ..
        } = self;
        drop(stdin);
        if tokio::time::timeout(MARGIN, child.wait()).await.is_err() {
            let _ = child.kill().await;
        }
    }
}

/// `meshca bench sds-client`: runs a fleet as the parent's messages on stdin say.
pub async fn serve() -> anyhow::Result<ExitCode> {
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let result = drive(&mut lines).await;
    if let Err(error) = &result {
        say(&FromChild::Failed {
            error: format!("{error:#}"),
        })?;
    }
    result
}

async fn drive(lines: &mut Lines<BufReader<tokio::io::Stdin>>) -> anyhow::Result<ExitCode> {
    let (plan, timeout) = match next(lines).await? {
        ToChild::Plan {
            plan,
            timeout_seconds,
        } => (plan, Duration::try_from_secs_f64(timeout_seconds)?),
        ToChild::Arm => return Err(anyhow!("armed before any plan")),
    };
    let started = Instant::now();
    let fleet = StreamFleet::open(plan).await?;
    fleet.wait_ready(timeout).await?;
    say(&FromChild::Ready {
        setup_seconds: started.elapsed().as_secs_f64(),
        rss_bytes: super::rss_bytes(None)?,
    })?;
    match next(lines).await? {
        ToChild::Arm => fleet.arm(),
        ToChild::Plan { .. } => return Err(anyhow!("a second plan")),
    }
    say(&FromChild::Armed)?;
    say(&FromChild::Reached(fleet.wait_reached(timeout).await))?;
    // Keep the streams open until the parent is done with the daemon.
    while lines.next_line().await?.is_some() {}
    fleet.stop().await;
    Ok(ExitCode::SUCCESS)
}

async fn next(lines: &mut Lines<BufReader<tokio::io::Stdin>>) -> anyhow::Result<ToChild> {
    let line = lines.next_line().await?.ok_or_else(|| {
        anyhow!("stdin closed: this command is run by `meshca bench sds` and `bench workload`")
    })?;
    serde_json::from_str(&line).context("not a message from `meshca bench sds` or `bench workload`")
}

fn say(message: &FromChild) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, message)?;
    out.write_all(b"\n")?;
    out.flush()?;
    Ok(())
}
