"""Offline checks of deploy/: Kubernetes schemas, the configs in the ConfigMaps, and the
agreement between probes, ports, annotations and those configs."""
import copy
import os
import re
import shutil
import subprocess
import tempfile
import time
import tomllib
import urllib.parse
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


# Every directory with a kustomization.yaml, by name: "front-door", "front-door-redis", ...
LAYOUTS = {k.parent.name: k.parent for k in sorted(K8S.rglob("kustomization.yaml"))}


def load(path):
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def render(directory):
    """The objects `kustomize build` makes of a layout, before image substitution: its own
    files and the layouts it builds on (`resources`), with its `patches` merged in. Only the
    merge these patches need (maps merged key by key, anything else replaced); kustomize
    itself, where installed, is compared with this in test_render_agrees_with_kustomize."""
    k = yaml.safe_load((directory / "kustomization.yaml").read_text())
    docs = []
    for resource in k.get("resources", []):
        path = (directory / resource).resolve()
        docs += render(path) if path.is_dir() else load(path)
    for patch in k.get("patches", []):
        for change in load(directory / patch["path"]):
            targets = [d for d in docs if identity(d) == identity(change)]
            assert len(targets) == 1, f"{patch['path']} patches {identity(change)}, found {len(targets)}"
            merge(targets[0], change)
    return docs


def identity(doc):
    return doc["kind"], doc["metadata"]["name"]


def merge(target, change):
    for key, value in change.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def by_kind(layout, kind):
    return [d for d in render(LAYOUTS[layout]) if d["kind"] == kind]


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


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
        spec = yaml.safe_load(k.read_text())
        listed = {p["path"] for p in spec.get("patches", [])}
        for resource in spec["resources"]:
            if (k.parent / resource).is_dir():
                assert (k.parent / resource / "kustomization.yaml").exists(), (k, resource)
            else:
                listed.add(resource)
        present = {p.name for p in k.parent.glob("*.yaml") if p.name != "kustomization.yaml"}
        assert listed == present, k


