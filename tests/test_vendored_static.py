"""static/vendor/ holds exactly the files MANIFEST.json lists, byte for byte (sha256), each package with its licence.

A silent edit of a vendored library, a file dropped in by hand or one gone missing fails here; whether the manifest
itself matches the npm registry is `python scripts/vendor_static.py --check` (it needs the network).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

VENDOR = Path(__file__).resolve().parents[1] / "static" / "vendor"
MANIFEST = json.loads((VENDOR / "MANIFEST.json").read_text())
LISTED = {entry["path"]: entry for package in MANIFEST["packages"] for entry in package["files"]}


def test_every_vendored_file_is_listed_and_every_listed_file_is_there():
    on_disk = {path.relative_to(VENDOR).as_posix() for path in VENDOR.rglob("*") if path.is_file()}
    assert on_disk - {"MANIFEST.json"} == set(LISTED)


@pytest.mark.parametrize("path", sorted(LISTED))
def test_a_vendored_file_is_the_one_its_sha256_names(path):
    data = (VENDOR / path).read_bytes()
    assert hashlib.sha256(data).hexdigest() == LISTED[path]["sha256"], f"static/vendor/{path} was edited"


@pytest.mark.parametrize("package", MANIFEST["packages"], ids=lambda package: package["name"])
def test_each_package_is_pinned_with_its_licence(package):
    assert package["version"].count(".") == 2 and package["version"][0] not in "^~<>=*", package["version"]
    assert package["integrity"].startswith("sha512-")
    names = {Path(entry["path"]).name for entry in package["files"]}
    assert any(name.startswith("LICENSE") for name in names), f"{package['name']}: no licence vendored"
    assert all(entry["path"].startswith(package["dir"] + "/") for entry in package["files"])
