"""Real Envoy against meshca: sidecars started from `meshca bootstrap`, carrying HTTP over mTLS with certificates
and SPIFFE validation contexts from meshca's SDS, through CA rotation and renewal, with Envoy's own view checked."""

import json

import pytest
import yaml

from sidecars import Backend, Envoy, RequestLoop, free_port, http_get, validate, wait_until

MESH_TWO_CAS = """\
type: Mesh
name: default
meshServices:
  mode: Exclusive
mtls:
  enabledBackend: {enabled}
  backends:
{backends}"""

BACKEND = """\
    - name: {name}
      type: builtin
      dpCert:
        rotation:
          expiration: {expiration}
"""


def mesh(enabled, names, expiration="1h"):
    backends = "".join(BACKEND.format(name=n, expiration=expiration) for n in names)
    return MESH_TWO_CAS.format(enabled=enabled, backends=backends)


class Pair:
    """A server sidecar (inbound mTLS to a backend) and a client sidecar (outbound mTLS to the server, pinned to
    its SPIFFE ID, plus a second listener pinned to a wrong one), both from `meshca bootstrap`."""

    def __init__(self, daemon, root, server_flags=(), client_patch=None, client_flags=()):
        self.backend = Backend()
        self.envoys = []
        api_token = root / "api.token"
        api_token.write_text(daemon.token("api", "default", "--tag", "kuma.io/service=api"))
        web_token = root / "web.token"
        web_token.write_text(daemon.token("web", "default", "--tag", "kuma.io/service=web"))
        self.inbound = free_port()
        self.outbound = free_port()
        self.wrong = free_port()
        server = self.bootstrap(daemon, api_token, free_port(), *server_flags,
                                "--inbound", f"{self.inbound}:{self.backend.port}")
        client = self.bootstrap(
            daemon, web_token, free_port(), *server_flags, "--one-request-per-connection",
            "--outbound", f"{self.outbound}=127.0.0.1:{self.inbound}@spiffe://default/api",
            "--outbound", f"{self.wrong}=127.0.0.1:{self.inbound}@spiffe://default/not-api",
            *(flag.format(inbound=self.inbound) for flag in client_flags),
        )
        for name, text in (("server", server), ("client", client)):
            path = root / f"validate-{name}.yaml"
            path.write_text(text)
            validate(path)
        client_config = yaml.safe_load(client)
        if client_patch:
            client_patch(client_config)
        self.server = self.start(root, "server", server)
        self.client = self.start(root, "client", client_config)
        for envoy, spiffe_id in ((self.server, "spiffe://default/api"), (self.client, "spiffe://default/web")):
            envoy.wait_live()
            wait_until(f"envoy {envoy.name} to present {spiffe_id}", lambda e=envoy, i=spiffe_id: i in e.cert_chain_sans())

    @staticmethod
    def bootstrap(daemon, token_file, admin_port, *flags):
        out = daemon.cli("bootstrap", "--config", str(daemon.config), "--token-file", str(token_file),
                         "--admin-port", str(admin_port), *flags)
        return out.stdout

    def start(self, root, name, bootstrap):
        envoy = Envoy(root, name, bootstrap)
        self.envoys.append(envoy)
        return envoy

    def url(self):
        return f"http://127.0.0.1:{self.outbound}/"

    def request(self):
        return http_get(self.url())

    def stop(self):
        for envoy in self.envoys:
            envoy.stop()
        self.backend.stop()


@pytest.fixture
def pairs():
    started = []
    yield started
    for pair in started:
        pair.stop()


def tls_flags(daemon):
    return ("--server", f"127.0.0.1:{daemon.sds_port}", "--sds-ca", str(daemon.data / "sds-ca.pem"))