def configs():
    """Each layout's tensorgate.toml, as deployed (patches applied)."""
    for layout in LAYOUTS:
        for doc in by_kind(layout, "ConfigMap"):
            if "tensorgate.toml" in doc.get("data", {}):
                yield layout, doc["data"]["tensorgate.toml"]


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
    # Stated, not left to the default: in a sidecar Pod the default (8001) is Triton's own.
    grpc = port_of(server["grpc_listen"])
    deployments = by_kind(layout, "Deployment")
    assert deployments
    gateway = None
    for d in deployments:
        for c in d["spec"]["template"]["spec"]["containers"]:
            if c["image"] == "tensorgate":
                gateway, pod = c, d["spec"]["template"]
    assert gateway, "a tensorgate container"
    ports = {p["name"]: p["containerPort"] for p in gateway["ports"]}
    assert ports == {"http": api, "grpc": grpc, "metrics": metrics}
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert ports[gateway["readinessProbe"]["httpGet"]["port"]] == api
    assert ports[gateway["livenessProbe"]["httpGet"]["port"]] == api
    ann = pod["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true"
    assert int(ann["prometheus.io/port"]) == metrics
    assert ann["prometheus.io/path"] == "/metrics"
    fronts = [s for s in by_kind(layout, "Service")
              if s["spec"].get("clusterIP") != "None" and selects(s["spec"]["selector"], pod["metadata"]["labels"])]
    assert fronts, "a Service in front of tensorgate"
    for svc in fronts:
        targets = {p["name"]: p["targetPort"] for p in svc["spec"]["ports"]}
        assert targets == {"http": "http", "grpc": "grpc", "metrics": "metrics"}
        (grpc_port,) = [p for p in svc["spec"]["ports"] if p["name"] == "grpc"]
        assert grpc_port["appProtocol"] == "kubernetes.io/h2c"
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


def test_front_door_keeps_its_pins_in_memory_by_default():
    pins = tomllib.loads(dict(configs())["front-door"])["fleet"].get("pins", {})
    assert pins.get("store", "memory") == "memory"


def test_redis_layout_is_the_front_door_plus_redis():
    base, redis = render(LAYOUTS["front-door"]), render(LAYOUTS["front-door-redis"])
    assert {identity(d) for d in base} < {identity(d) for d in redis}
    added = {identity(d) for d in redis} - {identity(d) for d in base}
    assert added == {("Deployment", "tensorgate-redis"), ("Service", "tensorgate-redis"),
                     ("NetworkPolicy", "tensorgate-redis")}
    for d in base:
        if d["kind"] != "ConfigMap":
            assert d in redis, f"the Redis layout changes {identity(d)}"
    # The patch carries the whole config: it must stay the front door's, plus [fleet.pins].
    texts = dict(configs())
    front, shared = tomllib.loads(texts["front-door"]), tomllib.loads(texts["front-door-redis"])
    pins = shared["fleet"].pop("pins")
    assert shared == front, "configmap-patch.yaml has drifted from front-door/configmap.yaml"
    assert pins["store"] == "redis"
    assert set(pins) <= {"store", "url", "key_prefix", "timeout_ms"}
    assert 1 <= pins.get("timeout_ms", 50) <= 60_000


def redis_parts():
    deployments = {d["metadata"]["name"]: d for d in by_kind("front-door-redis", "Deployment")}
    services = {s["metadata"]["name"]: s for s in by_kind("front-door-redis", "Service")}
    return deployments, services


def test_the_pins_url_reaches_the_redis_pods():
    deployments, services = redis_parts()
    pins = tomllib.loads(dict(configs())["front-door-redis"])["fleet"]["pins"]
    url = urllib.parse.urlsplit(pins["url"])
    assert url.scheme == "redis"
    assert re.fullmatch(r"/\d*", url.path or "/"), "the path is a database number"
    service = services[url.hostname]
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == (url.port or 6379)]
    redis = deployments["tensorgate-redis"]
    pod = redis["spec"]["template"]
    assert redis["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert selects(service["spec"]["selector"], pod["metadata"]["labels"])
    gateway = deployments["tensorgate"]["spec"]["template"]["metadata"]["labels"]
    assert not selects(service["spec"]["selector"], gateway)
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports[port["targetPort"]] == 6379  # redis-server's default --port
    # Only the gateway pods may connect (the Redis has no password).
    (policy,) = by_kind("front-door-redis", "NetworkPolicy")
    assert selects(policy["spec"]["podSelector"]["matchLabels"], pod["metadata"]["labels"])
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert [selects(f["podSelector"]["matchLabels"], gateway) for f in rule["from"]] == [True]
    assert [p["port"] for p in rule["ports"]] == [port["targetPort"]]
    # Neither the gateway's disruption budget nor the ServiceMonitor takes in the Redis.
    for pdb in by_kind("front-door-redis", "PodDisruptionBudget"):
        assert not selects(pdb["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])
    monitor = by_kind("monitoring", "ServiceMonitor")[0]
    assert not selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])


def redis_args():
    deployments, _ = redis_parts()
    (container,) = deployments["tensorgate-redis"]["spec"]["template"]["spec"]["containers"]
    args = container.get("command", []) + container["args"]
    assert args[0] == "redis-server"
    options, i = {}, 1
    while i < len(args):
        assert args[i].startswith("--"), args[i]
        options[args[i][2:]], i = args[i + 1], i + 2
    return container, options


def redis_bytes(text):
    """A Redis memory size: 1k is 1000 bytes, 1kb 1024."""
    number, unit = re.fullmatch(r"(\d+)([kmg]b?)?", text.lower()).groups()
    units = {None: 1, "k": 10**3, "m": 10**6, "g": 10**9, "kb": 2**10, "mb": 2**20, "gb": 2**30}
    return int(number) * units[unit]


def kubernetes_bytes(text):
    number, unit = re.fullmatch(r"(\d+)([KMG]i?)?", text).groups()
    units = {None: 1, "K": 10**3, "M": 10**6, "G": 10**9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    return int(number) * units[unit]


def test_redis_is_soft_state_bounded_and_unprivileged():
    deployments, _ = redis_parts()
    redis = deployments["tensorgate-redis"]
    container, options = redis_args()
    assert container["image"].startswith("redis:7")
    # Pins are soft state: no snapshots, no append-only file.
    assert options["save"] == "" and options["appendonly"] == "no"
    # Once full, old pins are evicted rather than new ones refused.
    assert options["maxmemory-policy"] in ("volatile-ttl", "volatile-lru", "allkeys-lru")
    # Bounded, with room above maxmemory (fragmentation, buffers) below the memory limit.
    limit = kubernetes_bytes(container["resources"]["limits"]["memory"])
    assert 0 < redis_bytes(options["maxmemory"]) <= limit * 0.75
    assert container["resources"]["requests"]["memory"] == container["resources"]["limits"]["memory"]
    # One instance, never two at once: each would hold its own pins.
    assert redis["spec"]["replicas"] == 1
    assert redis["spec"]["strategy"]["type"] == "Recreate"
    assert container["readinessProbe"]["exec"]["command"] == ["redis-cli", "ping"]
    assert "livenessProbe" in container
    pod = redis["spec"]["template"]["spec"]["securityContext"]
    # The image's default user is root: runAsNonRoot alone would keep the pod from starting.
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] > 0
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]


