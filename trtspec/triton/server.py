"""Start and stop a real Triton Inference Server on this machine, loopback only.

The server comes from the ``nvidia-pytriton`` wheel, which carries a real ``tritonserver`` binary and the
python backend. Three things have to be right for the python backend to work outside NVIDIA's container
(each one was seen failing otherwise):

1. the python backend looks for ``triton_python_backend_stub`` *next to* ``libtriton_python.so``, so the
   wheel's server tree is copied once to a writable place and the stub for this Python is put there;
2. the stub embeds libpython: this interpreter's LIBDIR goes first on ``LD_LIBRARY_PATH`` (else it binds
   another libpython against another stdlib) and this environment's ``bin`` goes first on ``PATH`` (that is
   how the embedded interpreter finds the environment's site-packages);
3. the wheel's bundled shared libraries (``nvidia_pytriton.libs``) go on ``LD_LIBRARY_PATH``.

``TritonServer`` is a context manager: it starts the process in its own process group, waits until the
server and every model report ready, and on exit (or error, or Ctrl-C) stops the whole group.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from trtspec.errors import UsageError

PYTRITON_REQUIREMENT = "nvidia-pytriton==0.7.0"
LOOPBACK = "127.0.0.1"


def free_ports(n: int, taken: tuple[int, ...] = ()) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 right now, none of them in ``taken``.

    Every socket stays bound until all are picked: asking the OS for one port at a time can hand back the
    same port twice (seen in CI: HTTP and metrics on one port, and the server refused to start)."""
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < n:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(s)
            s.bind((LOOPBACK, 0))
            port = int(s.getsockname()[1])
            if port not in taken and port not in ports:
                ports.append(port)
    finally:
        for s in held:
            s.close()
    return ports


@dataclass(frozen=True)
class ServerDist:
    """A runnable Triton tree: the binary, a backend dir with the stub in it, and the env it needs."""

    root: Path
    binary: Path
    backends: Path
    caches: Path
    env: dict[str, str]


def _pytriton_dir() -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0]) / "tritonserver"
    return root if (root / "bin" / "tritonserver").exists() else None


def _default_dist_dir() -> Path:
    """Where the writable copy lives: inside the active environment if writable, else the user cache."""
    pyver = "{}.{}".format(*sys.version_info[:2])
    candidates = [
        Path(sys.prefix) / "share" / "trtspec" / f"tritonserver-py{pyver}",
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "trtspec" / f"tritonserver-py{pyver}",
    ]
    for c in candidates:
        try:
            c.parent.mkdir(parents=True, exist_ok=True)
            if os.access(c.parent, os.W_OK):
                return c
        except OSError:
            continue
    return candidates[-1]


def install_pytriton() -> None:
    """Install the wheel that carries the server into this interpreter's environment (explicit opt-in)."""
    subprocess.run([sys.executable, "-m", "pip", "install", PYTRITON_REQUIREMENT], check=True)


