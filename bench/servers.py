"""Server processes for the benchmarks: start on free loopback ports, probe, measure, always stop.

Every server runs as its own process group (``start_new_session``), so stopping it (SIGTERM, then
SIGKILL after a grace period) also stops uvicorn's worker processes when ``--workers`` > 1, and
never touches anything the harness did not start. ``ServerPool`` is a context manager whose exit
stops everything it started, whatever happened.

Measurements read ``/proc``: resident memory (``VmRSS``) and CPU time (per-thread ``schedstat``,
nanoseconds) summed over the server's process and its descendants.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

REPO = Path(__file__).resolve().parent.parent


def git_state(tree: Path = REPO, *, subject: bool = False) -> str:
    """``tree``'s HEAD (short hash, with its subject when asked), plus a mark when its app/ has
    uncommitted changes (a run measures the working tree)."""
    fmt = "%h %s" if subject else "%h"
    try:
        head = subprocess.run(
            ["git", "log", "-1", f"--format={fmt}"], cwd=tree, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "app"],
            cwd=tree,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head[:72] or "unknown") + (" + uncommitted app/ changes" if dirty else "")
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def uvicorn_argv(app: str, port: int, *, workers: int = 1, python: str | None = None) -> list[str]:
    """The same uvicorn command line for every FastAPI target (uvloop + httptools when installed);
    ``python``: another tree's interpreter (``bench.ab``), else this one."""
    return [
        python or sys.executable, "-m", "uvicorn", app, "--factory",
        "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers),
        "--no-access-log", "--log-level", "warning",
    ]  # fmt: skip


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            text = Path(f"/proc/{pid}/task/{tid}/children").read_text()
        except OSError:
            continue
        out.extend(int(x) for x in text.split())
    return out


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (via /proc/PID/task/TID/children)."""
    seen = [pid]
    i = 0
    while i < len(seen):
        seen.extend(c for c in _children(seen[i]) if c not in seen)
        i += 1
    return seen


def rss_kib(pid: int) -> int:
    """Resident memory of one process in KiB (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_s(pid: int) -> float:
    """CPU seconds of one process: nanosecond ``schedstat`` summed over its live threads.

    Falls back to ``stat`` (utime + stime, clock-tick resolution) when schedstat is unavailable.
    Threads that already exited are not in the sum; the servers here keep their threads (event
    loop, executor pool), so a difference over a run is still that run's CPU time.
    """
    try:
        total_ns = 0
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                total_ns += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        return total_ns / 1e9
    except (OSError, ValueError, IndexError):
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


@dataclass
class Server:
    """One started server process (group)."""

    name: str
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    ready_path: str
    ready_body: bytes | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def rss_kib(self) -> int:
        """Resident memory of the server and its workers, in KiB."""
        return sum(rss_kib(p) for p in process_tree(self.pid))

    def cpu_s(self) -> float:
        """CPU seconds used so far by the server and its live workers."""
        return sum(cpu_s(p) for p in process_tree(self.pid))

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def request(self, method: str, path: str, body: bytes | None = None, *, timeout_s: float = 5.0) -> int:
        """One blocking HTTP request; the status code, or 0 when there was no answer."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout_s)
        headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench"}
        try:
            conn.request(method, path, body=body, headers=headers if body is not None else {})
            resp = conn.getresponse()
            resp.read()
            return resp.status
        except (OSError, http.client.HTTPException):
            return 0
        finally:
            conn.close()

    def probe(self, timeout_s: float = 2.0) -> bool:
        """One readiness request: True on a 200 answer."""
        method = "GET" if self.ready_body is None else "POST"
        return self.request(method, self.ready_path, self.ready_body, timeout_s=timeout_s) == 200

    def stop(self, grace_s: float = 5.0) -> None:
        if self.proc.poll() is not None:
            return
        had_workers = len(process_tree(self.proc.pid)) > 1
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=grace_s)
        if had_workers:
            # Workers left in the group after the parent exited (the group outlives its leader
            # while a member lives, so this id is still ours).
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)


class ServerPool:
    """Starts servers, waits until they answer, and stops every one of them on exit."""

    def __init__(self, log_dir: Path | None = None) -> None:
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if log_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="ctxproxy-bench-")
            log_dir = Path(self._tmp.name)
        self.log_dir = log_dir
        self.servers: dict[str, Server] = {}

    def __enter__(self) -> ServerPool:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop_all()
        if self._tmp is not None:
            self._tmp.cleanup()

    def start(
        self,
        name: str,
        argv: list[str],
        *,
        port: int,
        env: dict[str, str] | None = None,
        ready_path: str,
        ready_body: bytes | None = None,
        cwd: Path | None = None,
    ) -> Server:
        """Start ``argv`` in ``cwd`` (default: this repository) as its own process group."""
        log_path = self.log_dir / f"{name}.log"
        full_env = {**os.environ, **(env or {})}
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                argv,
                cwd=cwd or REPO,
                env=full_env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        server = Server(name, port, proc, log_path, ready_path, ready_body, env or {})
        self.servers[name] = server
        return server

    def wait_ready(self, names: list[str] | None = None, *, timeout_s: float = 60.0) -> None:
        """Block until every named server answers its probe; raise with its log tail otherwise."""
        pending = [self.servers[n] for n in (names or list(self.servers))]
        deadline = time.monotonic() + timeout_s
        while pending:
            for server in list(pending):
                if server.proc.poll() is not None:
                    raise RuntimeError(
                        f"{server.name} exited ({server.proc.returncode}):\n{server.log_tail()}"
                    )
                if server.probe():
                    pending.remove(server)
            if pending and time.monotonic() > deadline:
                names_left = ", ".join(s.name for s in pending)
                raise RuntimeError(f"not ready after {timeout_s}s: {names_left}\n{pending[0].log_tail()}")
            if pending:
                time.sleep(0.1)

    def stop(self, name: str) -> None:
        server = self.servers.pop(name, None)
        if server is not None:
            server.stop()

    def stop_all(self) -> None:
        for name in list(self.servers):
            self.stop(name)
