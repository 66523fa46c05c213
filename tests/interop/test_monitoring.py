"""monitoring/ against a real Prometheus (Debian's `prometheus` package): promtool's unit tests of the alerting
rules, and a Prometheus server that scrapes a running meshca with those rules loaded, and fires
MeshcaRolloutPastAckTimeout, read through its HTTP API, once a proxy that never ACKs holds a CA rotation past
rollout.ackTimeout."""

import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

from conftest import MESH, Daemon
from sidecars import free_port
from test_sds import Stream

MONITORING = Path(__file__).resolve().parents[2] / "monitoring"

SWITCHED = """\
type: Mesh
name: default
meshServices:
  mode: Exclusive
mtls:
  enabledBackend: ca-2
  secondaryBackends: [ca-1]
  backends:
    - name: ca-1
      type: builtin
      dpCert:
        rotation:
          expiration: 1h
    - name: ca-2
      type: builtin
      dpCert:
        rotation:
          expiration: 1h
"""


def tool(name):
    path = shutil.which(name)
    assert path, f"{name} is missing: Debian's prometheus package ships it (apt-get install prometheus)"
    return path


def test_the_alerting_rules_pass_their_promtool_unit_tests():
    promtool = tool("promtool")
    check = subprocess.run([promtool, "check", "rules", "meshca-alerts.yaml"], cwd=MONITORING,
                           capture_output=True, text=True)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    tests = subprocess.run([promtool, "test", "rules", "meshca-alerts.test.yaml"], cwd=MONITORING,
                           capture_output=True, text=True)  # fmt: skip
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert "SUCCESS" in tests.stdout, tests.stdout


class Prometheus:
    """A Prometheus server in a temporary directory, scraping `target` every second with the rules loaded."""

    def __init__(self, root: Path, target: str):
        self.port = free_port()
        root.mkdir(parents=True)
        config = root / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: [{MONITORING / 'meshca-alerts.yaml'}]\n"
            f"scrape_configs:\n  - job_name: meshca\n    static_configs: [{{targets: ['{target}']}}]\n"
        )
        self.log_path = root / "prometheus.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [tool("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={root / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def api(self, path):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/v1/{path}", timeout=5) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def until(self, what, probe, timeout=60):
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, f"prometheus exited: {self.log_path.read_text()}"
            try:
                value = probe()
            except OSError:
                value = None
            if value:
                return value
            assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
            time.sleep(0.2)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=20)
        self.log.close()


def test_prometheus_scrapes_meshca_and_fires_the_rollout_alert_for_a_proxy_that_never_acks(tmp_path):
    daemon = Daemon(tmp_path / "meshca", settings="rollout:\n  ackTimeout: 2s\n")
    prometheus = Prometheus(tmp_path / "prometheus", f"127.0.0.1:{daemon.admin_port}")
    stream = None
    try:
        # The target is up, and the rules are loaded.
        prometheus.until("the meshca target up", lambda: [
            t for t in prometheus.api("targets")["activeTargets"] if t["health"] == "up"])  # fmt: skip
        groups = prometheus.api("rules")["groups"]
        names = {r["name"] for g in groups for r in g["rules"]}
        assert "MeshcaRolloutPastAckTimeout" in names and "MeshcaAgentWithoutServer" in names, names
        # A proxy that takes its trust bundle, ACKs it, and from then on never ACKs again.
        stream = Stream(daemon.unix_channel(), daemon.token("stuck"), "default.stuck")
        stream.send(["system_trust_bundle"])
        first = stream.recv()
        stream.send(["system_trust_bundle"], version=first.version_info, nonce=first.nonce)
        # The timeouts counter is scraped at 0 before the rotation: Prometheus sees the increase.
        prometheus.until("the rollout timeouts counter at 0", lambda: prometheus.api(
            "query?query=meshca_rollout_timeouts_total%7Bmesh%3D%22default%22%2Cstep%3D%22trust-before-identity%22%7D")
            ["result"])  # fmt: skip
        assert prometheus.api("alerts")["alerts"] == []
        daemon.write_resource("mesh.yaml", SWITCHED)
        stream.recv()  # the new trust, never ACKed: the rollout waits, then goes on after 2 s
        firing = prometheus.until("MeshcaRolloutPastAckTimeout firing", lambda: [
            a for a in prometheus.api("alerts")["alerts"]
            if a["labels"]["alertname"] == "MeshcaRolloutPastAckTimeout" and a["state"] == "firing"])  # fmt: skip
        labels = firing[0]["labels"]
        assert labels["mesh"] == "default" and labels["step"] == "trust-before-identity", labels
        assert labels["severity"] == "warning", labels
        assert "went ahead after rollout.ackTimeout" in firing[0]["annotations"]["summary"], firing[0]
    finally:
        if stream:
            stream.close()
        prometheus.stop()
        daemon.stop()
