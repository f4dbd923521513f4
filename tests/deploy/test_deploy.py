"""Offline checks of deploy/: Kubernetes schemas, the configs in the ConfigMaps, and the
agreement between probes, ports, annotations and those configs."""
import os
import re
import subprocess
import tempfile
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
BIN = os.environ.get("TENSORGATE_BIN", str(ROOT / "target" / "debug" / "tensorgate"))
KUBERNETES = "1.31.0"


def manifests():
    for path in sorted(K8S.rglob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                yield path, doc


def by_kind(layout, kind):
    return [d for p, d in manifests() if p.parent.name == layout and d["kind"] == kind]


@pytest.mark.parametrize("path,doc", list(manifests()), ids=lambda x: x.name if isinstance(x, Path) else x.get("kind"))
def test_manifest_validates(path, doc):
    if doc["apiVersion"].startswith("monitoring.coreos.com/"):
        # A CRD: no schema ships with Kubernetes; check its shape by hand.
        assert doc["kind"] == "ServiceMonitor"
        assert doc["spec"]["selector"]["matchLabels"]
        assert all("port" in e for e in doc["spec"]["endpoints"])
        return
    kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_every_manifest_is_in_its_kustomization():
    for k in K8S.rglob("kustomization.yaml"):
        listed = set(yaml.safe_load(k.read_text())["resources"])
        present = {p.name for p in k.parent.glob("*.yaml") if p.name != "kustomization.yaml"}
        assert listed == present, k


def configs():
    for path, doc in manifests():
        if doc["kind"] == "ConfigMap" and "tensorgate.toml" in doc.get("data", {}):
            yield path.parent.name, doc["data"]["tensorgate.toml"]


@pytest.mark.parametrize("layout,text", list(configs()))
def test_configmaps_pass_check_config(layout, text):
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(text)
    r = subprocess.run([BIN, "check-config", f.name], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr


def port_of(addr):
    return int(addr.rsplit(":", 1)[1])


@pytest.mark.parametrize("layout,text", list(configs()))
def test_ports_probes_and_scraping_agree_with_the_config(layout, text):
    server = tomllib.loads(text)["server"]
    api, metrics = port_of(server["listen"]), port_of(server["metrics_listen"])
    deployments = by_kind(layout, "Deployment")
    assert deployments
    gateway = None
    for d in deployments:
        for c in d["spec"]["template"]["spec"]["containers"]:
            if c["image"] == "tensorgate":
                gateway, pod = c, d["spec"]["template"]
    assert gateway, "a tensorgate container"
    ports = {p["name"]: p["containerPort"] for p in gateway["ports"]}
    assert ports == {"http": api, "metrics": metrics}
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert ports[gateway["readinessProbe"]["httpGet"]["port"]] == api
    assert ports[gateway["livenessProbe"]["httpGet"]["port"]] == api
    ann = pod["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true"
    assert int(ann["prometheus.io/port"]) == metrics
    assert ann["prometheus.io/path"] == "/metrics"
    for svc in by_kind(layout, "Service"):
        if svc["spec"].get("clusterIP") == "None":
            continue
        targets = {p["name"]: p["targetPort"] for p in svc["spec"]["ports"]}
        assert targets == {"http": "http", "metrics": "metrics"}
    # tensorgate's shutdown (preStop sleep, then shutdown delay and drain) fits in the grace
    # period, and every other container of its Pod (the sidecar's model server) outlives it,
    # since tensorgate forwards to it until the drain ends, and has time left to stop itself.
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    gateway_done = prestop_sleep(gateway) + shutdown_seconds(text)
    assert gateway_done < grace
    for other in pod["spec"]["containers"]:
        if other is gateway:
            continue
        sleep = prestop_sleep(other)
        assert sleep > gateway_done, f"{other['name']} gets SIGTERM while tensorgate still drains"
        assert sleep < grace, f"{other['name']} has no time to stop"


def prestop_sleep(container):
    """Seconds a container's preStop hook sleeps (0 without one)."""
    return container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)


def shutdown_seconds(config_text):
    """How long tensorgate may take after SIGTERM: shutdown delay plus drain timeout."""
    limits = tomllib.loads(config_text).get("limits", {})
    return (limits.get("shutdown_delay_ms", 0) + limits.get("drain_timeout_ms", 30000)) / 1000


def test_front_door_has_the_pieces_users_expect():
    assert by_kind("front-door", "Deployment")[0]["spec"]["replicas"] >= 2
    assert by_kind("front-door", "PodDisruptionBudget")
    assert by_kind("front-door", "HorizontalPodAutoscaler")
    headless = [s for s in by_kind("front-door", "Service") if s["spec"].get("clusterIP") == "None"]
    assert headless, "a headless Service for the model servers"
    backends = tomllib.loads(dict(configs())["front-door"])["backends"]
    assert any(b.get("discovery") == "dns" and headless[0]["metadata"]["name"] in b["url"] for b in backends)
    monitor = by_kind("monitoring", "ServiceMonitor")[0]
    front = [s for s in by_kind("front-door", "Service") if s["spec"].get("clusterIP") != "None"][0]
    assert monitor["spec"]["selector"]["matchLabels"] == front["metadata"]["labels"]
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"


def test_dockerfile_is_multi_stage_non_root_and_copies_what_exists():
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    stages = re.findall(r"^FROM\s+(\S+)", text, re.M)
    assert len(stages) >= 2
    assert "distroless" in stages[-1] and "nonroot" in stages[-1]
    assert re.search(r"^USER\s+nonroot", text, re.M)
    for src in re.findall(r"^COPY\s+(?!--from)(.+)\s+\S+$", text, re.M):
        for p in src.split():
            assert (ROOT / p).exists(), p
    assert "cargo build --release --locked" in text
    ignore = (ROOT / ".dockerignore").read_text()
    assert "target/" in ignore


def test_the_dockerfile_cargo_command_builds_a_working_binary():
    # No Docker engine here. Run the image's own cargo command, read from the Dockerfile, on
    # the files the Dockerfile copies (the tree has them all), and check what it builds.
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    m = re.search(r"^RUN (cargo build [^\\&\n]+)", text, re.M)
    assert m, "the Dockerfile runs cargo build"
    command = m.group(1).split()
    if os.environ.get("TG_CARGO_LOCK"):  # the test script serializes cargo runs on this lock
        command = ["flock", os.environ["TG_CARGO_LOCK"], *command]
    r = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-4000:]
    binary = ROOT / "target" / "release" / "tensorgate"
    r = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout.startswith("tensorgate "), r.stdout + r.stderr
    # The image's CMD: the config it copies to /etc/tensorgate, checked by that binary.
    r = subprocess.run([str(binary), "check-config", "config/tensorgate.toml"], cwd=ROOT,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr