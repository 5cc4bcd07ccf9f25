"""A fake Hugging Face Hub on 127.0.0.1 that the real huggingface_hub client talks to.

It serves what push/pull/fetch use: create repo, create branch, preupload (answering "regular" for
every file, so content travels base64 inside the commit NDJSON and no LFS/xet upload happens),
commit, revision info, tree listing, and HEAD/GET /resolve with the headers the client checks
(X-Repo-Commit, ETag = git blob sha1, Content-Length, X-Error-Code on 404s). Repos live in memory
with real commit shas. Every request is logged so tests can count them.
"""
from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from aotc.loader.manifest import Entry, Manifest, Target

TOKEN = "hf_fake_aotc_test_token"


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub:
    def __init__(self):
        self.lock = threading.Lock()
        self.reset()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def reset(self):
        self.repos: dict[str, dict] = {}  # repo -> {"branches": {name: sha}, "commits": {sha: {path: bytes}}}
        self.requests: list[tuple[str, str]] = []
        self.stall_once: set[str] = set()  # repo paths whose next GET sends half, then hangs until released
        self.stalled = threading.Event()
        self.release = threading.Event()
        self.get_delay = 0.0
        self._n = 0

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    # -- state -------------------------------------------------------------------------------
    def resolve(self, repo: str, rev: str) -> str | None:
        r = self.repos[repo]
        if rev in r["branches"]:
            return r["branches"][rev]
        return rev if rev in r["commits"] else None

    def files(self, repo: str, rev: str) -> dict[str, bytes]:
        return self.repos[repo]["commits"][self.resolve(repo, rev)]

    def commit(self, repo: str, branch: str, changes: dict[str, bytes | None], message: str) -> str:
        r = self.repos[repo]
        parent = r["branches"].get(branch)
        files = dict(r["commits"][parent]) if parent else {}
        for path, data in changes.items():
            if data is None:
                files.pop(path, None)
            else:
                files[path] = data
        self._n += 1
        h = hashlib.sha1(f"{parent}\n{message}\n{self._n}\n".encode())
        for path in sorted(files):
            h.update(f"{path} {git_blob_sha1(files[path])}\n".encode())
        sha = h.hexdigest()
        r["commits"][sha] = files
        r["branches"][branch] = sha
        return sha

    def requests_matching(self, text: str) -> list[tuple[str, str]]:
        return [r for r in self.requests if text in r[1]]


