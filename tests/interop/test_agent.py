"""`meshca agent` as an operator runs it: one `meshca serve`, two `meshca agent` processes (other names, other
sockets), and py-spiffe workloads as other uids on each agent's socket. What they get is checked with
cryptography; the server's side is searched for the workloads' private keys."""

import base64
import json
import os
import shutil
import subprocess
import tempfile
import urllib.request
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from conftest import MESHCA, Daemon, wait_ready
from sidecars import free_port
from test_workload_api import (
    ID_A,
    ID_B,
    ID_C,
    MESH_IDENTITY,
    UID_A,
    UID_B,
    check_svid,
    dataplane,
)
from workload_clients import Workload, build_runtime


def registration(name, dataplane_name, agent, *selectors):
    return (
        f"type: WorkloadRegistration\nmesh: default\nname: {name}\nspec:\n  dataplane: {dataplane_name}\n"
        f"  selectors: [{', '.join(selectors)}]\n  agent: {agent}\n"
    )


# a (uid 10001) and c (uid 10001 too) on different hosts; b (uid 10002) on host-2.
RESOURCES = {
    "identity.yaml": MESH_IDENTITY,
    "dataplanes.yaml": "---\n".join(dataplane(n, n) for n in ("a", "b", "c")),
    "reg-a.yaml": registration("a", "a", "host-1", f"unix:uid:{UID_A}"),
    "reg-b.yaml": registration("b", "b", "host-2", f"unix:uid:{UID_B}"),
    "reg-c.yaml": registration("c", "c", "host-2", f"unix:uid:{UID_A}"),
}