def find_server(dist_dir: Path | None = None, install: bool = False) -> ServerDist:
    """Locate the server in the nvidia-pytriton wheel and prepare its writable copy (idempotent)."""
    src = _pytriton_dir()
    if src is None and install:
        install_pytriton()
        src = _pytriton_dir()
    if src is None:
        raise UsageError(
            "the Triton server is not installed in this environment",
            fix=f"pip install '{PYTRITON_REQUIREMENT}' (or pass --install)",
        )
    pyver = "{}.{}".format(*sys.version_info[:2])
    stub_src = src / "python_backend_stubs" / pyver / "triton_python_backend_stub"
    if not stub_src.exists():
        raise UsageError(
            f"the nvidia-pytriton wheel has no python backend stub for Python {pyver}",
            path=src / "python_backend_stubs",
            fix="use Python 3.8-3.13",
        )
    dist = Path(dist_dir) if dist_dir else _default_dist_dir()
    stub = dist / "backends" / "python" / "triton_python_backend_stub"
    marker = dist / ".source"
    if not (stub.exists() and marker.exists() and marker.read_text() == str(src)):
        # Build the copy next to its final place and rename, so a half-copied tree is never used.
        dist.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tritonserver-", dir=dist.parent))
        try:
            tree = tmp / "t"
            shutil.copytree(src, tree, ignore=shutil.ignore_patterns("python_backend_stubs", "__pycache__"))
            shutil.copy2(stub_src, tree / "backends" / "python" / "triton_python_backend_stub")
            (tree / ".source").write_text(str(src))
            if dist.exists():
                shutil.rmtree(dist)
            os.replace(tree, dist)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    libs = src.parent.parent / "nvidia_pytriton.libs"
    pylib = sysconfig.get_config_var("LIBDIR") or ""
    env = dict(os.environ)
    ld = [p for p in (pylib, str(libs), env.get("LD_LIBRARY_PATH", "")) if p]
    env["LD_LIBRARY_PATH"] = ":".join(ld)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    # the python stubs run torch: on shared or small machines spin-waiting OpenMP threads cost more than
    # they save (seen: 10x slower small ops under load)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return ServerDist(
        root=dist, binary=dist / "bin" / "tritonserver", backends=dist / "backends", caches=dist / "caches", env=env
    )


