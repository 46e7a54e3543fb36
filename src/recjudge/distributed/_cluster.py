"""The Ray cluster a job runs on: joining one (``connect``), keeping a one-machine cluster on
127.0.0.1, the environment every worker gets (the driver's cache and settings, never its
secrets), and ``LocalCluster``, the single-node cluster tests, the bench and the README's
one-machine example start and stop by PID."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from recjudge._util import RunFault, cache_dir, first_line, redact_uri

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)


#: ``--ray`` values besides a cluster address
ADDRESS_WORDS = ("auto", "local")


class RayClusterError(RunFault, ConnectionError):
    """The Ray cluster cannot be reached or used (a fault of the whole run)."""


class RayNotInstalledError(RunFault, RuntimeError):
    """``ray[data]`` is not installed in this environment."""


#: Ray's one switch that keeps a node on the loopback address (read when ``ray`` is imported)
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def is_loopback(address: str) -> bool:
    """Whether a ``HOST:PORT`` names this machine's loopback interface."""
    host = address.rpartition(":")[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


def loopback_only() -> None:
    """Keep this process's Ray on 127.0.0.1, so a one-machine cluster is not open to the
    network.

    Ray turns a loopback ``--node-ip-address`` or cluster address into the machine's outward
    address (``services.resolve_ip_for_localhost``) and then listens on every interface with
    no authentication: anyone who reaches the machine can run code in it. Its only switch
    back to 127.0.0.1 is ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (as on macOS), read into
    ``ray_constants.ENABLE_RAY_CLUSTER`` at import; where ``ray`` is imported already that
    constant is set too. It also makes a driver reach a loopback head by 127.0.0.1 (without
    it the driver dials the outward address, which a sandboxed network may not route back).
    A head that does listen outward is still reached (Ray falls back to its one node).
    """
    os.environ[LOOPBACK_ENV] = "0"
    consts = sys.modules.get("ray._private.ray_constants")
    if consts is not None:
        consts.ENABLE_RAY_CLUSTER = False


def _ray() -> Any:
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise RayNotInstalledError(
            "--ray needs Ray Data: pip install 'recjudge[ray]' (or make setup, which installs "
            "the lock's ray)"
        ) from None
    return ray


#: recjudge settings a worker must share with its driver; secrets stay on the driver (a
#: worker needs neither the server key nor a checkpoint or signing key)
_SECRET_ENV = frozenset({"RECJUDGE_API_KEY", "RECJUDGE_CHECKPOINT_KEY", "RECJUDGE_SIGNING_KEY"})


def worker_env_vars() -> dict[str, str]:
    """What every worker of this driver's job gets in its environment: the driver's model
    cache (``RECJUDGE_CACHE``, resolved: a worker that used its own ``~/.cache`` converted the
    model again, silently, and the second waited on the build lock) and every other
    ``RECJUDGE_*`` setting (the forced dtype, ...), secrets left out; and the driver's
    niceness (``RAY_worker_niceness``)."""
    env = {k: v for k, v in os.environ.items()
           if k.startswith("RECJUDGE_") and k not in _SECRET_ENV}  # fmt: skip
    env["RECJUDGE_CACHE"] = str(cache_dir())
    # Ray starts workers at nice 15 (they lost the CPU to anything else running): at the
    # driver's own niceness instead, as Ray's job supervisor does for its drivers
    env["RAY_worker_niceness"] = str(os.nice(0))
    return env


def connect(address: str) -> Any:
    """Join (or for ``local`` start) the Ray cluster at ``address``; returns the ``ray``
    module. Quiet: Ray Data's progress lines are replaced by the judge's own bar."""
    ray = _ray()
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": True}
        if address == "local":
            kwargs.update(include_dashboard=False, _node_ip_address="127.0.0.1")
        else:
            kwargs["address"] = address
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        _probe(address)
        target = _auto_address(ray) if address == "auto" else address
        if address == "local" or is_loopback(target):
            loopback_only()
        # this process's Ray core logs only what stops it (it warns on every run that an
        # actor's constructor arguments live in the object store, which is how Ray Data
        # starts any actor pool)
        os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")
        kwargs["runtime_env"] = {"env_vars": worker_env_vars()}
        try:
            ray.init(**kwargs)
        except (ConnectionError, RuntimeError, ValueError, TimeoutError) as e:
            first = first_line(e)
            raise RayClusterError(
                f"Ray cluster {redact_uri(address)!r} cannot be reached ({redact_uri(first)}); "
                "start one with "
                f"`{LOOPBACK_ENV}=0 ray start --head --node-ip-address 127.0.0.1` (then --ray "
                "auto), give its HOST:PORT, or use --ray local on one machine; a head with "
                f"token authentication also needs {AUTH_MODE_ENV}=token here (and "
                f"{AUTH_TOKEN_PATH_ENV} where its token is not in ~/.ray/auth_token)"
            ) from None
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    for name in ("ray.data", "ray.data._internal"):
        logging.getLogger(name).setLevel(logging.ERROR)
    return ray


def _auto_address(ray: Any) -> str:
    """The head ``--ray auto`` joins, as Ray finds it: ``RAY_ADDRESS``, else the head this
    machine started last (Ray records it under /tmp/ray), else a running one; "" for none."""
    try:
        found = ray._private.services.get_ray_address_from_environment("auto", None)
    except Exception:  # none running: ray.init says so in its own words below
        return ""
    return str(found or "")


def _probe(address: str) -> None:
    """Fail in seconds where nothing listens at a ``HOST:PORT`` (``ray.init`` retries for
    minutes)."""
    if address in ADDRESS_WORDS or "://" in address:
        return
    shown = redact_uri(address)  # user:PASSWORD@host:port prints as user:***@host:port
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise RayClusterError(
            f"--ray {shown!r}: a cluster address is HOST:PORT (the head's `ray start "
            "--head --port`), auto or local"
        )
    if not 1 <= int(port) <= 65535:
        raise RayClusterError(f"--ray {shown}: port {port} is not a TCP port (1-65535); give "
                              "the port the head printed (`ray start --head` says it)")  # fmt: skip
    try:
        with socket.create_connection((host.rpartition("@")[2].strip("[]"), int(port)),
                                      timeout=5):  # fmt: skip
            pass
    except OSError as e:
        raise RayClusterError(
            f"--ray {shown}: nothing answers there ({e.strerror or e}); start the head with "
            f"`ray start --head --port {port}` or check the address"
        ) from None


# -- a local cluster (tests, the bench, the README's one-machine example) -----------------


#: Ray's token authentication: its mode, and where the token is (a file, or the token itself,
#: which wins over the file)
AUTH_MODE_ENV, AUTH_TOKEN_PATH_ENV, AUTH_TOKEN_ENV = (
    "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN")  # fmt: skip


def _reload_ray_auth() -> None:
    """Have this process's Ray read the authentication variables again (it caches them at
    first use; the same two calls as Ray's ``reset_auth_token_state``)."""
    if "ray._raylet" not in sys.modules:
        return  # read when Ray first needs them
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


#: what ``ray start --block`` prints once its head's processes are up
_STARTED = "Ray runtime started"


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 now: every socket stays bound until all are
    chosen, so the kernel cannot hand out one port twice (one at a time it may, and Ray
    refuses two components on one port)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(n):
            s = stack.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            ports.append(int(s.getsockname()[1]))
        return ports


@dataclass
class LocalCluster:
    """A single-node Ray cluster on 127.0.0.1 started with ``ray start --head --block`` and
    stopped by its process: ``with LocalCluster(cpus=2) as c: ... c.address``.

    Its ports are chosen free and bound to 127.0.0.1 only (``loopback_only``); its files go
    under ``temp_dir`` (a short path: Ray's socket names must fit 107 bytes).

    It runs with Ray's token authentication and a token of its own (a 0600 file in a private
    folder, removed by ``stop``), so another user of the machine cannot run code in it and
    what earlier Ray runs left in ``~/.ray/auth_token`` does not change how it starts (Ray
    2.60 turns authentication on for a head wherever that file exists, and off for a driver
    given an explicit address). ``env`` holds what a driver needs (``RAY_ADDRESS`` and the
    authentication variables); the process that starts the cluster is set up as its driver
    (its environment is restored by ``stop``), another process is given ``env``.
    """

    cpus: int = 2
    temp_dir: str | None = None
    timeout_s: float = 120.0
    address: str = ""
    process: subprocess.Popen | None = None
    env: dict[str, str] = field(default_factory=dict)
    _saved_env: dict[str, str | None] = field(default_factory=dict, repr=False)
    _auth_dir: str | None = field(default=None, repr=False)

    def _make_token(self) -> dict[str, str]:
        self._auth_dir = tempfile.mkdtemp(prefix="rj-ray-auth-")
        path = Path(self._auth_dir) / "auth_token"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        return {AUTH_MODE_ENV: "token", AUTH_TOKEN_PATH_ENV: str(path)}

    def _drive_here(self) -> None:
        """Make this process a driver of the cluster (``stop`` undoes it)."""
        self._saved_env = {k: os.environ.get(k) for k in (*self.env, AUTH_TOKEN_ENV)}
        os.environ.pop(AUTH_TOKEN_ENV, None)  # would win over the token file
        os.environ.update(self.env)
        loopback_only()  # also where this process imported ray already (start did)
        _reload_ray_auth()

    def _restore_env(self) -> None:
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if self._saved_env:
            _reload_ray_auth()
        self._saved_env = {}

    def start(self) -> LocalCluster:
        _ray()  # installed, or one line saying how
        bin_dir = Path(sys.executable).parent
        exe = bin_dir / "ray"
        names = (
            "node-manager-port",
            "object-manager-port",
            "dashboard-agent-grpc-port",
            "dashboard-agent-listen-port",
            "metrics-export-port",
            "runtime-env-agent-port",
        )
        port, *others = free_ports(1 + len(names))
        cmd = [str(exe) if exe.exists() else "ray", "start", "--head", "--block",
               f"--port={port}", "--node-ip-address=127.0.0.1", f"--num-cpus={self.cpus}",
               "--num-gpus=0", "--include-dashboard=false", "--disable-usage-stats",
               # every fixed default port chosen free, so two clusters (two test
               # processes) on one machine do not collide
               *(f"--{name}={p}" for name, p in zip(names, others, strict=True))]  # fmt: skip
        if self.temp_dir:
            cmd.append(f"--temp-dir={self.temp_dir}")
        # no dashboard, so no metrics agent: do not have every process retry reaching it;
        # every process of the cluster on 127.0.0.1 only (loopback_only says why)
        cluster = {LOOPBACK_ENV: "0", **self._make_token()}
        env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_enable_metrics_collection="0",
                   **cluster)  # fmt: skip
        env.pop(AUTH_TOKEN_ENV, None)
        logs = Path(self.temp_dir or "/tmp")
        logs.mkdir(parents=True, exist_ok=True)
        self.log_path = logs / f"recjudge-ray-{port}.log"
        self.process = subprocess.Popen(
            cmd, stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT,  # noqa: SIM115
            start_new_session=True, env=env,
        )  # fmt: skip
        self.address = f"127.0.0.1:{port}"
        deadline = time.monotonic() + self.timeout_s
        # Ready when `ray start` says its processes are up and the GCS port answers. Not
        # `ray status`: that also waits for the autoscaler's monitor, which a driver does not
        # need, and starts a Python process a second on the cores the head is starting on.
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code, tail = self.process.returncode, self._log_tail()
                self.stop()
                raise RayClusterError(f"ray start exited ({code}): {tail}")
            if _STARTED in self.log_path.read_text(errors="replace") and _answers(port):
                self.env = {"RAY_ADDRESS": self.address, **cluster}
                self._drive_here()
                return self
            time.sleep(0.5)
        self.stop()
        raise RayClusterError(
            f"the Ray head did not start in {self.timeout_s:.0f} s: {self._log_tail()}"
        )

    def _log_tail(self, lines: int = 6) -> str:
        """The last lines ``ray start`` printed, and where the rest is."""
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            text = []
        return " | ".join(text[-lines:] + [f"full log: {self.log_path}"])

    def pids(self) -> list[int]:
        """The head's process and every process it started (workers included)."""
        if self.process is None:
            return []
        try:
            root = psutil.Process(self.process.pid)
            return [root.pid] + [p.pid for p in root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stop(self) -> None:
        """Disconnect this process's driver from the cluster, SIGTERM the head's process
        group, then SIGKILL whatever of it is left; remove its token."""
        if self.process is None:
            self._forget_token()
            return
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            with contextlib.suppress(Exception):  # a driver of another cluster stays
                if ray.get_runtime_context().gcs_address == self.address:
                    ray.shutdown()
        tree = self.pids()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)
        for pid in tree:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        psutil.wait_procs([p for p in map(_proc, tree) if p is not None], timeout=10)
        self.process = None
        self._forget_token()

    def _forget_token(self) -> None:
        # the environment first: a draining Ray thread in token mode whose file is gone
        # aborts the process (Ray's reset_auth_token_state does it in this order too)
        self._restore_env()
        if self._auth_dir:
            shutil.rmtree(self._auth_dir, ignore_errors=True)
            self._auth_dir = None

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _proc(pid: int) -> Any:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None