class Agent:
    """A `meshca agent` process serving its socket in a directory every uid may enter."""

    def __init__(self, daemon: Daemon, name: str, root: Path):
        self.name = name
        self.dir = Path(tempfile.mkdtemp(prefix=f"meshca-{name}-"))
        self.dir.chmod(0o755)
        self.socket = self.dir / "workload.sock"
        self.admin_port = free_port()
        token = daemon.cli("token", "--config", str(daemon.config), "--type", "agent", "--name", name)
        self.token_file = root / f"{name}.token"
        self.token_file.write_text(token.stdout.strip())
        self.token_file.chmod(0o600)
        self.log_path = root / f"{name}.log"
        self.args = [
            MESHCA, "agent", "--server", f"unix://{daemon.socket}", "--token-file", str(self.token_file),
            "--listen", f"unix://{self.socket}", "--admin", f"127.0.0.1:{self.admin_port}",
        ]  # fmt: skip
        self.start()

    def start(self):
        self.log = open(self.log_path, "a")
        env = {k: v for k, v in os.environ.items() if k != "MESHCA_BIN"}
        self.proc = subprocess.Popen(self.args, stderr=self.log, env=env)
        self.wait_ready()

    def status(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/api/status", timeout=5) as r:
            return json.loads(r.read())

    def wait_ready(self, timeout=60):
        wait_ready(self.proc, self.admin_port, self.log_path, f"meshca agent {self.name}", timeout)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        finally:
            self.log.close()
            shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def runtime():
    built = build_runtime()
    yield built
    shutil.rmtree(built.root, ignore_errors=True)


@pytest.fixture
def fleet(tmp_path):
    daemon = Daemon(tmp_path, resources=RESOURCES)
    agents = {name: Agent(daemon, name, tmp_path) for name in ("host-1", "host-2")}
    yield daemon, agents
    for agent in agents.values():
        agent.stop()
        assert agent.proc.returncode == 0, agent.log_path.read_text()
    daemon.stop()
    assert daemon.proc.returncode == 0, daemon.log_text()


@pytest.fixture
def spawn(runtime):
    started = []

    def run(agent, uid, mode, *args):
        started.append(Workload(runtime, agent.socket, uid, (), mode, *args))
        return started[-1]

    yield run
    for w in started:
        w.close()


def only_svid(workload, expected_id):
    ctx = workload.next()
    assert "error" not in ctx, ctx
    assert [s["spiffe_id"] for s in ctx["svids"]] == [expected_id]
    check_svid(ctx["svids"][0], ctx["bundles"], expected_id)
    return ctx["svids"][0]


def secret_marks(svid):
    """What would betray a workload's private key if found: its PKCS#8 DER, and the PEM body of it from past
    the header every key of its kind shares."""
    der = base64.b64decode(svid["key"])
    key = serialization.load_der_private_key(der, None)
    scalar = key.private_numbers().private_value.to_bytes(32, "big")
    pem_body = base64.b64encode(der).decode()[48:88]
    return scalar, pem_body


def test_each_agent_serves_only_the_registrations_naming_it_and_the_keys_stay_on_its_host(fleet, spawn):
    daemon, agents = fleet
    host1, host2 = agents["host-1"], agents["host-2"]
    svid_a = only_svid(spawn(host1, UID_A, "context"), ID_A)
    svid_b = only_svid(spawn(host2, UID_B, "context"), ID_B)
    # The same uid on the other host is another workload: it gets the registration naming that host.
    svid_c = only_svid(spawn(host2, UID_A, "context"), ID_C)
    # uid 10002's registration names host-2: host-1 serves it nothing.
    denied = spawn(host1, UID_B, "context").next()
    assert denied["error"] == "FetchX509SvidError" and "PERMISSION_DENIED" in denied["message"], denied

    # No workload key is anywhere on the server's side: its data directory, its log, its admin API.
    server_side = [p.read_bytes() for p in daemon.data.rglob("*") if p.is_file()]
    server_side.append(daemon.log_text().encode())
    for path in ("/api/status", "/api/agents", "/api/dataplanes", "/api/streams"):
        with urllib.request.urlopen(f"http://127.0.0.1:{daemon.admin_port}{path}", timeout=5) as r:
            server_side.append(r.read())
    for svid in (svid_a, svid_b, svid_c):
        scalar, pem_body = secret_marks(svid)
        for blob in server_side:
            assert scalar not in blob and pem_body.encode() not in blob

    # The server lists both agents with their registrations; each agent's status names its own.
    listed = {a["name"]: a for a in daemon.api("/api/agents")}
    assert sorted(listed) == ["host-1", "host-2"], listed
    status = host2.status()
    assert status["agent"] == "host-2"
    assert sorted(r["name"] for r in status["registrations"]) == ["b", "c"]


def test_an_agent_keeps_serving_while_the_server_is_down_and_catches_up(fleet, spawn):
    daemon, agents = fleet
    host1 = agents["host-1"]
    watch = spawn(host1, UID_A, "watch")
    only_svid(watch, ID_A)
    daemon.stop()
    assert daemon.proc.returncode == 0, daemon.log_text()
    # A workload that starts now is served what the agent holds.
    only_svid(spawn(host1, UID_A, "context"), ID_A)
    daemon.start()
    # A new registration for the same uid, added after the restart, reaches the open watch.
    daemon.write_resource("reg-c.yaml", registration("c", "c", "host-1", f"unix:uid:{UID_A}"))
    update = watch.until("the second registration", lambda u: "error" in u or len(u["svids"]) == 2)
    assert "error" not in update[-1], update
    assert [s["spiffe_id"] for s in update[-1]["svids"]] == [ID_A, ID_C]
    for svid in update[-1]["svids"]:
        check_svid(svid, update[-1]["bundles"], svid["spiffe_id"])


def test_a_workload_behind_an_agent_trusts_a_federated_partners_jwt_keys(tmp_path, spawn):
    """The server sends the agent the bundles of the trust domains each registration's mesh federates with:
    py-spiffe behind the agent reads the partner's JWT keys and validates its JWT-SVIDs, as on the server's
    own socket."""
    from cryptography.hazmat.primitives.asymmetric import ec
    from spiffe_peer import TRUST_DOMAIN, Authority, BundleEndpoint, bundle, jwt_jwk, jwt_svid
    from test_federation import relationship

    current, signer = Authority(), ec.generate_private_key(ec.SECP256R1())
    document = bundle([current.jwk(), jwt_jwk("partner-key-1", signer)], 1)
    peer = BundleEndpoint(current, document)
    initial = tmp_path / "partner.json"
    initial.write_bytes(document)
    daemon = Daemon(tmp_path, resources={**RESOURCES, "partner.yaml": relationship(peer.url, initial)})
    agent = Agent(daemon, "host-1", tmp_path)
    try:
        assert spawn(agent, UID_A, "jwt_bundle", TRUST_DOMAIN).next() == {"kids": ["partner-key-1"]}
        partner_id = f"spiffe://{TRUST_DOMAIN}/billing"
        token = jwt_svid(signer, "partner-key-1", partner_id, ID_A)
        assert spawn(agent, UID_A, "validate", token, ID_A).next() == {"spiffe_id": partner_id}
        forged = jwt_svid(ec.generate_private_key(ec.SECP256R1()), "partner-key-1", partner_id, ID_A)
        refused = spawn(agent, UID_A, "validate", forged, ID_A).next()
        assert "error" in refused, refused
    finally:
        agent.stop()
        daemon.stop()
        peer.close()
    assert agent.proc.returncode == 0, agent.log_path.read_text()
    assert daemon.proc.returncode == 0, daemon.log_text()