def test_redis_server_runs_with_the_arguments():
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if not (server and cli):
        pytest.skip("redis-server and redis-cli are not installed")
    _, options = redis_args()
    with tempfile.TemporaryDirectory() as tmp:
        # A Unix socket instead of TCP: nothing else on this machine is disturbed. An unknown
        # option or a bad value makes redis-server exit at once.
        socket = os.path.join(tmp, "redis.sock")
        args = [server, "--port", "0", "--unixsocket", socket]
        for name, value in options.items():
            args += [f"--{name}", value]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp)
        try:
            for _ in range(100):
                if os.path.exists(socket) or proc.poll() is not None:
                    break
                time.sleep(0.05)
            assert proc.poll() is None, proc.communicate()[0]

            def ask(*command):
                r = subprocess.run([cli, "-s", socket, *command], capture_output=True, text=True, timeout=10)
                assert r.returncode == 0, r.stderr
                return r.stdout.split("\n")

            assert ask("ping")[0] == "PONG"  # what the readiness probe asks
            for name, value in options.items():
                if name == "maxmemory":
                    assert int(ask("config", "get", name)[1]) == redis_bytes(value)
                else:
                    assert ask("config", "get", name)[1] == value, name
            assert os.listdir(tmp) == ["redis.sock"], "nothing written to disk"
        finally:
            proc.terminate()
            proc.communicate(timeout=10)
        assert not [f for f in os.listdir(tmp) if f != "redis.sock"], "a snapshot at shutdown"


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_render_agrees_with_kustomize(layout):
    if shutil.which("kustomize"):
        command = ["kustomize", "build"]
    elif shutil.which("kubectl"):
        command = ["kubectl", "kustomize"]
    else:
        pytest.skip("neither kustomize nor kubectl is installed")
    r = subprocess.run([*command, str(LAYOUTS[layout])], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    built = {identity(d): d for d in yaml.safe_load_all(r.stdout) if d}
    ours = {identity(d): d for d in render(LAYOUTS[layout])}
    assert built.keys() == ours.keys()
    for key, doc in ours.items():
        if doc["kind"] == "ConfigMap":
            assert built[key]["data"] == doc["data"], key


def test_dockerfile_is_multi_stage_non_root_and_copies_what_exists():
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    stages = re.findall(r"^FROM\s+(\S+)", text, re.M)
    assert len(stages) >= 2
    assert "distroless" in stages[-1] and "nonroot" in stages[-1]
    # Numeric: the kubelet checks runAsNonRoot only against a numeric user.
    assert re.search(r"^USER\s+65532:65532\s*$", text, re.M)
    for src in re.findall(r"^COPY\s+(?!--from)(.+)\s+\S+$", text, re.M):
        for p in src.split():
            assert (ROOT / p).exists(), p
    assert "cargo build --release --locked" in text
    ignore = (ROOT / ".dockerignore").read_text()
    assert "target/" in ignore


def build_stage_copies(text):
    """The (sources, destination) of each COPY of the Dockerfile's build stage."""
    stage = re.split(r"^FROM ", text, flags=re.M)[1]
    copies = []
    for line in stage.splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            *sources, destination = line.split()[1:]
            copies.append((sources, destination))
    return copies


def test_the_dockerfile_cargo_command_builds_a_working_binary():
    # No Docker engine here. Run the image's own cargo command, read from the Dockerfile, in a
    # directory holding only what the Dockerfile's build stage copies (a file it forgets fails
    # the build here as it would in Docker), and check what it builds. The target directory is
    # the tree's, so that dependencies are not built twice.
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    m = re.search(r"^RUN (cargo build [^\\&\n]+)", text, re.M)
    assert m, "the Dockerfile runs cargo build"
    command = m.group(1).split()
    if os.environ.get("TG_CARGO_LOCK"):  # the test script serializes cargo runs on this lock
        command = ["flock", os.environ["TG_CARGO_LOCK"], *command]
    with tempfile.TemporaryDirectory(prefix="tg-docker-context-") as context:
        context = Path(context)
        for sources, destination in build_stage_copies(text):
            dest = context / destination
            for source in sources:
                src = ROOT / source
                if src.is_dir():
                    # Docker copies a directory's contents into the destination.
                    shutil.copytree(src, dest, dirs_exist_ok=True)
                elif destination.endswith("/"):
                    dest.mkdir(parents=True, exist_ok=True)
                    shutil.copy(src, dest / src.name)
                else:
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(src, dest)
        env = dict(os.environ, CARGO_TARGET_DIR=str(ROOT / "target"))
        r = subprocess.run(command, cwd=context, env=env, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-4000:]
    binary = ROOT / "target" / "release" / "tensorgate"
    r = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout.startswith("tensorgate "), r.stdout + r.stderr
    # The image's CMD: the config it copies to /etc/tensorgate, checked by that binary.
    r = subprocess.run([str(binary), "check-config", "config/tensorgate.toml"], cwd=ROOT,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr

@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_every_non_root_container_names_a_numeric_user(layout):
    """The kubelet checks runAsNonRoot only against a numeric user: a container that sets it
    must get a runAsUser (its own or the pod's) unless its image's USER is numeric; and the
    tensorgate containers run as the image's nonroot user, 65532."""
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    image_user = re.findall(r"^USER\s+(\S+)", dockerfile, re.M)[-1]
    assert image_user.split(":")[0].isdigit(), image_user
    for doc in render(LAYOUTS[layout]):
        if doc["kind"] != "Deployment":
            continue
        pod = doc["spec"]["template"]["spec"]
        for c in pod["containers"]:
            sc = {**pod.get("securityContext", {}), **c.get("securityContext", {})}
            if not sc.get("runAsNonRoot"):
                continue
            if c["image"] == "tensorgate":
                assert sc.get("runAsUser") == 65532, (layout, c["name"])
            else:
                assert isinstance(sc.get("runAsUser"), int) and sc["runAsUser"] > 0, (layout, c["name"])
            assert sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", (layout, c["name"])
