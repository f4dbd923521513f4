"""Helpers for the interop tests: free ports, child processes with bounded readiness waits
and log capture (conftest.py), and tritonclient request/assertion helpers (the tests)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import grpc
import numpy as np
import tritonclient.http as httpclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

REPO_ROOT = Path(__file__).resolve().parents[2]
INTEROP_DIR = Path(__file__).resolve().parent
MLSERVER_MODELS = INTEROP_DIR / "mlserver_models"

# Every wait loop is bounded both in wall time and in iterations.
POLL_INTERVAL_S = 0.2
READY_TIMEOUT_S = 60.0
MAX_POLLS = int(READY_TIMEOUT_S / POLL_INTERVAL_S) + 1
STOP_TIMEOUT_S = 10.0
LOG_TAIL_LINES = 200  # in the "server logs" section printed after a failed run
SHORT_TAIL_LINES = 12  # in a fixture's exception, which pytest repeats for every test

# Every process started by the fixtures, so that logs can be dumped on failure.
STARTED: List["ManagedProcess"] = []


def free_ports(count: int) -> List[int]:
    """Return `count` distinct free TCP ports on 127.0.0.1.

    All sockets are held open until every port is chosen, so the ports are distinct.
    """
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def http_status(url: str, timeout: float = 2.0) -> Optional[int]:
    """GET `url`; return the status code, or None when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, ConnectionError, socket.timeout, OSError):
        return None


def tensorgate_bin() -> Path:
    """The tensorgate binary: $TENSORGATE_BIN, else target/debug/tensorgate."""
    env = os.environ.get("TENSORGATE_BIN")
    path = Path(env) if env else REPO_ROOT / "target" / "debug" / "tensorgate"
    return path


def mlserver_bin() -> str:
    """The `mlserver` executable of the Python running pytest (the venv), else PATH."""
    beside = Path(sys.executable).parent / "mlserver"
    if beside.exists():
        return str(beside)
    found = shutil.which("mlserver")
    if not found:
        raise RuntimeError("mlserver executable not found (install tests/interop/requirements.txt)")
    return found


class ManagedProcess:
    """A child process whose stdout+stderr go to a log file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Optional[Dict[str, str]] = None,
        cwd: Optional[Path] = None,
    ):
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log_path = log_path
        full_env = dict(os.environ)
        if env:
            full_env.update(env)
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
            cwd=str(cwd) if cwd else None,
            start_new_session=True,  # its own process group, so stop() reaches children
        )
        STARTED.append(self)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            if not self._log.closed:
                self._log.flush()
            text = self.log_path.read_text(errors="replace")
        except OSError as e:
            return f"<cannot read {self.log_path}: {e}>"
        all_lines = text.splitlines()
        # A Rust panic's message sits above its (long) backtrace: show it first.
        panics = [i for i, line in enumerate(all_lines) if "panicked at" in line]
        head = []
        if panics and panics[-1] < len(all_lines) - lines:
            head = all_lines[panics[-1]: panics[-1] + 3] + ["[...]"]
        return "\n".join(head + all_lines[-lines:])

    def describe(self, lines: int = LOG_TAIL_LINES) -> str:
        state = "running" if self.alive() else f"exited with {self.proc.returncode}"
        return (
            f"--- {self.name} (pid {self.proc.pid}, {state}) ---\n"
            f"command: {' '.join(self.argv)}\n"
            f"log: {self.log_path} (last {lines} lines)\n"
            f"{self.log_tail(lines)}\n"
            f"--- end of {self.name} ---"
        )

    def wait_http_ok(self, url: str, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Poll `url` until it answers 200; bounded in time and in polls.

        Raises RuntimeError with the process log if the process dies or time runs out.
        """
        deadline = time.monotonic() + timeout_s
        last = None
        for _ in range(MAX_POLLS):
            if not self.alive():
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode} before {url} was ready\n"
                    + self.describe(SHORT_TAIL_LINES)
                )
            last = http_status(url, timeout=min(2.0, max(0.1, deadline - time.monotonic())))
            if last == 200:
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(POLL_INTERVAL_S)
        raise RuntimeError(
            f"{self.name}: {url} not ready after {timeout_s:.0f} s (last status {last})\n"
            + self.describe(SHORT_TAIL_LINES)
        )

    def wait_grpc_ready(self, target: str, models: Sequence[str] = (),
                        credentials: Optional[grpc.ChannelCredentials] = None,
                        timeout_s: float = READY_TIMEOUT_S) -> None:
        """Poll the gRPC listener at `target` until grpc.health.v1 answers SERVING and
        ModelReady is true for every model (both exempt from auth); bounded in time and in
        polls. Raises RuntimeError with the process log if the process dies or time runs out.
        """
        deadline = time.monotonic() + timeout_s
        last = None
        channel = (grpc.secure_channel(target, credentials) if credentials
                   else grpc.insecure_channel(target))
        try:
            health = health_pb2_grpc.HealthStub(channel)
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            for _ in range(MAX_POLLS):
                if not self.alive():
                    raise RuntimeError(
                        f"{self.name} exited with {self.proc.returncode} before gRPC {target} "
                        "was ready\n" + self.describe(SHORT_TAIL_LINES))
                rpc_timeout = min(2.0, max(0.1, deadline - time.monotonic()))
                try:
                    status = health.Check(health_pb2.HealthCheckRequest(service=""),
                                          timeout=rpc_timeout).status
                    last = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
                    if status == health_pb2.HealthCheckResponse.SERVING:
                        waiting = [m for m in models if not stub.ModelReady(
                            service_pb2.ModelReadyRequest(name=m), timeout=rpc_timeout).ready]
                        if not waiting:
                            return
                        last = f"SERVING, models not ready: {waiting}"
                except grpc.RpcError as e:
                    last = f"{e.code()}: {e.details()}"
                if time.monotonic() >= deadline:
                    break
                time.sleep(POLL_INTERVAL_S)
        finally:
            channel.close()
        raise RuntimeError(
            f"{self.name}: gRPC {target} not ready after {timeout_s:.0f} s (last: {last})\n"
            + self.describe(SHORT_TAIL_LINES)
        )

    def stop(self) -> None:
        """SIGTERM the process group, then SIGKILL after STOP_TIMEOUT_S."""
        if self.alive():
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=STOP_TIMEOUT_S)
        self._log.close()