@pytest.mark.parametrize("transport", ["unix", "tls"])
def test_a_bootstrapped_pair_carries_mtls_traffic_and_pins_the_peer(daemon, tmp_path, pairs, transport):
    flags = tls_flags(daemon) if transport == "tls" else ()
    pair = Pair(daemon, tmp_path, server_flags=flags)
    pairs.append(pair)
    status, body = pair.request()
    assert status == 200, body
    # The backend saw the client's identity, set by the server sidecar from the client certificate.
    assert "URI=spiffe://default/web" in body, body
    # The same server through a listener pinned to another SPIFFE ID: refused.
    status, body = http_get(f"http://127.0.0.1:{pair.wrong}/")
    assert status != 200, body
    for envoy in pair.envoys:
        assert set(envoy.sds_update_rejections().values()) == {0}
        assert {"default", "system_trust_bundle"} <= envoy.active_secret_names()


MESH_SERVICES = """\
type: MeshService
name: api
mesh: default
spec:
  selector: {dataplaneTags: {kuma.io/service: api}}
  ports: [{port: 80, targetPort: 8080}]
---
type: MeshService
name: web
mesh: default
spec:
  selector: {dataplaneTags: {kuma.io/service: web}}
  ports: [{port: 80, targetPort: 8080}]
"""


def test_a_meshservice_outbound_accepts_exactly_the_services_identities(daemon, tmp_path, pairs):
    daemon.write_resource("services.yaml", MESH_SERVICES)
    wait_until("the MeshServices to be loaded", lambda: {"api", "web"} <= {
        s["name"] for m in daemon.api("/api/meshes") for s in m["mesh_services"]})
    as_api, as_web = free_port(), free_port()
    pair = Pair(daemon, tmp_path, client_flags=(
        f"--outbound={as_api}=127.0.0.1:{{inbound}}@meshservice:api",
        f"--outbound={as_web}=127.0.0.1:{{inbound}}@meshservice:web",
    ))
    pairs.append(pair)
    # Validated with meshservice:api, whose SAN matchers are api's identities: the server passes.
    status, body = http_get(f"http://127.0.0.1:{as_api}/")
    assert status == 200, body
    assert "URI=spiffe://default/web" in body, body
    # The same server validated as web: the CA is trusted, but its SPIFFE ID is not web's.
    status, body = http_get(f"http://127.0.0.1:{as_web}/")
    assert status != 200, body
    assert {"meshservice:api", "meshservice:web"} <= pair.client.active_secret_names()
    assert set(pair.client.sds_update_rejections().values()) == {0}


