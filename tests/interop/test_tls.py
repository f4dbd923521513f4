"""tritonclient over HTTPS (ssl=True) to a TLS gateway, with a CA and certificates made by
rcgen (examples/test_pki.rs, as in the Rust TLS tests), and mTLS refusing a client without a
certificate."""
import functools
import os
import subprocess
import tempfile
from pathlib import Path

import gevent.ssl
import numpy as np
import pytest
import tritonclient.http as http

from interop_util import REPO_ROOT, ManagedProcess, free_ports, tensorgate_bin


@pytest.fixture(scope="module")
def pki():
    tool = Path(os.environ.get("TG_TEST_PKI_BIN", REPO_ROOT / "target" / "debug" / "examples" / "test_pki"))
    if not tool.exists():
        pytest.fail(f"{tool} is not built: run cargo build --examples")
    d = Path(tempfile.mkdtemp(prefix="tg-pki-"))
    subprocess.run([str(tool), str(d)], check=True, capture_output=True, timeout=60)
    return d


def tls_gateway(pki, mtls):
    port, metrics = free_ports(2)
    cfg = pki / f"gateway-{int(mtls)}.toml"
    client_ca = f'client_ca = "{pki / "ca.crt"}"\n' if mtls else ""
    cfg.write_text(
        f'[server]\nlisten = "127.0.0.1:{port}"\nmetrics_listen = "127.0.0.1:{metrics}"\ngrpc_listen = ""\n'
        f'[server.tls]\ncert = "{pki / "server.crt"}"\nkey = "{pki / "server.key"}"\n{client_ca}'
        '[[backends]]\nname = "builtin"\nurl = "builtin"\n'
    )
    p = ManagedProcess("tensorgate-tls", [tensorgate_bin(), "serve", "--config", str(cfg)], pki / f"gateway-{int(mtls)}.log", cwd=REPO_ROOT)
    p.url = f"localhost:{port}"
    return p


def context(pki, client_cert):
    def factory():
        ctx = gevent.ssl.create_default_context(cafile=str(pki / "ca.crt"))
        if client_cert:
            ctx.load_cert_chain(str(pki / "client.crt"), str(pki / "client.key"))
        return ctx
    return factory


def simple(client):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [http.InferInput("INPUT0", [1, 16], "INT32"), http.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    return client.infer("simple", inputs).as_numpy("OUTPUT0")


def wait_tls_ready(p, pki, client_cert):
    import time
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            c = http.InferenceServerClient(p.url, ssl=True, ssl_context_factory=context(pki, client_cert))
            if c.is_server_ready():
                return
        except Exception:
            pass
        time.sleep(0.2)
    raise RuntimeError(p.describe())


def test_tritonclient_over_https(pki):
    p = tls_gateway(pki, mtls=False)
    try:
        wait_tls_ready(p, pki, False)
        client = http.InferenceServerClient(p.url, ssl=True, ssl_context_factory=context(pki, False))
        np.testing.assert_array_equal(simple(client), np.arange(16, dtype=np.int32).reshape(1, 16) * 2)
        assert client.get_server_metadata()["name"] == "tensorgate"
    finally:
        p.stop()


def test_mtls_needs_a_client_certificate(pki):
    p = tls_gateway(pki, mtls=True)
    try:
        wait_tls_ready(p, pki, True)
        with_cert = http.InferenceServerClient(p.url, ssl=True, ssl_context_factory=context(pki, True))
        np.testing.assert_array_equal(simple(with_cert), np.arange(16, dtype=np.int32).reshape(1, 16) * 2)
        without = http.InferenceServerClient(p.url, ssl=True, ssl_context_factory=context(pki, False))
        with pytest.raises(Exception):
            simple(without)
    finally:
        p.stop()
