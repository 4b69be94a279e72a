"""A model hub on 127.0.0.1 for the tests: the part of the Hugging Face Hub HTTP API that huggingface_hub's
`snapshot_download` and `hf_hub_download` use (model info, file tree, HEAD/GET of `resolve` URLs).

Point `HF_ENDPOINT` at `HubServer.url`. Repos are plain dicts of file bytes per commit; every request is logged, so a
test can assert which files were fetched.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


@dataclass
class HubRepo:
    """One model repo: files per commit sha, and the refs (branches, tags) that name commits."""

    repo_id: str
    commits: dict[str, dict[str, bytes]]  # commit sha (40 hex) -> repo path -> content
    refs: dict[str, str] = field(default_factory=dict)  # "main", tags -> commit sha
    gated: bool = False  # the API answers, the files need a token (401 GatedRepo), as on the Hub

    def commit_of(self, revision: str) -> str | None:
        """The commit a branch, tag or full sha names; None when the repo has no such revision."""
        if revision in self.commits:
            return revision
        return self.refs.get(revision)


def commit_sha(label: str) -> str:
    """A stable 40-hex commit id for a test commit labelled `label`."""
    return hashlib.sha1(label.encode()).hexdigest()


def repo_from_folder(repo_id: str, folder: Path, *, label: str = "v1", **kwargs) -> HubRepo:
    """A repo whose one commit (`refs/main`) holds the files of `folder` (top level only)."""
    files = {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}
    sha = commit_sha(repo_id + label)
    return HubRepo(repo_id, {sha: files}, {"main": sha}, **kwargs)


class HubServer:
    """A threaded HTTP server answering the Hub API for `repos`; `requests` logs (method, path) of every call."""

    def __init__(self, repos: list[HubRepo]) -> None:
        self.repos = {r.repo_id: r for r in repos}
        self.requests: list[tuple[str, str]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """The endpoint to put in HF_ENDPOINT."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> HubServer:
        """Serve in a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket: later connections are refused."""
        self._server.shutdown()
        self._server.server_close()

    def downloaded(self) -> list[str]:
        """Repo paths fetched with GET from `resolve` URLs, in order."""
        return [
            path.split("/resolve/", 1)[1].split("/", 1)[1]
            for m, path in self.requests
            if m == "GET" and "/resolve/" in path
        ]


def _etag(content: bytes) -> str:
    return '"' + hashlib.sha1(content).hexdigest() + '"'


def _handler_for(hub: HubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name
            pass  # the request log is hub.requests

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def _answer(self, *, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            hub.requests.append((self.command, path))
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                self._api(parts[2] + "/" + parts[3], parts[4:], body)
            elif len(parts) >= 5 and parts[2] == "resolve":
                self._resolve(parts[0] + "/" + parts[1], parts[3], "/".join(parts[4:]), body)
            else:
                self._send(404, {"error": "not found"}, body)

        def _repo_and_commit(self, repo_id: str, revision: str, body: bool) -> tuple[HubRepo, str] | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._send(404, {"error": "Repository not found"}, body, error_code="RepoNotFound")
                return None
            sha = repo.commit_of(revision)
            if sha is None:
                self._send(404, {"error": f"Invalid rev id: {revision}"}, body, error_code="RevisionNotFound")
                return None
            return repo, sha

        def _api(self, repo_id: str, rest: list[str], body: bool) -> None:
            if not rest:  # model info without a revision: the default branch
                rest = ["revision", "main"]
            if rest[:1] == ["revision"] and len(rest) == 2:
                found = self._repo_and_commit(repo_id, rest[1], body)
                if found:
                    repo, sha = found
                    siblings = [{"rfilename": name} for name in sorted(repo.commits[sha])]
                    info = {
                        "id": repo_id,
                        "sha": sha,
                        "private": False,
                        "gated": "auto" if repo.gated else False,
                    }
                    self._send(200, {**info, "siblings": siblings}, body)
            elif rest[:1] == ["tree"] and len(rest) == 2:
                found = self._repo_and_commit(repo_id, rest[1], body)
                if found:
                    repo, sha = found
                    files = repo.commits[sha]
                    entries = [
                        {"type": "file", "path": name, "size": len(data), "oid": _etag(data).strip('"')}
                        for name, data in sorted(files.items())
                    ]
                    self._send(200, entries, body)
            else:
                self._send(404, {"error": "not found"}, body)

        def _resolve(self, repo_id: str, revision: str, filename: str, body: bool) -> None:
            found = self._repo_and_commit(repo_id, revision, body)
            if not found:
                return
            repo, sha = found
            if repo.gated:
                self._send(401, {"error": "Access to this model is restricted"}, body, error_code="GatedRepo")
                return
            data = repo.commits[sha].get(filename)
            if data is None:
                self._send(404, {"error": "Entry not found"}, body, error_code="EntryNotFound", commit=sha)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("ETag", _etag(data))
            self.send_header("X-Repo-Commit", sha)
            self.end_headers()
            if body:
                self.wfile.write(data)

        def _send(
            self, status: int, payload: object, body: bool, *, error_code: str = "", commit: str = ""
        ) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if error_code:
                self.send_header("X-Error-Code", error_code)
                self.send_header("X-Error-Message", str(payload.get("error", "")))  # type: ignore[union-attr]
            if commit:
                self.send_header("X-Repo-Commit", commit)
            self.end_headers()
            if body:
                self.wfile.write(data)

    return Handler
