"""The gateway's exposition checked by the real promtool, and scraped by a real Prometheus
server (Debian's `prometheus` package) whose query API must return the expected series."""
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("TENSORGATE_BIN", str(ROOT / "target" / "debug" / "tensorgate"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(fn, what, timeout=60.0, every=0.25):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = fn()
            if last:
                return last
        except requests.RequestException as e:
            last = e
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


class Gateway:
    def __init__(self, triton_metrics=True):
        self.port, self.metrics_port = free_port(), free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="tg-prom-"))
        cfg = self.dir / "tensorgate.toml"
        cfg.write_text(
            f'[server]\nlisten = "127.0.0.1:{self.port}"\nmetrics_listen = "127.0.0.1:{self.metrics_port}"\ngrpc_listen = ""\n'
            f"triton_metrics = {'true' if triton_metrics else 'false'}\n"
            '[[backends]]\nname = "builtin"\nurl = "builtin"\n'
        )
        self.log = open(self.dir / "gateway.log", "w")
        self.proc = subprocess.Popen([BIN, "serve", "--config", str(cfg)], stdout=self.log, stderr=subprocess.STDOUT)
        wait_for(lambda: requests.get(f"http://127.0.0.1:{self.port}/v2/health/ready", timeout=1).ok, "gateway ready", 30)

    def simple(self, ok=True):
        data = list(range(16))
        body = {"inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": data},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": data if ok else data[:3]},
        ]}
        return requests.post(f"http://127.0.0.1:{self.port}/v2/models/simple/infer", json=body, timeout=5)

    def metrics(self):
        return requests.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture
def gateway():
    g = Gateway()
    yield g
    g.stop()


def promtool(text):
    return subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)


def test_promtool_clean_without_triton_names():
    g = Gateway(triton_metrics=False)
    try:
        for _ in range(3):
            assert g.simple().status_code == 200
        assert g.simple(ok=False).status_code == 400
        text = g.metrics()
        assert "tensorgate_request_duration_seconds_bucket" in text
        assert "nv_inference" not in text
        r = promtool(text)
        assert r.returncode == 0, r.stdout + r.stderr
        assert (r.stdout + r.stderr).strip() == ""
    finally:
        g.stop()


# promtool's exit status when the exposition parsed and only lint findings remain (a parse
# error is 1, with "error while linting").
PROMTOOL_LINT_FINDINGS = 3


def triton_lints(text):
    """The findings documented for Triton's names (README, "Metrics naming" in
    docs/ARCHITECTURE.md): counters without `_total`, `_count` on non-histograms, and the
    abbreviated unit `_us`. Derived from the families in the exposition."""
    kinds = {}
    for line in text.splitlines():
        if line.startswith("# TYPE nv_"):
            _, _, name, kind = line.split()
            kinds[name] = kind
    expected = set()
    for name, kind in kinds.items():
        if kind == "counter":
            expected.add(f'{name} counter metrics should have "_total" suffix')
        if name.endswith("_count"):
            expected.add(f'{name} non-histogram and non-summary metrics should not have "_count" suffix')
        if name.endswith("_us"):
            expected.add(f"{name} metric names should not contain abbreviated units")
    return expected


def test_promtool_flags_only_the_triton_names(gateway):
    assert gateway.simple().status_code == 200
    assert gateway.simple(ok=False).status_code == 400
    text = gateway.metrics()
    r = promtool(text)
    output = r.stdout + r.stderr
    # The exposition parses: promtool lints it rather than failing to read it.
    assert "error while linting" not in output, output
    assert r.returncode == PROMTOOL_LINT_FINDINGS, output
    # Triton's own names break the naming lint; every tensorgate_* series is clean.
    problems = {l.strip() for l in output.splitlines() if l.strip()}
    expected = triton_lints(text)
    families = {l.split()[2] for l in text.splitlines() if l.startswith("# TYPE nv_")}
    assert families == {
        "nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
        "nv_inference_exec_count", "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us", "nv_inference_compute_input_duration_us",
        "nv_inference_compute_infer_duration_us", "nv_inference_compute_output_duration_us",
        "nv_inference_pending_request_count",
    }, families
    assert problems == expected, (sorted(problems - expected), sorted(expected - problems))


def require_prometheus():
    """scripts/test.sh installs Debian's prometheus and sets TG_REQUIRE_PROMETHEUS=1, so
    there a missing server is a failure; elsewhere the test is skipped."""
    if shutil.which("prometheus") is not None:
        return
    if os.environ.get("TG_REQUIRE_PROMETHEUS") == "1":
        pytest.fail("TG_REQUIRE_PROMETHEUS=1 but no `prometheus` binary is on PATH (Debian's prometheus)")
    pytest.skip("Debian's prometheus is installed by scripts/test.sh")


def test_a_real_prometheus_scrapes_the_gateway(gateway):
    require_prometheus()
    for _ in range(4):
        assert gateway.simple().status_code == 200
    assert gateway.simple(ok=False).status_code == 400
    prom_port = free_port()
    work = Path(tempfile.mkdtemp(prefix="prometheus-"))
    (work / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: tensorgate\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{gateway.metrics_port}']\n"
    )
    log = open(work / "prometheus.log", "w")
    prom = subprocess.Popen(
        ["prometheus", f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=log, stderr=subprocess.STDOUT, cwd=work,
    )
    try:
        api = f"http://127.0.0.1:{prom_port}/api/v1/query"

        def query(q):
            r = requests.get(api, params={"query": q}, timeout=2).json()
            return r["data"]["result"] if r.get("status") == "success" else []

        result = wait_for(lambda: query('nv_inference_request_success{model="simple"}'), "the scraped series", 90)
        assert result[0]["metric"]["version"] == "1"
        assert result[0]["metric"]["job"] == "tensorgate"
        assert float(result[0]["value"][1]) == 4.0
        failures = wait_for(lambda: query('nv_inference_request_failure{model="simple",reason="REJECTED"}'), "failures")
        assert float(failures[0]["value"][1]) == 1.0
        execs = wait_for(lambda: query('nv_inference_exec_count{model="simple"}'), "executions")
        assert float(execs[0]["value"][1]) == 4.0
        hist = wait_for(lambda: query('tensorgate_request_duration_seconds_count{model="simple",backend="builtin",protocol="rest"}'), "histogram")
        assert float(hist[0]["value"][1]) == 4.0
        up = wait_for(lambda: query('up{job="tensorgate"}'), "up")
        assert float(up[0]["value"][1]) == 1.0
    finally:
        prom.terminate()
        try:
            prom.wait(timeout=15)
        except subprocess.TimeoutExpired:
            prom.kill()
        log.close()