def _http_ok(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except (urllib.error.URLError, ConnectionError, OSError):
        return False


def _stat_fields(pid: int | str) -> list[str]:
    """/proc/PID/stat after the command name (state, ppid, ...); the name may itself hold spaces and ')'."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def python_stubs(server_pid: int) -> dict[int, str]:
    """The python-backend stub processes a server runs: pid -> the model each one serves (from its command
    line, ``triton_python_backend_stub REPO/MODEL/VERSION/model.py ...``)."""
    stubs: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int(_stat_fields(entry.name)[1])
            args = (entry / "cmdline").read_bytes().split(b"\0") if ppid == server_pid else []
        except (OSError, ValueError, IndexError):
            continue
        if len(args) > 1 and args[0].endswith(b"triton_python_backend_stub"):
            stubs[int(entry.name)] = Path(args[1].decode(errors="replace")).parent.parent.name
    return stubs


def _dead(pid: int) -> bool:
    """Exited (a zombie its parent has not reaped) or gone."""
    try:
        return _stat_fields(pid)[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


@dataclass
class TritonServer:
    """A tritonserver process serving ``repo`` on 127.0.0.1; use as ``with TritonServer(repo) as s: ...``.

    Ports default to free ones picked by the OS. ``log_path`` collects the server's stdout/stderr (the
    tail is quoted in errors, so a model that fails to load says why).
    """

    repo: Path
    http_port: int = 0
    grpc_port: int = 0
    metrics_port: int = 0
    log_path: Path | None = None
    extra_args: list[str] = field(default_factory=list)
    startup_timeout_s: float = 120.0
    install: bool = False
    log_verbose: int = 0
    #: how long Triton may wait at shutdown for open requests/streams before it unloads anyway
    exit_timeout_s: int = 5
    #: how often the watchdog looks at the python stubs (0: no watchdog)
    watch_every_s: float = 1.0
    proc: subprocess.Popen | None = field(default=None, init=False, repr=False)
    #: why the watchdog stopped the server (None while it runs or after a normal stop)
    failure: str | None = field(default=None, init=False)

    @property
    def http_url(self) -> str:
        return f"{LOOPBACK}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{LOOPBACK}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{LOOPBACK}:{self.metrics_port}/metrics"

    def command(self, dist: ServerDist) -> list[str]:
        return [
            str(dist.binary),
            f"--model-repository={Path(self.repo).resolve()}",
            f"--backend-directory={dist.backends}",
            f"--cache-directory={dist.caches}",
            f"--http-address={LOOPBACK}",
            f"--http-port={self.http_port}",
            f"--grpc-address={LOOPBACK}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-address={LOOPBACK}",
            f"--metrics-port={self.metrics_port}",
            f"--log-verbose={self.log_verbose}",
            f"--exit-timeout-secs={self.exit_timeout_s}",
            *self.extra_args,
        ]

    def start(self) -> TritonServer:
        repo = Path(self.repo)
        if not repo.is_dir():
            raise UsageError("model repository not found", path=repo, fix="run `trtspec triton emit` first")
        dist = find_server(install=self.install)
        given = tuple(p for p in (self.http_port, self.grpc_port, self.metrics_port) if p)
        picked = iter(free_ports(3, taken=given))
        self.http_port = self.http_port or next(picked)
        self.grpc_port = self.grpc_port or next(picked)
        self.metrics_port = self.metrics_port or next(picked)
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="tritonserver-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        log = open(self.log_path, "ab")
        try:
            # Own process group: stop() signals the server and every python stub it spawned.
            self.proc = subprocess.Popen(
                self.command(dist),
                env=dist.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log.close()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        if self.watch_every_s > 0:
            # the stubs are looked up here, once every model is ready: a stub that dies before the thread's
            # first look is a zombie without a command line, which no later look could tell apart
            stubs = python_stubs(self.proc.pid)
            threading.Thread(
                target=self._watch, args=(self.proc, stubs), daemon=True, name="tritonserver-watchdog"
            ).start()
        return self

    def _watch(self, proc: subprocess.Popen, stubs: dict[int, str]) -> None:
        """Stop the server when one of its python stubs dies. Triton 2.51 neither reaps nor restarts a dead
        stub: requests to its model fail from then on, and a decoupled BLS call waiting on it hangs forever
        (seen: a BLS stub's segfault left every later stream waiting). A server that is gone is one a
        supervisor restarts and clients see at once; one that hangs is neither."""
        while self.proc is proc and proc.poll() is None:
            time.sleep(self.watch_every_s)
            dead = [(pid, model) for pid, model in stubs.items() if _dead(pid)]
            if dead and self.proc is proc and proc.poll() is None:
                pid, model = dead[0]
                self.failure = (
                    f"the python backend stub of model {model!r} (pid {pid}) died; Triton does not restart it, "
                    "so the server was stopped"
                )
                try:
                    os.killpg(os.getpgid(proc.pid), signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                return

    def log_tail(self, n: int = 40) -> str:
        """The end of the server's log, for errors. A server that rejects its command line prints its whole
        usage (400 lines) and then the reason: only the reason is quoted."""
        try:
            lines = Path(self.log_path).read_text(errors="replace").splitlines() if self.log_path else []
        except OSError:
            return ""
        while lines and not lines[-1].strip():
            lines.pop()
        if lines and lines[0].startswith("Usage: tritonserver"):
            blanks = [i for i, line in enumerate(lines) if not line.strip()]
            lines = lines[blanks[-1] + 1 :] if blanks else lines
        return "\n".join(lines[-n:])

    def wait_ready(self) -> None:
        """Poll /v2/health/ready (true only once every model loaded) until it answers or the process dies."""
        deadline = time.monotonic() + self.startup_timeout_s
        url = f"http://{self.http_url}/v2/health/ready"
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise UsageError(
                    f"tritonserver exited with code {self.proc.returncode} while starting; "
                    f"log {self.log_path}:\n{self.log_tail()}",
                    path=self.repo,
                )
            if _http_ok(url):
                return
            time.sleep(0.2)
        raise UsageError(
            f"tritonserver not ready after {self.startup_timeout_s:.0f} s; log {self.log_path}:\n{self.log_tail()}",
            path=self.repo,
        )

    def is_alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float | None = None) -> int | None:
        """SIGINT the server (it drains and unloads), then SIGKILL the group once the timeout has passed."""
        timeout_s = self.exit_timeout_s + 5 if timeout_s is None else timeout_s
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        try:
            pgid = os.getpgid(proc.pid)
        except ProcessLookupError:
            pgid = None
        if proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        if pgid is not None:  # the stubs too, even if the server itself already exited
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        if pgid is not None:  # SIGKILL is asynchronous: wait until the whole group is really gone
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    os.killpg(pgid, 0)
                except (ProcessLookupError, PermissionError):
                    break
                time.sleep(0.05)
        return proc.returncode

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
