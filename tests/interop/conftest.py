"""Fixtures: a real MLServer serving mlserver_models/, a real KServe ModelServer serving
kserve/addsub_server.py, and tensorgate in front of either or in front of its built-in
models. Every server listens on free ports of 127.0.0.1 only, every wait is bounded in time
and in polls, processes are killed at teardown, and their logs are printed when a test fails.

Fixtures:
  mlserver, gateway_mlserver, gateway_builtin,
  kserve, gateway_kserve                       -> Server(url="127.0.0.1:PORT", metrics_url, ...)
  mlserver_client, gw_ml, gw_builtin, gw_ks    -> tritonclient.http.InferenceServerClient
  kserve_outage                                -> KServeBehindGateway (a private pair whose
                                                  KServe a test may kill and restart)

The REST fixtures above run with the gRPC listener off (--grpc-listen ""). With it on
(Server.grpc_url = "127.0.0.1:PORT"), for test_grpc.py:
  grpc_gateway_builtin, grpc_gateway_mlserver,
  workers (three `tensorgate worker`s), grpc_gateway_fleet (in front of those three)
                                               -> Server
  grpc_builtin, grpc_ml, grpc_fleet            -> tritonclient.grpc.InferenceServerClient
  launch_gateway                               -> GatewayLauncher: starts a gRPC gateway with
                                                  its own config, env or TLS, on demand

ONNX (test_onnx_repository.py), REST only:
  onnx_worker                                  -> Server, plus .repo: a `tensorgate worker` on
                                                  a private copy of tests/fixtures/onnx/repo
  gateway_onnx                                 -> Server: tensorgate in front of that worker

KServe runs with the Python of its own venv (.venv-kserve; scripts/test.sh makes it):
$TG_KSERVE_PYTHON, else .venv-kserve/bin/python. Its tests skip when neither is set up, and
fail when TG_KSERVE_PYTHON names a Python that is not there.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import grpc
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

import interop_util as util
from interop_util import ManagedProcess

MLSERVER_MODEL_NAMES = ("simple", "identity_fp32")
BUILTIN_WAIT_MODELS = ("simple", "identity_fp32")
BUILTIN_GRPC_WAIT_MODELS = ("simple", "identity_fp32", "accumulate", "classifier")
KSERVE_MODEL_NAMES = ("addsub", "double", "half")
KSERVE_SERVER = util.INTEROP_DIR / "kserve" / "addsub_server.py"
ONNX_REPO = util.REPO_ROOT / "tests" / "fixtures" / "onnx" / "repo"
ONNX_WAIT_MODELS = ("mlp", "cnn", "intbool")


@dataclass
class Server:
    name: str
    url: str  # host:port, the form tritonclient wants
    proc: ManagedProcess
    metrics_url: Optional[str] = None
    grpc_url: Optional[str] = None  # host:port of the gRPC listener, when it is on
    repo: Optional[Path] = None  # the model repository of a worker started with one

    @property
    def base(self) -> str:
        return f"http://{self.url}"

    def stop(self) -> None:
        self.proc.stop()


def _start_mlserver(work_dir: Path) -> Iterator[Server]:
    # A copy of the models, so MLServer's imports leave nothing in the source tree.
    models = work_dir / "models"
    shutil.copytree(util.MLSERVER_MODELS, models)
    http_port, grpc_port, metrics_port = util.free_ports(3)
    # Ports come from the environment (settings.json sets none). gRPC cannot be turned off
    # in MLServer 1.7, so it gets a free port; the metrics server is off
    # ("metrics_endpoint": null) but gets a free port anyway.
    env = {
        "MLSERVER_HOST": "127.0.0.1",
        "MLSERVER_HTTP_PORT": str(http_port),
        "MLSERVER_GRPC_PORT": str(grpc_port),
        "MLSERVER_METRICS_PORT": str(metrics_port),
        "MLSERVER_PARALLEL_WORKERS": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    proc = ManagedProcess("mlserver", [util.mlserver_bin(), "start", str(models)],
                          work_dir / "mlserver.log", env=env, cwd=work_dir)
    server = Server("mlserver", f"127.0.0.1:{http_port}", proc)
    try:
        proc.wait_http_ok(f"{server.base}/v2/health/ready")
        for model in MLSERVER_MODEL_NAMES:
            proc.wait_http_ok(f"{server.base}/v2/models/{model}/ready")
        yield server
    finally:
        proc.stop()


def _binary() -> Path:
    binary = util.tensorgate_bin()
    if not binary.exists():
        if os.environ.get("TENSORGATE_BIN"):
            pytest.fail(f"TENSORGATE_BIN={binary} does not exist")
        pytest.skip(f"{binary} not built (run cargo build, or set TENSORGATE_BIN)")
    return binary


def _start_tensorgate(work_dir: Path, name: str, backends: Sequence[str],
                      wait_models: Sequence[str], with_grpc: bool = False,
                      config: Optional[str] = None, env: Optional[Dict[str, str]] = None,
                      tls_ca: Optional[Path] = None,
                      tls_client: Optional[Tuple[Path, Path]] = None) -> Iterator[Server]:
    """`tensorgate serve` on free ports of 127.0.0.1, with the gRPC listener off unless
    `with_grpc`. `config` is the text of a config file (the command line's listeners and
    backends override it); `tls_ca` is the CA of its [server.tls] certificate, with which
    readiness is checked over gRPC (a TLS gateway answers no plain REST), and `tls_client`
    the (certificate, key) to show when it asks for one (mTLS)."""
    binary = _binary()
    port, metrics_port, grpc_port = util.free_ports(3)
    argv = [str(binary), "serve"]
    if config is not None:
        path = work_dir / f"{name}.toml"
        path.write_text(config)
        argv += ["--config", str(path)]
    argv += ["--listen", f"127.0.0.1:{port}",
             "--metrics-listen", f"127.0.0.1:{metrics_port}",
             "--grpc-listen", f"127.0.0.1:{grpc_port}" if with_grpc else ""]
    for backend in backends:
        argv += ["--backend", backend]
    full_env = {"RUST_BACKTRACE": "1", "RUST_LOG": os.environ.get("RUST_LOG", "info")}
    full_env.update(env or {})
    # cwd = repo root: the embedded default config names label files relative to it.
    proc = ManagedProcess(name, argv, work_dir / f"{name}.log", env=full_env, cwd=util.REPO_ROOT)
    # A TLS client must name the host its certificate was issued for.
    grpc_host = "localhost" if tls_ca else "127.0.0.1"
    server = Server(name, f"127.0.0.1:{port}", proc, metrics_url=f"127.0.0.1:{metrics_port}",
                    grpc_url=f"{grpc_host}:{grpc_port}" if with_grpc else None)
    try:
        if with_grpc:
            # Health and ModelReady are exempt from auth, as REST's model readiness is.
            creds = None
            if tls_ca:
                cert, key = tls_client or (None, None)
                creds = grpc.ssl_channel_credentials(
                    tls_ca.read_bytes(), private_key=key.read_bytes() if key else None,
                    certificate_chain=cert.read_bytes() if cert else None)
            proc.wait_grpc_ready(server.grpc_url, wait_models, creds)
            if tls_ca is None:
                proc.wait_http_ok(f"{server.base}/v2/health/ready")
        else:
            proc.wait_http_ok(f"{server.base}/v2/health/ready")
            # The gateway learns models from its backends; wait until it knows ours.
            for model in wait_models:
                proc.wait_http_ok(f"{server.base}/v2/models/{model}/ready")
        yield server
    finally:
        proc.stop()


def _start_worker(work_dir: Path, name: str, extra_args: Sequence[str] = (),
                  wait_models: Sequence[str] = BUILTIN_GRPC_WAIT_MODELS) -> Iterator[Server]:
    """`tensorgate worker`: the built-in models over REST (a worker has no gRPC listener),
    with `extra_args` (e.g. --model-repository DIR) after its --listen."""
    binary = _binary()
    (port,) = util.free_ports(1)
    argv = [str(binary), "worker", "--listen", f"127.0.0.1:{port}", *extra_args]
    env = {"RUST_BACKTRACE": "1", "RUST_LOG": os.environ.get("RUST_LOG", "info")}
    proc = ManagedProcess(name, argv, work_dir / f"{name}.log", env=env, cwd=util.REPO_ROOT)
    server = Server(name, f"127.0.0.1:{port}", proc)
    try:
        proc.wait_http_ok(f"{server.base}/v2/health/ready")
        for model in wait_models:
            proc.wait_http_ok(f"{server.base}/v2/models/{model}/ready")
        yield server
    finally:
        proc.stop()


class GatewayLauncher:
    """Starts gRPC-enabled gateways on demand: `launch(name, backends, wait_models,
    config=..., env=..., tls_ca=...)` returns a ready Server. Each is stopped by
    `server.stop()` or, at the latest, at the end of the session."""

    def __init__(self, tmp_path_factory):
        self._tmp = tmp_path_factory
        self._running: List[Iterator[Server]] = []

    def __call__(self, name: str, backends: Sequence[str] = ("builtin",),
                 wait_models: Sequence[str] = BUILTIN_WAIT_MODELS, **kwargs) -> Server:
        gen = _start_tensorgate(self._tmp.mktemp(name), name, list(backends), wait_models,
                                with_grpc=True, **kwargs)
        server = next(gen)  # on failure its finally has stopped the process
        self._running.append(gen)
        return server

    def close(self) -> None:
        for gen in reversed(self._running):
            gen.close()


def _kserve_python() -> Path:
    """The Python of .venv-kserve: $TG_KSERVE_PYTHON, else .venv-kserve/bin/python."""
    env = os.environ.get("TG_KSERVE_PYTHON")
    path = Path(env) if env else util.REPO_ROOT / ".venv-kserve" / "bin" / "python"
    if not path.exists():
        if env:
            pytest.fail(f"TG_KSERVE_PYTHON={path} does not exist (scripts/test.sh makes .venv-kserve)")
        pytest.skip(f"{path} not found (install tests/interop/kserve/requirements.txt into "
                    ".venv-kserve, or set TG_KSERVE_PYTHON)")
    return path


def _spawn_kserve(work_dir: Path, http_port: int, name: str = "kserve") -> ManagedProcess:
    """KServe on 127.0.0.1:http_port (gRPC off), waited for until every model is ready."""
    argv = [_kserve_python(), str(KSERVE_SERVER),
            "--host", "127.0.0.1", "--http_port", str(http_port), "--enable_grpc", "false"]
    env = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
    proc = ManagedProcess(name, argv, work_dir / f"{name}.log", env=env, cwd=work_dir)
    base = f"http://127.0.0.1:{http_port}"
    try:
        proc.wait_http_ok(f"{base}/v2/health/ready")
        for model in KSERVE_MODEL_NAMES:
            proc.wait_http_ok(f"{base}/v2/models/{model}/ready")
    except BaseException:
        proc.stop()
        raise
    return proc


def _kill(proc: ManagedProcess) -> None:
    """SIGKILL the process group at once (a crash, not a shutdown) and reap it."""
    if proc.alive():
        try:
            os.killpg(proc.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.proc.wait(timeout=util.STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{proc.name} (pid {proc.proc.pid}) survived SIGKILL") from None
    proc.stop()  # closes its log


def _start_kserve(work_dir: Path) -> Iterator[Server]:
    (http_port,) = util.free_ports(1)
    proc = _spawn_kserve(work_dir, http_port)
    try:
        yield Server("kserve", f"127.0.0.1:{http_port}", proc)
    finally:
        proc.stop()


class KServeBehindGateway:
    """A KServe and a tensorgate whose only backend it is, for tests that break KServe.
    `kill()` SIGKILLs KServe; `restart()` starts a new one on the same port."""

    def __init__(self, work_dir: Path):
        self.work_dir = work_dir
        (self.port,) = util.free_ports(1)
        self.restarts = 0
        self.kserve = Server("kserve-outage", f"127.0.0.1:{self.port}",
                             _spawn_kserve(work_dir, self.port, "kserve-outage"))
        self.gateway: Optional[Server] = None
        self._gateway_gen: Optional[Iterator[Server]] = None

    def start_gateway(self) -> Server:
        self._gateway_gen = _start_tensorgate(self.work_dir, "tensorgate-kserve-outage",
                                              [f"http://{self.kserve.url}"], KSERVE_MODEL_NAMES)
        self.gateway = next(self._gateway_gen)
        return self.gateway

    def kill(self) -> None:
        _kill(self.kserve.proc)

    def restart(self) -> None:
        self.restarts += 1
        self.kserve.proc = _spawn_kserve(self.work_dir, self.port,
                                         f"kserve-outage-restart{self.restarts}")

    def close(self) -> None:
        if self._gateway_gen is not None:
            self._gateway_gen.close()  # runs _start_tensorgate's finally: stops the gateway
        self.kserve.proc.stop()


@pytest.fixture(scope="session")
def mlserver(tmp_path_factory) -> Iterator[Server]:
    """A running MLServer 1.7 serving mlserver_models/ (simple, identity_fp32)."""
    yield from _start_mlserver(tmp_path_factory.mktemp("mlserver"))


@pytest.fixture(scope="session")
def gateway_mlserver(tmp_path_factory, mlserver) -> Iterator[Server]:
    """tensorgate with that MLServer as its only backend."""
    yield from _start_tensorgate(tmp_path_factory.mktemp("tg-mlserver"), "tensorgate-mlserver",
                                 [f"http://{mlserver.url}"], MLSERVER_MODEL_NAMES)


@pytest.fixture(scope="session")
def gateway_builtin(tmp_path_factory) -> Iterator[Server]:
    """tensorgate serving its built-in models in-process (--backend builtin)."""
    yield from _start_tensorgate(tmp_path_factory.mktemp("tg-builtin"), "tensorgate-builtin",
                                 ["builtin"], BUILTIN_WAIT_MODELS)


@pytest.fixture(scope="session")
def kserve(tmp_path_factory) -> Iterator[Server]:
    """A running KServe 0.21 ModelServer serving addsub and double (kserve/addsub_server.py)."""
    yield from _start_kserve(tmp_path_factory.mktemp("kserve"))


@pytest.fixture(scope="session")
def gateway_kserve(tmp_path_factory, kserve) -> Iterator[Server]:
    """tensorgate with that KServe as its only backend: `serve --backend URL` and listen
    addresses, no models list, no config."""
    yield from _start_tensorgate(tmp_path_factory.mktemp("tg-kserve"), "tensorgate-kserve",
                                 [f"http://{kserve.url}"], KSERVE_MODEL_NAMES)


@pytest.fixture
def kserve_outage(tmp_path_factory) -> Iterator[KServeBehindGateway]:
    """A private KServe behind a private tensorgate, which the test may kill and restart."""
    pair = KServeBehindGateway(tmp_path_factory.mktemp("kserve-outage"))
    try:
        pair.start_gateway()
        yield pair
    finally:
        pair.close()


@pytest.fixture(scope="session")
def grpc_gateway_builtin(tmp_path_factory) -> Iterator[Server]:
    """tensorgate serving its built-in models in-process, with its gRPC listener on."""
    yield from _start_tensorgate(tmp_path_factory.mktemp("tg-grpc-builtin"), "tensorgate-grpc-builtin",
                                 ["builtin"], BUILTIN_GRPC_WAIT_MODELS, with_grpc=True)


@pytest.fixture(scope="session")
def grpc_gateway_mlserver(tmp_path_factory, mlserver) -> Iterator[Server]:
    """tensorgate with gRPC on, with the MLServer (REST) as its only backend."""
    yield from _start_tensorgate(tmp_path_factory.mktemp("tg-grpc-mlserver"), "tensorgate-grpc-mlserver",
                                 [f"http://{mlserver.url}"], MLSERVER_MODEL_NAMES, with_grpc=True)


@pytest.fixture(scope="session")
def workers(tmp_path_factory) -> Iterator[List[Server]]:
    """Three `tensorgate worker` processes (built-in models over REST)."""
    gens = []
    try:
        servers = []
        for i in range(3):
            gen = _start_worker(tmp_path_factory.mktemp(f"worker{i}"), f"tensorgate-worker{i}")
            servers.append(next(gen))
            gens.append(gen)
        yield servers
    finally:
        for gen in reversed(gens):
            gen.close()


@pytest.fixture(scope="session")
def grpc_gateway_fleet(tmp_path_factory, workers) -> Iterator[Server]:
    """tensorgate with gRPC on, in front of the three workers (backend-0, -1, -2 in order)."""
    yield from _start_tensorgate(tmp_path_factory.mktemp("tg-grpc-fleet"), "tensorgate-grpc-fleet",
                                 [f"http://{w.url}" for w in workers], BUILTIN_GRPC_WAIT_MODELS,
                                 with_grpc=True)


@pytest.fixture(scope="session")
def onnx_worker(tmp_path_factory) -> Iterator[Server]:
    """`tensorgate worker --models simple --model-repository COPY`, COPY a private copy of
    tests/fixtures/onnx/repo (Server.repo: its path, which tests may add models to)."""
    work_dir = tmp_path_factory.mktemp("onnx-worker")
    repo = work_dir / "repo"
    shutil.copytree(ONNX_REPO, repo, ignore=shutil.ignore_patterns("reference.json"))
    gen = _start_worker(work_dir, "tensorgate-onnx-worker",
                        ["--models", "simple", "--model-repository", str(repo)], ONNX_WAIT_MODELS)
    try:
        server = next(gen)  # on failure its finally has stopped the process
        server.repo = repo
        yield server
    finally:
        gen.close()


@pytest.fixture(scope="session")
def gateway_onnx(tmp_path_factory, onnx_worker) -> Iterator[Server]:
    """tensorgate with that ONNX worker as its only backend."""
    yield from _start_tensorgate(tmp_path_factory.mktemp("tg-onnx"), "tensorgate-onnx",
                                 [f"http://{onnx_worker.url}"], ONNX_WAIT_MODELS)


@pytest.fixture(scope="session")
def launch_gateway(tmp_path_factory) -> Iterator[GatewayLauncher]:
    """Starts gRPC gateways with their own config, env or TLS (see GatewayLauncher)."""
    launcher = GatewayLauncher(tmp_path_factory)
    try:
        yield launcher
    finally:
        launcher.close()


def _client(server: Server) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(
        url=server.url, connection_timeout=10.0, network_timeout=30.0)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def mlserver_client(mlserver):
    """tritonclient straight to MLServer."""
    yield from _client(mlserver)


@pytest.fixture(scope="session")
def gw_ml(gateway_mlserver):
    """tritonclient -> tensorgate -> MLServer."""
    yield from _client(gateway_mlserver)


@pytest.fixture(scope="session")
def gw_builtin(gateway_builtin):
    """tritonclient -> tensorgate -> built-in models."""
    yield from _client(gateway_builtin)


@pytest.fixture(scope="session")
def gw_ks(gateway_kserve):
    """tritonclient -> tensorgate -> KServe."""
    yield from _client(gateway_kserve)


def _grpc_client(server: Server) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(url=server.grpc_url)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def grpc_builtin(grpc_gateway_builtin):
    """tritonclient.grpc -> tensorgate -> built-in models."""
    yield from _grpc_client(grpc_gateway_builtin)


@pytest.fixture(scope="session")
def grpc_ml(grpc_gateway_mlserver):
    """tritonclient.grpc -> tensorgate -> MLServer (REST)."""
    yield from _grpc_client(grpc_gateway_mlserver)


@pytest.fixture(scope="session")
def grpc_fleet(grpc_gateway_fleet):
    """tritonclient.grpc -> tensorgate -> three workers."""
    yield from _grpc_client(grpc_gateway_fleet)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """On any failure or error, print the tail of every server log this session started."""
    failed = terminalreporter.stats.get("failed", []) + terminalreporter.stats.get("error", [])
    if not failed or not util.STARTED:
        return
    terminalreporter.section("server logs")
    for proc in util.STARTED:
        terminalreporter.write_line(proc.describe())
