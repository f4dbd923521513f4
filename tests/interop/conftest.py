"""Fixtures: a real MLServer serving mlserver_models/, and tensorgate in front of it or in
front of its built-in models. Every server listens on free ports of 127.0.0.1 only, every
wait is bounded in time and in polls, processes are killed at teardown, and their logs are
printed when a test fails.

Fixtures:
  mlserver, gateway_mlserver, gateway_builtin -> Server(url="127.0.0.1:PORT", metrics_url, ...)
  mlserver_client, gw_ml, gw_builtin          -> tritonclient.http.InferenceServerClient
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

import pytest
import tritonclient.http as httpclient

import interop_util as util
from interop_util import ManagedProcess

MLSERVER_MODEL_NAMES = ("simple", "identity_fp32")
BUILTIN_WAIT_MODELS = ("simple", "identity_fp32")


@dataclass
class Server:
    name: str
    url: str  # host:port, the form tritonclient wants
    proc: ManagedProcess
    metrics_url: Optional[str] = None

    @property
    def base(self) -> str:
        return f"http://{self.url}"


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


def _start_tensorgate(work_dir: Path, name: str, backends: Sequence[str],
                      wait_models: Sequence[str]) -> Iterator[Server]:
    binary = util.tensorgate_bin()
    if not binary.exists():
        if os.environ.get("TENSORGATE_BIN"):
            pytest.fail(f"TENSORGATE_BIN={binary} does not exist")
        pytest.skip(f"{binary} not built (run cargo build, or set TENSORGATE_BIN)")
    port, metrics_port = util.free_ports(2)
    argv = [str(binary), "serve",
            "--listen", f"127.0.0.1:{port}",
            "--metrics-listen", f"127.0.0.1:{metrics_port}"]
    for backend in backends:
        argv += ["--backend", backend]
    env = {"RUST_BACKTRACE": "1", "RUST_LOG": os.environ.get("RUST_LOG", "info")}
    # cwd = repo root: the embedded default config names label files relative to it.
    proc = ManagedProcess(name, argv, work_dir / f"{name}.log", env=env, cwd=util.REPO_ROOT)
    server = Server(name, f"127.0.0.1:{port}", proc, metrics_url=f"127.0.0.1:{metrics_port}")
    try:
        proc.wait_http_ok(f"{server.base}/v2/health/ready")
        # The gateway learns models from its backends; wait until it knows ours.
        for model in wait_models:
            proc.wait_http_ok(f"{server.base}/v2/models/{model}/ready")
        yield server
    finally:
        proc.stop()


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


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """On any failure or error, print the tail of every server log this session started."""
    failed = terminalreporter.stats.get("failed", []) + terminalreporter.stats.get("error", [])
    if not failed or not util.STARTED:
        return
    terminalreporter.section("server logs")
    for proc in util.STARTED:
        terminalreporter.write_line(proc.describe())