# ---------------------------------------------------------------------------
# Request helpers shared by the test modules.
# ---------------------------------------------------------------------------

CLIENT_DECODE_FAILURE = "an exception occurred in the client while decoding the response"


def make_input(name: str, arr: np.ndarray, datatype: str, binary: bool) -> httpclient.InferInput:
    inp = httpclient.InferInput(name, list(arr.shape), datatype)
    inp.set_data_from_numpy(arr, binary_data=binary)
    return inp


def simple_operands(seed: int, batch: int = 3):
    rng = np.random.default_rng(seed)
    a = rng.integers(-100_000, 100_000, size=(batch, 16), dtype=np.int32)
    b = rng.integers(-100_000, 100_000, size=(batch, 16), dtype=np.int32)
    return a, b


def output_names(result) -> List[str]:
    return [o["name"] for o in result.get_response().get("outputs", [])]


def assert_output_encoding(result, name: str, binary: bool, nbytes: int) -> None:
    """The output came back binary (binary_data_size, no data) or JSON (data)."""
    out = result.get_output(name)
    assert out is not None, f"no output {name} in {result.get_response()}"
    params = out.get("parameters") or {}
    if binary:
        assert params.get("binary_data_size") == nbytes, f"{name} not binary as requested: {out}"
        assert "data" not in out, f"{name} has both data and binary_data_size: {out}"
    else:
        assert "binary_data_size" not in params, f"{name} binary but JSON requested: {out}"
        assert "data" in out, f"{name} has no JSON data: {out}"


def run_simple(client, in_bin=(True, True), out_bin=(True, True), seed=0, batch=3):
    """Infer `simple` with the given per-tensor encodings and check every result."""
    a, b = simple_operands(seed, batch)
    inputs = [make_input("INPUT0", a, "INT32", in_bin[0]),
              make_input("INPUT1", b, "INT32", in_bin[1])]
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=out_bin[0]),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=out_bin[1])]
    result = client.infer("simple", inputs, outputs=outputs)
    assert sorted(output_names(result)) == ["OUTPUT0", "OUTPUT1"]
    for name, binary, want in (("OUTPUT0", out_bin[0], a + b), ("OUTPUT1", out_bin[1], a - b)):
        assert_output_encoding(result, name, binary, want.nbytes)
        got = result.as_numpy(name)
        assert got.dtype == np.int32, f"{name} dtype {got.dtype}"
        assert got.shape == want.shape, f"{name} shape {got.shape} != {want.shape}"
        np.testing.assert_array_equal(got, want, err_msg=name)
    return result


def expect_error(fn, status: int, *needles: str) -> InferenceServerException:
    """`fn()` must raise a tritonclient error with this HTTP status whose message is a
    clean {"error": ...} body naming every needle."""
    try:
        fn()
    except InferenceServerException as e:
        msg = e.message() or ""
        assert CLIENT_DECODE_FAILURE not in msg, f"error body is not {{\"error\": ...}}: {msg}"
        assert e.status() == str(status), f"status {e.status()} (want {status}): {msg}"
        for needle in needles:
            assert needle in msg, f"error message does not name {needle!r}: {msg}"
        return e
    raise AssertionError(f"expected HTTP {status}, the request succeeded")
