"""Harness for the interop tests: a real `meshca serve` process, driven only through its CLI, settings file,
admin API and SDS, the way an operator and Envoy use it."""

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import grpc
import pytest

from sidecars import free_port

MESHCA = os.environ.get("MESHCA_BIN", str(Path(__file__).resolve().parents[2] / "target" / "debug" / "meshca"))

MESH = """\
type: Mesh
name: default
meshServices:
  mode: Exclusive
mtls:
  enabledBackend: ca-1
  backends:
    - name: ca-1
      type: builtin
      dpCert:
        rotation:
          expiration: 1h
"""


def wait_ready(proc, admin_port, log_path, what, timeout=60):
    """Polls `/ready` on `admin_port` until it answers 200 (a process's readiness is only visible there);
    fails with the log when `proc` exits first or the time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {log_path.read_text()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/ready", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{what} did not become ready: {log_path.read_text()[-4000:]}")


class Daemon:
    def __init__(
        self,
        root: Path,
        workload_socket: Path | None = None,
        resources: dict[str, str] | None = None,
        settings: str = "",
    ):
        """`workload_socket`: where the Workload API listens (else its default, in the data dir, which only
        root can enter); `resources`: more resource files, by name, present before the daemon starts;
        `settings`: more of the settings file."""
        self.root = root
        self.data = root / "data"
        self.resources = root / "resources"
        self.resources.mkdir(parents=True)
        (self.resources / "mesh.yaml").write_text(MESH)
        for name, text in (resources or {}).items():
            (self.resources / name).write_text(text)
        self.sds_port = free_port()
        self.admin_port = free_port()
        self.socket = self.data / "sds.sock"
        self.config = root / "meshca.yaml"
        self.config.write_text(
            f"dataDir: {self.data}\n"
            f"resources: {self.resources}\n"
            f"sds:\n  listen: [\"unix://{self.socket}\", \"127.0.0.1:{self.sds_port}\"]\n"
            f"admin:\n  listen: 127.0.0.1:{self.admin_port}\n"
            + (f"workloadApi:\n  listen: [\"unix://{workload_socket}\"]\n" if workload_socket else "")
            + settings
        )
        self.start("w")

    def start(self, log_mode="a"):
        self.log = open(self.root / "meshca.log", log_mode)
        # MESHCA_BIN is this harness's own variable: the daemon would warn that it is no setting of its.
        env = {k: v for k, v in os.environ.items() if k != "MESHCA_BIN"}
        self.proc = subprocess.Popen([MESHCA, "serve", "--config", str(self.config)], stderr=self.log, env=env)
        self.wait_ready()

    def wait_ready(self, timeout=60):
        wait_ready(self.proc, self.admin_port, self.root / "meshca.log", "meshca", timeout)

    def api(self, path):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}{path}", timeout=5) as r:
            return json.loads(r.read())

    def cli(self, *args, check=True):
        return subprocess.run([MESHCA, *args], capture_output=True, text=True, check=check)

    def token(self, name, mesh="default", *extra):
        out = self.cli("token", "--config", str(self.config), "--mesh", mesh, "--name", name, *extra)
        return out.stdout.strip()

    def log_text(self):
        return (self.root / "meshca.log").read_text()

    def write_resource(self, name, text):
        """Writes a resource file atomically (beside the directory, then renamed in)."""
        staging = self.root / f".staging-{name}"
        staging.write_text(text)
        staging.rename(self.resources / name)

    def remove_resource(self, name):
        (self.resources / name).unlink()

    def unix_channel(self):
        return grpc.insecure_channel(f"unix://{self.socket}")

    def tls_channel(self):
        ca = (self.data / "sds-ca.pem").read_bytes()
        return grpc.secure_channel(
            f"localhost:{self.sds_port}", grpc.ssl_channel_credentials(root_certificates=ca)
        )

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        finally:
            self.log.close()


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(tmp_path)
    yield d
    d.stop()
    assert d.proc.returncode == 0, (tmp_path / "meshca.log").read_text()


@pytest.fixture
def workload_dir():
    """A directory every uid may enter, for the Workload API socket (the data dir is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="meshca-wl-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def workload_daemon(tmp_path, workload_dir):
    """Starts (once per test) a daemon whose Workload API listens in `workload_dir`, with the given resource
    files beside the mesh."""
    started = []

    def start(resources):
        d = Daemon(tmp_path, workload_socket=workload_dir / "workload.sock", resources=resources)
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()
        assert d.proc.returncode == 0, d.log_text()