def _handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # keep pytest output clean
            pass

        def do_HEAD(self):
            self._dispatch("HEAD")

        def do_GET(self):
            self._dispatch("GET")

        def do_POST(self):
            self._dispatch("POST")

        # -- plumbing ----------------------------------------------------------------------
        def _dispatch(self, method):
            with hub.lock:
                hub.requests.append((method, self.path))
            length = int(self.headers.get("Content-Length") or 0)
            self.body = self.rfile.read(length) if length else b""
            url = urlsplit(self.path)
            self.query = parse_qs(url.query)
            parts = [unquote(p) for p in url.path.strip("/").split("/")]
            try:
                if parts[:3] == ["api", "repos", "create"] and method == "POST":
                    return self._create_repo()
                if parts[:2] == ["api", "models"] and len(parts) >= 4:
                    repo, action, rest = f"{parts[2]}/{parts[3]}", parts[4] if len(parts) > 4 else "", parts[5:]
                    return self._api(method, repo, action, rest)
                if len(parts) >= 5 and parts[2] == "resolve" and method in ("HEAD", "GET"):
                    return self._resolve(method, f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]))
            except _Reply as reply:
                return self._send(reply.status, reply.body, reply.headers, head_only=method == "HEAD")
            self._send(404, {"error": f"fake hub: no route for {method} {self.path}"}, head_only=method == "HEAD")

        def _send(self, status, body=b"", headers=None, head_only=False):
            if not isinstance(body, bytes):
                body = json.dumps(body).encode()
                headers = {"Content-Type": "application/json", **(headers or {})}
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head_only:
                self.wfile.write(body)

        def _repo(self, repo):
            if repo not in hub.repos:
                raise _Reply(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
            return hub.repos[repo]

        def _sha(self, repo, rev):
            self._repo(repo)
            sha = hub.resolve(repo, rev)
            if sha is None:
                raise _Reply(404, {"error": f"Invalid rev id: {rev}"}, {"X-Error-Code": "RevisionNotFound"})
            return sha

        def _need_token(self):
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                raise _Reply(401, {"error": "Invalid credentials in Authorization header"},
                             {"X-Error-Message": "Invalid credentials in Authorization header"})

        # -- endpoints ---------------------------------------------------------------------
        def _create_repo(self):
            self._need_token()
            doc = json.loads(self.body)
            repo = f"{doc['organization']}/{doc['name']}"
            with hub.lock:
                if repo in hub.repos:
                    raise _Reply(409, {"error": "You already created this model repo", "url": f"{hub.url}/{repo}"})
                hub.repos[repo] = {"branches": {}, "commits": {}}
                hub.commit(repo, "main", {".gitattributes": b"*.bin filter=lfs diff=lfs merge=lfs -text\n"},
                           "initial commit")
            self._send(200, {"url": f"{hub.url}/{repo}", "name": repo})

        def _api(self, method, repo, action, rest):
            if method == "GET" and action in ("", "revision"):
                rev = rest[0] if rest else "main"
                sha = self._sha(repo, rev)
                files = hub.repos[repo]["commits"][sha]
                return self._send(200, {"id": repo, "modelId": repo, "sha": sha, "private": False,
                                        "lastModified": "2025-01-01T00:00:00.000Z",
                                        "siblings": [{"rfilename": p} for p in sorted(files)]})
            if method == "GET" and action == "tree":
                return self._tree(repo, rest[0], "/".join(rest[1:]))
            if method == "POST" and action == "preupload":
                self._need_token()
                files = hub.files(repo, self._sha(repo, rest[0]))
                return self._send(200, {"files": [
                    {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False,
                     "oid": git_blob_sha1(files[f["path"]]) if f["path"] in files else None}
                    for f in json.loads(self.body)["files"]]})
            if method == "POST" and action == "commit":
                return self._commit(repo, rest[0])
            if method == "POST" and action == "branch":
                self._need_token()
                start = (json.loads(self.body or b"{}") or {}).get("startingPoint") or "main"
                with hub.lock:
                    if rest[0] in self._repo(repo)["branches"]:
                        raise _Reply(409, {"error": "Reference already exists"})
                    hub.repos[repo]["branches"][rest[0]] = self._sha(repo, start)
                return self._send(200, {})
            raise _Reply(404, {"error": f"fake hub: no api {method} {action}"})

        def _tree(self, repo, rev, prefix):
            files = hub.files(repo, self._sha(repo, rev))
            recursive = self.query.get("recursive", ["false"])[0].lower() == "true"
            base = prefix + "/" if prefix else ""
            out, folders = [], set()
            for path in sorted(files):
                if not path.startswith(base):
                    continue
                tail = path[len(base):]
                if "/" in tail and not recursive:
                    folders.add(base + tail.split("/")[0])
                    continue
                if recursive:
                    parents = tail.split("/")[:-1]
                    folders.update(base + "/".join(parents[:i + 1]) for i in range(len(parents)))
                out.append({"type": "file", "path": path, "oid": git_blob_sha1(files[path]),
                            "size": len(files[path])})
            out += [{"type": "directory", "path": f, "oid": hashlib.sha1(f.encode()).hexdigest()}
                    for f in sorted(folders)]
            self._send(200, out)

        def _commit(self, repo, branch):
            self._need_token()
            if branch not in self._repo(repo)["branches"]:
                raise _Reply(404, {"error": f"Invalid rev id: {branch}"}, {"X-Error-Code": "RevisionNotFound"})
            lines = [json.loads(line) for line in self.body.splitlines() if line.strip()]
            header = lines[0]["value"]
            changes: dict[str, bytes | None] = {}
            current = hub.files(repo, branch)
            for item in lines[1:]:
                key, value = item["key"], item["value"]
                if key == "file":
                    changes[value["path"]] = base64.b64decode(value["content"])
                elif key == "deletedFile":
                    if value["path"] not in current:
                        raise _Reply(404, {"error": "A file with this name doesn't exist"},
                                     {"X-Error-Code": "EntryNotFound"})
                    changes[value["path"]] = None
                elif key == "deletedFolder":
                    changes.update({p: None for p in current if p.startswith(value["path"].rstrip("/") + "/")})
                else:
                    raise _Reply(400, {"error": f"fake hub does not take {key!r} (expected regular uploads)"})
            with hub.lock:
                sha = hub.commit(repo, branch, changes, header["summary"])
            self._send(200, {"commitUrl": f"{hub.url}/{repo}/commit/{sha}", "commitOid": sha,
                             "pullRequestUrl": None})

        def _resolve(self, method, repo, rev, path):
            sha = self._sha(repo, rev)
            files = hub.repos[repo]["commits"][sha]
            if path not in files:
                raise _Reply(404, {"error": "Entry not found"},
                             {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": sha})
            data = files[path]
            headers = {"X-Repo-Commit": sha, "ETag": f'"{git_blob_sha1(data)}"',
                       "Content-Type": "application/octet-stream"}
            if method == "HEAD":
                return self._send(200, data, headers, head_only=True)
            if hub.get_delay:
                time.sleep(hub.get_delay)
            with hub.lock:
                stall = path in hub.stall_once
                hub.stall_once.discard(path)
            if stall:  # promise the whole file, send half, hang (the client gets killed meanwhile)
                self.send_response(200)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                hub.stalled.set()
                hub.release.wait(60)
                self.close_connection = True
                return
            self._send(200, data, headers)

    return Handler


class _Reply(Exception):
    def __init__(self, status, body, headers=None):
        self.status, self.body, self.headers = status, body, headers


@pytest.fixture(scope="session")
def _hub_server():
    server = FakeHub()
    yield server
    server.close()


@pytest.fixture
def hub(_hub_server, tmp_path, monkeypatch):
    """The fake hub, emptied, with huggingface_hub and aotc pointed at it and at an empty cache."""
    server = _hub_server
    server.reset()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf_home" / "hub"))
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "AOTC_NO_DOWNLOAD", "AOTC_ARTIFACTS",
                 "HUGGINGFACE_HUB_CACHE", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    import huggingface_hub.constants as hf_constants

    # huggingface_hub read these at import (older versions also copied the URL template into
    # file_download): one server for the whole session keeps every copy pointing at it.
    monkeypatch.setattr(hf_constants, "ENDPOINT", server.url)
    monkeypatch.setattr(hf_constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        server.url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hf_home" / "hub"))
    yield server
    server.release.set()


def make_target(root: Path, name: str, n_entries: int = 2, seed: int = 0) -> Path:
    """A fake built target folder: random bytes stand in for cubins, with a correct manifest."""
    import random

    rng = random.Random(f"{name}-{seed}")
    folder = root / name
    (folder / "bin").mkdir(parents=True, exist_ok=True)
    entries = []
    for i in range(n_entries):
        data = bytes(rng.getrandbits(8) for _ in range(rng.randint(300, 3000)))
        digest = hashlib.sha256(data).hexdigest()
        (folder / "bin" / f"{digest}.cubin").write_bytes(data)
        entries.append(Entry(
            kernel="decode_split", key=f"decode_split(head_dim={64 * (i + 1)})@aligned", path=f"bin/{digest}.cubin",
            sha256=digest, size=len(data), symbol="decode_split_kernel", params=["*fp16", "i32"],
            param_names=["q", "n"], divisible=["q"], num_warps=4, num_stages=2, num_ctas=1, cluster_dims=[1, 1, 1],
            shared=0, global_scratch_size=0, global_scratch_align=1, profile_scratch_size=0,
            profile_scratch_align=1, launch_cooperative_grid=False, launch_pdl=False,
            constexprs={"HEAD_DIM": 64 * (i + 1)}))
    manifest = Manifest(Target.from_name(name), "0.1.0", "3.6.0", entries)
    (folder / "manifest.json").write_text(manifest.to_json())
    return folder


@pytest.fixture(name="make_target")
def make_target_fixture():
    return make_target


@pytest.fixture
def artifacts(tmp_path):
    """An artifacts folder with built sm90 and sm80 targets."""
    root = tmp_path / "artifacts"
    make_target(root, "sm90")
    make_target(root, "sm80")
    return root