def _sds_configs(node):
    """Every `sds_config` in a bootstrap dict."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "sds_config":
                yield value
            else:
                yield from _sds_configs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _sds_configs(item)


def _secret_refs(node):
    """Every `{name, sds_config}` secret reference in a bootstrap dict."""
    if isinstance(node, dict):
        if "sds_config" in node and "name" in node:
            yield node
        for value in node.values():
            yield from _secret_refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _secret_refs(item)


def delta(config):
    for sds in _sds_configs(config):
        sds["api_config_source"]["api_type"] = "DELTA_GRPC"


def legacy_names(config):
    renames = {"default": "identity_cert:secret:default", "system_trust_bundle": "mesh_ca:secret:default"}
    for ref in _secret_refs(config):
        ref["name"] = renames.get(ref["name"], ref["name"])


def spiffe_validation_off(config):
    config["node"]["metadata"] = {"disable_spiffe_cert_validation": True}


@pytest.mark.parametrize("patch", [delta, legacy_names, spiffe_validation_off], ids=lambda p: p.__name__)
def test_client_variants_carry_traffic(daemon, tmp_path, pairs, patch):
    pair = Pair(daemon, tmp_path, client_patch=patch)
    pairs.append(pair)
    status, body = pair.request()
    assert status == 200, body
    assert "URI=spiffe://default/web" in body, body
    status, body = http_get(f"http://127.0.0.1:{pair.wrong}/")
    assert status != 200, "the pinned SAN still applies: " + body
    assert set(pair.client.sds_update_rejections().values()) == {0}


def test_a_ca_rotation_under_traffic_fails_no_request(daemon, tmp_path, pairs):
    pair = Pair(daemon, tmp_path)
    pairs.append(pair)
    before = {envoy.name: envoy.presented_serials() for envoy in pair.envoys}
    loop = RequestLoop(pair.url(), expect_in_body="URI=spiffe://default/web")
    try:
        loop.wait_for_requests(20)
        # One edit: a second CA, and it issues from now on.
        daemon.write_resource("mesh.yaml", mesh("ca-2", ["ca-1", "ca-2"]))
        for envoy in pair.envoys:
            wait_until(f"envoy {envoy.name} to present a certificate from ca-2",
                       lambda e=envoy: e.presented_serials() and not (e.presented_serials() & before[e.name]))
        loop.wait_for_requests(20)
        # Then the old CA is removed.
        daemon.write_resource("mesh.yaml", mesh("ca-2", ["ca-2"]))
        wait_until("ca-1 to leave the mesh",
                   lambda: "ca-1" not in str(daemon.api("/api/meshes/default")))
        loop.wait_for_requests(20)
    finally:
        ok, failed = loop.stop()
    assert failed == 0, f"{failed} of {ok + failed} requests failed: {loop.reasons}"
    assert ok >= 60
    for envoy in pair.envoys:
        assert set(envoy.sds_update_rejections().values()) == {0}


def test_short_lived_certificates_renew_under_traffic(daemon, tmp_path, pairs):
    daemon.write_resource("mesh.yaml", mesh("ca-1", ["ca-1"], expiration="10s"))
    pair = Pair(daemon, tmp_path)
    pairs.append(pair)
    loop = RequestLoop(pair.url(), expect_in_body="URI=spiffe://default/web")
    try:
        for _ in range(2):
            seen = {envoy.name: envoy.presented_serials() for envoy in pair.envoys}
            for envoy in pair.envoys:
                wait_until(f"envoy {envoy.name} to renew",
                           lambda e=envoy: e.presented_serials() and not (e.presented_serials() & seen[e.name]))
        loop.wait_for_requests(20)
    finally:
        ok, failed = loop.stop()
    assert failed == 0, f"{failed} of {ok + failed} requests failed: {loop.reasons}"


def test_an_envoy_whose_token_is_refused_gets_no_certificate(daemon, tmp_path):
    minted = json.loads(daemon.cli("token", "--config", str(daemon.config), "--mesh", "default", "--name", "web",
                                   "--tag", "kuma.io/service=web", "--output", "json").stdout)
    daemon.cli("token", "--config", str(daemon.config), "--revoke", minted["id"])
    token_file = tmp_path / "revoked.token"
    token_file.write_text(minted["token"])
    # The daemon picks the revocation up from its file within a second; wait until it refuses the token.
    wait_until("the daemon to refuse the revoked token", lambda: daemon.cli(
        "sds", "fetch", "--config", str(daemon.config), "--token-file", str(token_file), "default",
        check=False).returncode != 0)
    bootstrap = Pair.bootstrap(daemon, token_file, free_port(), "--inbound", f"{free_port()}:{free_port()}")
    envoy = Envoy(tmp_path, "refused", bootstrap)
    try:
        # Envoy gives up waiting for its secrets after the initial fetch timeout (15 s) and goes LIVE without
        # them: it holds no certificate, so every mTLS connection through it fails.
        envoy.wait_live(timeout=90)
        assert envoy.cert_chain_sans() == set()
        assert "default" not in envoy.active_secret_names()
        # Envoy's own account, as docs/envoy.md tells operators to read it.
        stats = envoy.stats()
        assert stats["sds.default.init_fetch_timeout"] == 1, stats
        assert stats["sds.default.update_failure"] > 0, stats
        assert stats["sds.default.update_success"] == 0, stats
    finally:
        envoy.stop()
