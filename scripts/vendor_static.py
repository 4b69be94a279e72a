"""Fetch the chat page's browser libraries from the npm registry into static/vendor/, pinned and checksummed.

    python scripts/vendor_static.py            # re-fetch the pinned versions, copy their files, rewrite the sha256s
    python scripts/vendor_static.py --check    # re-fetch and verify: the vendored files are the registry's, unedited

static/vendor/MANIFEST.json is the source of truth: each package's exact version, which files of its npm tarball
are kept (`include`, globs inside the tarball's package/ folder) and where they land (`dir`, with `strip` taken off
the front of the path). To upgrade, change a `version` there and run the script without --check; it rewrites each
file's sha256 and the tarball's integrity. `npm pack` only downloads the tarball (no install scripts run).
tests/test_vendored_static.py checks every vendored file against the manifest without the network.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENDOR = ROOT / "static" / "vendor"
MANIFEST = VENDOR / "MANIFEST.json"


def sha256(data: bytes) -> str:
    """The hex sha256 of `data`."""
    return hashlib.sha256(data).hexdigest()


def npm_pack(name: str, version: str, workdir: Path) -> tuple[dict[str, bytes], str]:
    """The files of `name@version`'s tarball (path inside package/ -> bytes) and the tarball's integrity."""
    spec = f"{name}@{version}"
    result = subprocess.run(
        ["npm", "pack", spec, "--json", "--ignore-scripts", "--pack-destination", str(workdir)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"npm pack {spec} failed:\n{result.stderr.strip()}")
    info = json.loads(result.stdout)[0]
    if info["version"] != version:
        raise SystemExit(f"npm pack {spec} gave version {info['version']}")
    files: dict[str, bytes] = {}
    with tarfile.open(workdir / info["filename"]) as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            path = member.name.split("/", 1)[1]  # every npm tarball has one top folder (usually package/)
            extracted = tar.extractfile(member)
            assert extracted is not None, member.name
            files[path] = extracted.read()
    return files, info["integrity"]


def select(package: dict, files: dict[str, bytes]) -> dict[str, tuple[str, bytes]]:
    """The kept files of `package`: vendored path (relative to static/vendor) -> (path in the tarball, bytes)."""
    kept: dict[str, tuple[str, bytes]] = {}
    for pattern in package["include"]:
        matches = sorted(path for path in files if fnmatch.fnmatchcase(path, pattern))
        if not matches:
            raise SystemExit(
                f"{package['name']}@{package['version']}: nothing in the tarball matches {pattern!r}"
            )
        for source in matches:
            relative = source.removeprefix(package["strip"]) if "/" in source else source
            kept[f"{package['dir']}/{relative}"] = (source, files[source])
    return kept


def refresh(manifest: dict, workdir: Path) -> None:
    """Copy each package's kept files into static/vendor and record their sha256s in the manifest."""
    for package in manifest["packages"]:
        files, integrity = npm_pack(package["name"], package["version"], workdir)
        kept = select(package, files)
        shutil.rmtree(VENDOR / package["dir"], ignore_errors=True)
        for path, (_, data) in kept.items():
            (VENDOR / path).parent.mkdir(parents=True, exist_ok=True)
            (VENDOR / path).write_bytes(data)
        package["integrity"] = integrity
        package["files"] = [
            {"path": path, "source": source, "sha256": sha256(data)}
            for path, (source, data) in sorted(kept.items())
        ]
        print(
            f"{package['name']}@{package['version']}: {len(kept)} files into static/vendor/{package['dir']}/"
        )
    MANIFEST.write_text(json.dumps(manifest, indent=2) + "\n")


def check(manifest: dict, workdir: Path) -> list[str]:
    """What differs between the registry's tarballs, the manifest and the vendored files (empty when none)."""
    problems: list[str] = []
    for package in manifest["packages"]:
        label = f"{package['name']}@{package['version']}"
        files, integrity = npm_pack(package["name"], package["version"], workdir)
        if integrity != package["integrity"]:
            problems.append(
                f"{label}: the registry's tarball is {integrity}, the manifest says {package['integrity']}"
            )
        kept = select(package, files)
        listed = {entry["path"]: entry for entry in package["files"]}
        for path in sorted(set(kept) ^ set(listed)):
            problems.append(f"{label}: {path} is {'not listed' if path in kept else 'not in the tarball'}")
        for path in sorted(set(kept) & set(listed)):
            source, data = kept[path]
            on_disk = VENDOR / path
            if sha256(data) != listed[path]["sha256"] or listed[path]["source"] != source:
                problems.append(f"{label}: {path} in the manifest is not the tarball's {source}")
            if not on_disk.is_file() or on_disk.read_bytes() != data:
                problems.append(f"{label}: static/vendor/{path} differs from the tarball's {source}")
        print(f"{label}: {len(kept)} files checked")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="verify against the registry, change nothing")
    args = parser.parse_args()
    if shutil.which("npm") is None:
        raise SystemExit("npm is not installed (apt-get install npm)")
    manifest = json.loads(MANIFEST.read_text())
    with tempfile.TemporaryDirectory(prefix="pagedchat-vendor-") as tmp:
        if not args.check:
            refresh(manifest, Path(tmp))
            return
        problems = check(manifest, Path(tmp))
    if problems:
        print("\n".join(problems), file=sys.stderr)
        raise SystemExit(1)
    print("static/vendor matches the registry")


if __name__ == "__main__":
    main()
