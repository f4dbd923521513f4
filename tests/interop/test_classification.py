"""Classification through the gateway against numpy: random tensors of every supported
datatype and several batch sizes, through the built-in identity models, with and without
labels, with binary and JSON outputs. Ties go to the lower index."""
import json
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import requests
import tritonclient.http as http

from interop_util import REPO_ROOT, ManagedProcess, free_ports, tensorgate_bin

TYPES = {
    "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64,
    "int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64,
    "fp16": np.float16, "bf16": ml_dtypes.bfloat16, "fp32": np.float32, "fp64": np.float64,
}
LABELED = ("fp32", "int32")


@pytest.fixture(scope="module")
def gateway():
    work = Path(tempfile.mkdtemp(prefix="tg-classify-"))
    labels = work / "labels.txt"
    # Some lines empty: those classes have no label suffix.
    labels.write_text("\n".join("" if i % 5 == 3 else f"class-{i}" for i in range(40)) + "\n")
    port, metrics = free_ports(2)
    models = "".join(f'[models.identity_{t}]\nlabels = {{ OUTPUT0 = "{labels}" }}\n' for t in LABELED)
    cfg = work / "tensorgate.toml"
    cfg.write_text(
        f'[server]\nlisten = "127.0.0.1:{port}"\nmetrics_listen = "127.0.0.1:{metrics}"\ngrpc_listen = ""\n'
        '[[backends]]\nname = "builtin"\nurl = "builtin"\n' + models
    )
    p = ManagedProcess("tensorgate-classify", [tensorgate_bin(), "serve", "--config", str(cfg)], work / "gw.log", cwd=REPO_ROOT)
    p.wait_http_ok(f"http://127.0.0.1:{port}/v2/health/ready")
    p.url = f"127.0.0.1:{port}"
    p.labels = labels.read_text().split("\n")
    yield p
    p.stop()


def random_tensor(kind, shape, rng):
    dt = TYPES[kind]
    if kind in ("fp16", "bf16", "fp32", "fp64"):
        x = rng.standard_normal(shape).astype(np.float32)
        # Repeat some values so that ties are exercised.
        x.flat[::7] = x.flat[0]
        return x.astype(dt)
    info = np.iinfo(dt)
    lo, hi = max(info.min, -50), min(info.max, 50)
    return rng.integers(lo, hi, size=shape, endpoint=True).astype(dt)


def expected(x, k, labels):
    """Per row: the top k by value, ties by lower index, as Triton formats them."""
    out = []
    for row in x.reshape(x.shape[0], -1):
        vals = row.astype(np.float64) if row.dtype.kind == "f" or row.dtype == ml_dtypes.bfloat16 else row.astype(object)
        order = sorted(range(len(row)), key=lambda i: (-vals[i], i))[: min(k, len(row))]
        strs = []
        for i in order:
            v = f"{float(vals[i]):.6f}" if not isinstance(vals[i], int) else str(vals[i])
            s = f"{v}:{i}"
            if labels and i < len(labels) and labels[i]:
                s += f":{labels[i]}"
            strs.append(s.encode())
        out.append(strs)
    return out


@pytest.mark.parametrize("kind", list(TYPES))
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("binary", [True, False])
def test_against_numpy(gateway, kind, batch, binary):
    rng = np.random.default_rng(abs(hash((kind, batch, binary))) % (2**32))
    x = random_tensor(kind, (batch, 30), rng)
    client = http.InferenceServerClient(gateway.url)
    inp = http.InferInput("INPUT0", list(x.shape), kind.upper())
    inp.set_data_from_numpy(x, binary_data=True)
    k = 5 if batch == 1 else 40  # 40 > 30 columns: cut to the number of classes
    r = client.infer(f"identity_{kind}", [inp], outputs=[http.InferRequestedOutput("OUTPUT0", binary_data=binary, class_count=k)])
    out = r.get_output("OUTPUT0")
    assert out["datatype"] == "BYTES"
    assert out["shape"] == [batch, min(k, 30)]
    got = [[v if isinstance(v, bytes) else v.encode() for v in row] for row in r.as_numpy("OUTPUT0").tolist()]
    labels = gateway.labels if kind in LABELED else None
    assert got == expected(x, k, labels)


def test_errors(gateway):
    base = f"http://{gateway.url}/v2/models"
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "BYTES", "data": ["a", "b"]}],
            "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 1}}]}
    r = requests.post(f"{base}/identity_bytes/infer", json=body, timeout=5)
    assert (r.status_code, r.json()) == (400, {"error": "output 'OUTPUT0': classification is not supported for datatype BYTES"})
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}],
            "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 1.5}}]}
    r = requests.post(f"{base}/identity_fp32/infer", json=body, timeout=5)
    assert (r.status_code, r.json()) == (400, {"error": "output 'OUTPUT0': parameter 'classification' must be an unsigned integer, not a floating-point number"})
    body["outputs"][0]["parameters"]["classification"] = 0
    r = requests.post(f"{base}/identity_fp32/infer", json=body, timeout=5)
    assert r.status_code == 200 and r.json()["outputs"][0]["datatype"] == "FP32", "0 means no classification"
