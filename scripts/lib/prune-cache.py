"""Deletes every artifact of meshca's own crates (the main workspace's and the fuzz workspace's packages
and targets) from the cargo target directories given as arguments, keeping the dependencies'.

.ci/run keeps its target directories outside the clone, so that the next run on the machine reuses the
compiled dependencies. meshca's own crates are rebuilt by every run anyway (a fresh clone's sources are
newer than any artifact); removing their old artifacts first means nothing of an earlier commit's code can
ever be linked into this one's, and the cache does not grow by a copy of them with every clone."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = [ROOT / "Cargo.toml", ROOT / "fuzz" / "Cargo.toml", ROOT / "tools" / "protogen" / "Cargo.toml"]


def own_names():
    """The package names (fingerprint and build script directories) and the target names (artifacts in
    deps/, examples/) of meshca's own crates, in both spellings cargo uses."""
    packages, targets = set(), set()
    for manifest in MANIFESTS:
        meta = json.loads(
            subprocess.run(
                ["cargo", "metadata", "--format-version", "1", "--no-deps", "--offline", "--manifest-path", str(manifest)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        )
        for package in meta["packages"]:
            packages.add(package["name"])
            for target in package["targets"]:
                targets.add(target["name"])
                targets.add(target["name"].replace("-", "_"))
    return packages, targets


def owned(entry, names):
    """Whether a file or directory named `<name>-<hash>[.ext]` (or `lib<name>-…`) belongs to one of `names`."""
    stem = entry.name
    if stem.startswith("lib"):
        stem_lib = stem[3:]
    else:
        stem_lib = None
    for candidate in (stem, stem_lib):
        if candidate is None or "-" not in candidate:
            continue
        name = candidate.rsplit("-", 1)[0]
        if name in names:
            return True
    return False


def remove(entry):
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry)
    else:
        entry.unlink()


def main():
    packages, targets = own_names()
    removed = 0
    for target_dir in map(Path, sys.argv[1:]):
        if not target_dir.is_dir():
            continue
        # cargo's layout: <profile>/ or <triple>/<profile>/, each with .fingerprint/, build/, deps/,
        # examples/, incremental/ (scripts/check builds incrementally) and what cargo copied up beside them
        # (<bin>, lib<name>.rlib, <name>.d).
        profiles = [p for p in [*target_dir.glob("*"), *target_dir.glob("*/*")] if (p / ".fingerprint").is_dir()]
        for profile in profiles:
            for kind, names in ((".fingerprint", packages), ("build", packages), ("deps", targets), ("examples", targets), ("incremental", targets)):
                if not (profile / kind).is_dir():
                    continue
                for entry in (profile / kind).iterdir():
                    if owned(entry, names):
                        remove(entry)
                        removed += 1
            for entry in profile.iterdir():
                base = entry.name.split(".", 1)[0]
                if entry.is_file() and (base in targets or (base.startswith("lib") and base[3:] in targets)):
                    entry.unlink()
                    removed += 1
    print(f"build caches: removed {removed} artifacts of meshca's own crates from earlier runs")


if __name__ == "__main__":
    main()
