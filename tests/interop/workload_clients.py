"""How the Workload API tests run workloads as other uids: the client packages copied where every uid may
read them, an interpreter every uid may run, and workloads.py processes started with setpriv."""

import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest

TIMEOUT = 30


@dataclass
class Runtime:
    root: Path
    python: str
    site: Path
    script: Path


def reachable_by_others(path):
    path = Path(os.path.realpath(path))
    return all(p.stat().st_mode & 0o001 for p in path.parents) and path.stat().st_mode & 0o005 == 0o005


def client_python():
    """The interpreter behind this one if every uid may run it, else one of the same version on PATH."""
    name = f"python{sys.version_info.major}.{sys.version_info.minor}"
    dirs = os.environ.get("PATH", os.defpath).split(os.pathsep) + ["/usr/local/bin", "/usr/bin"]
    for candidate in [getattr(sys, "_base_executable", sys.executable)] + [os.path.join(d, name) for d in dirs]:
        if os.path.exists(candidate) and reachable_by_others(candidate):
            return os.path.realpath(candidate)
    pytest.fail(f"no {name} that other uids may run (this one is {os.path.realpath(sys.executable)})")


def copy_distributions(names, site):
    """Copies the installed distributions `names` and everything they require into `site`."""
    done, todo = set(), list(names)
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in done:
            continue
        done.add(name)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # a requirement of another platform or Python version
        todo += [re.match(r"[A-Za-z0-9._-]+", r).group() for r in dist.requires or [] if "extra ==" not in r]
        for file in dist.files or []:
            if file.parts[0] != "..":
                (site / file).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(dist.locate_file(file), site / file)


def build_runtime():
    """A 0755 temp dir with the client packages and workloads.py, and an interpreter to run them."""
    if shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is needed to run workloads as other uids")
    root = Path(tempfile.mkdtemp(prefix="meshca-wl-clients-"))
    copy_distributions(["spiffe-tls", "spiffe"], root / "site")
    shutil.copyfile(Path(__file__).with_name("workloads.py"), root / "workloads.py")
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return Runtime(root, client_python(), root / "site", root / "workloads.py")


class Workload:
    """A workloads.py process run as `uid`, its JSON lines read as they come."""

    def __init__(self, runtime, socket, uid, groups, mode, *args):
        self.name = f"uid {uid} {mode}"
        self.stderr = tempfile.TemporaryFile("w+")
        groups = f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups"
        self.proc = subprocess.Popen(
            ["setpriv", f"--reuid={uid}", f"--regid={uid}", groups, runtime.python, "-I",
             str(runtime.script), str(runtime.site), str(socket), mode, *map(str, args)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True, cwd=runtime.root,
            env={"PATH": os.defpath, "LANG": "C.UTF-8"},
        )  # fmt: skip
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))
        self.lines.put(None)

    def _failure(self, why):
        self.stderr.seek(0)
        return f"workload {self.name}: {why}; its stderr:\n{self.stderr.read()[-4000:]}"

    def next(self, timeout=TIMEOUT):
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(self._failure(f"nothing written within {timeout}s"))
        if line is None:
            self.proc.wait()
            pytest.fail(self._failure(f"exited with {self.proc.returncode}"))
        return line

    def until(self, what, predicate, timeout=TIMEOUT):
        """The first line `predicate` accepts, with every line read up to it."""
        deadline, seen = time.monotonic() + timeout, []
        while True:
            seen.append(self.next(max(0.0, deadline - time.monotonic())))
            if predicate(seen[-1]):
                return seen
            assert time.monotonic() < deadline, f"{self.name}: no line with {what} in {seen}"

    def close(self):
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
