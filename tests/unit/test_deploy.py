"""Deployment files: docker-compose.yml, the two Dockerfiles, the KEDA example, the Prometheus config,
the Grafana dashboard and the alert rules, and deploy/launch-workers.sh.

No Docker engine runs on the CI machines, so the compose file and the Dockerfiles are checked for
structure, and the launcher is run for real against a fake `nvidia-smi` and a fake `vela2`.
"""

from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path

import pytest
import yaml

from tests.support import promql
from vela2.errors import InvalidRequest
from vela2.wire.keys import backfill_queue, online_queue
from worker.obs.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
# The model name the examples use: vela2.train.demo_model.DEMO_NAME (importing vela2.train.demo_model would load torch).
DEMO_MODEL = "vela2-demo"
# Environment variables a service may use besides VELA2_*: well-known names of other tools.
STANDARD_ENV = {
    "CUDA_DEVICE_ORDER",
    "CUDA_VISIBLE_DEVICES",
    "HF_HUB_OFFLINE",
    "NVIDIA_DRIVER_CAPABILITIES",
    "NVIDIA_VISIBLE_DEVICES",
    "PIP_DISABLE_PIP_VERSION_CHECK",
    "RABBITMQ_DEFAULT_PASS",  # the official rabbitmq image's first user
    "RABBITMQ_DEFAULT_USER",
    "PIP_NO_CACHE_DIR",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONUNBUFFERED",
    "TRANSFORMERS_OFFLINE",
}
DOCKERFILE_KEYWORDS = {
    "ADD", "ARG", "CMD", "COPY", "ENTRYPOINT", "ENV", "EXPOSE", "FROM", "HEALTHCHECK", "LABEL",
    "ONBUILD", "RUN", "SHELL", "STOPSIGNAL", "USER", "VOLUME", "WORKDIR",
}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# helpers


def _seconds(duration: str | int) -> float:
    """A compose duration ("120s", "1m30s", "2m") or a number of seconds, in seconds."""
    if isinstance(duration, int | float):
        return float(duration)
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, f"bad duration {duration!r}"
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}
    return sum(float(n) * scale[u] for n, u in parts)


def _flag(args: list[str], name: str) -> str:
    """The value after the last `name` in an argv list."""
    idx = [i for i, a in enumerate(args) if a == name]
    assert idx, f"{name} missing from {args}"
    return args[idx[-1] + 1]


def _env_names(environment: list[str] | dict[str, str] | None) -> set[str]:
    if environment is None:
        return set()
    if isinstance(environment, dict):
        return set(environment)
    return {item.split("=", 1)[0] for item in environment}


def _dockerfile(name: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction: comments dropped, continuation lines joined."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in (ROOT / name).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue  # also legal between continuation lines
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        keyword, _, rest = (buf + line).partition(" ")
        out.append((keyword.upper(), rest.strip()))
        buf = ""
    assert not buf, f"{name} ends inside a continuation line"
    return out


def _ignore_match(path: str, pattern: str) -> bool:
    """Docker's .dockerignore match: filepath.Match per segment, anchored at the root, `**/` = any folders."""
    if pattern.startswith("**/"):
        segs = path.split("/")
        return any(_ignore_match("/".join(segs[i:]), pattern[3:]) for i in range(len(segs)))
    segs, pats = path.split("/"), pattern.split("/")
    return len(segs) == len(pats) and all(fnmatch.fnmatchcase(s, p) for s, p in zip(segs, pats, strict=True))


def _dockerignored(rel: str) -> bool:
    """Whether .dockerignore keeps `rel` (or a folder above it) out of the build context."""
    lines = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines()]
    parts = Path(rel).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for line in lines:
        if not line or line.startswith("#"):
            continue
        pattern = line.removeprefix("!").strip("/")
        if any(_ignore_match(prefix, pattern) for prefix in prefixes):
            ignored = not line.startswith("!")
    return ignored


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _gpu_devices(service: dict) -> list[dict]:
    return service["deploy"]["resources"]["reservations"]["devices"]


# ---------------------------------------------------------------------------------------------
# docker-compose.yml


def test_compose_has_the_services(compose):
    assert {"redis", "worker", "http"} <= set(compose["services"])


def test_redis_is_durable_and_never_evicts(compose):
    redis = compose["services"]["redis"]
    assert redis["image"].startswith("redis:7")
    cmd = redis["command"]
    assert cmd[0] == "redis-server"
    assert _flag(cmd, "--appendonly") == "yes"
    assert _flag(cmd, "--appendfsync") == "everysec"
    assert _flag(cmd, "--maxmemory-policy") == "noeviction"
    assert any(v.split(":")[1] == "/data" for v in redis["volumes"]), redis["volumes"]
    assert redis["volumes"][0].split(":")[0] in compose["volumes"]  # a named volume, not a container dir
    assert redis["healthcheck"]["test"][1:] == ["redis-cli", "ping"]


def test_worker_image_gpu_checkpoint_and_health(compose):
    worker = compose["services"]["worker"]
    build = worker["build"]
    assert (ROOT / build["context"] / build.get("dockerfile", "Dockerfile")).is_file()
    [device] = _gpu_devices(worker)
    assert device["capabilities"] == ["gpu"]
    assert device.get("count", 1) == 1 or len(device.get("device_ids", [])) == 1
    # the checkpoint: mounted read-only where --checkpoint points
    cmd = worker["command"]
    assert cmd[0] == "worker"
    ckpt = _flag(cmd, "--checkpoint")
    mounts = []
    for v in worker["volumes"]:
        if isinstance(v, str):
            src, target, *mode = v.split(":")
            mounts.append((target, bool(mode) and "ro" in mode[0].split(",")))
        else:
            mounts.append((v["target"], bool(v.get("read_only"))))
    assert (ckpt, True) in mounts, mounts
    assert _flag(cmd, "--device") == "cuda:0"
    assert int(_flag(cmd, "--visibility-timeout-s")) >= 600
    # the healthcheck asks the worker's readiness on the port it serves its metrics on
    port = _flag(cmd, "--metrics-port")
    assert f":{port}/readyz" in " ".join(worker["healthcheck"]["test"])
    assert worker["depends_on"]["redis"]["condition"] == "service_healthy"
    assert _seconds(worker["stop_grace_period"]) >= 90
    assert worker.get("stop_signal", "SIGTERM") == "SIGTERM"


def test_one_gpu_per_worker_service(compose):
    """Every GPU service pins its own device: no two share one, none uses replicas (they would)."""
    taken: list[str] = []
    for name, svc in compose["services"].items():
        devices = svc.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices")
        if not devices:
            continue
        assert svc.get("deploy", {}).get("replicas", 1) == 1, f"{name}: replicas would all get the same GPU"
        [device] = devices
        assert "gpu" in device["capabilities"]
        if device.get("count") == "all":
            assert svc["entrypoint"] == ["vela2-launch-workers"], f"{name}: all GPUs but no launcher"
            assert "launcher" in svc["profiles"], f"{name} must not run next to the per-GPU services"
            continue
        assert len(device["device_ids"]) == 1, name
        taken += device["device_ids"]
    assert len(taken) >= 2 and len(taken) == len(set(taken)), taken


def test_http_service(compose):
    http = compose["services"]["http"]
    build = http["build"]
    assert (ROOT / build["context"] / build["dockerfile"]).is_file()
    cmd = http["command"]
    assert cmd[0] == "http"
    port = _flag(cmd, "--port")
    assert _flag(cmd, "--host") == "0.0.0.0"
    assert any(str(p).rsplit(":", 1)[-1] == port for p in http["ports"]), http["ports"]
    assert f":{port}/healthz" in " ".join(http["healthcheck"]["test"])
    assert http["depends_on"]["redis"]["condition"] == "service_healthy"


def test_services_reach_redis_by_service_name(compose):
    for name in ("worker", "http"):
        assert _flag(compose["services"][name]["command"], "--redis") == "redis://redis:6379/0", name


def test_env_vars_are_vela2_or_standard(compose):
    names: set[str] = set()
    for svc in compose["services"].values():
        names |= _env_names(svc.get("environment"))
    text = (ROOT / "docker-compose.yml").read_text()
    names |= set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", text))  # interpolated from the host
    for dockerfile in ("Dockerfile", "Dockerfile.http"):
        for keyword, rest in _dockerfile(dockerfile):
            if keyword == "ENV":
                names |= set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=", rest))
    assert "VELA2_PRECISION" in names  # the scan sees interpolations
    odd = sorted(n for n in names if not n.startswith("VELA2_") and n not in STANDARD_ENV)
    assert not odd, f"environment variables neither VELA2_* nor standard: {odd}"


def test_prometheus_scrapes_the_worker_metrics_port(compose):
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    port = int(_flag(compose["services"]["worker"]["command"], "--metrics-port"))
    scraped: set[tuple[str, int]] = set()
    for job in prom["scrape_configs"]:
        for sd in job.get("dns_sd_configs", []):
            scraped |= {(n, sd["port"]) for n in sd["names"]}
    assert ("worker", port) in scraped
    assert ("workers", port + 1) in scraped  # launcher: worker k on port + k
    assert ("http", int(_flag(compose["services"]["http"]["command"], "--port"))) in scraped  # the route's /metrics
    assert {n for n, _ in scraped} <= set(compose["services"])
    volumes = compose["services"]["prometheus"]["volumes"]
    [config] = [v.split(":")[1] for v in volumes if v.startswith("./deploy/prometheus.yml:")]
    # every rule file the config names is mounted where Prometheus looks: relative to the config
    for rule_file in prom["rule_files"]:
        inside = str(Path(config).parent / rule_file)
        assert f"./deploy/{rule_file}:{inside}:ro" in volumes, rule_file
    # the worker binds loopback by default (worker.settings): in its container it must listen on the
    # compose network, and no worker service publishes the metrics port on the host
    for name in ("worker", "workers"):
        assert "VELA2_METRICS_HOST=0.0.0.0" in compose["services"][name]["environment"], name
        assert "ports" not in compose["services"][name], name


def test_every_published_port_is_loopback_by_default(compose):
    """Nothing is published on the host's other interfaces unless its *_BIND variable says so."""
    for name, svc in compose["services"].items():
        for p in svc.get("ports", []):
            assert str(p).startswith(("127.0.0.1:", "${VELA2_HTTP_BIND:-127.0.0.1}:")), (name, p)


# ---------------------------------------------------------------------------------------------
# Dockerfiles


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.http"])
def test_dockerfile_structure(name):
    ins = _dockerfile(name)
    keywords = [k for k, _ in ins]
    assert set(keywords) <= DOCKERFILE_KEYWORDS, set(keywords) - DOCKERFILE_KEYWORDS
    assert keywords[0] == "FROM"
    assert keywords.count("FROM") == 1
    entry = [json.loads(r) for k, r in ins if k == "ENTRYPOINT"]
    assert entry == [["vela2"]]
    [cmd] = [json.loads(r) for k, r in ins if k == "CMD"]
    assert cmd[0] == ("worker" if name == "Dockerfile" else "http")
    assert ("STOPSIGNAL", "SIGTERM") in ins
    users = [r for k, r in ins if k == "USER"]
    assert users and users[-1] not in {"root", "0"}
    assert "HEALTHCHECK" in keywords
    # every COPY source exists and reaches the build context
    for keyword, rest in ins:
        if keyword == "COPY":
            *sources, _dest = [a for a in rest.split() if not a.startswith("--")]
            for src in sources:
                assert (ROOT / src).exists(), f"{name}: COPY {src}: no such path"
                assert not _dockerignored(src), f"{name}: COPY {src} is excluded by .dockerignore"


def test_worker_dockerfile_keeps_the_images_torch():
    ins = _dockerfile("Dockerfile")
    assert "pytorch" in ins[0][1] and "cuda" in ins[0][1]
    [install] = [r for k, r in ins if k == "RUN" and "pip install" in r]
    assert ("--no-deps" in install) or ("-c " in install and "torch==" in install), install
    assert ".[worker]" in install
    [cmd] = [json.loads(r) for k, r in ins if k == "CMD"]
    assert _flag(cmd, "--checkpoint") == "/models/ckpt" and _flag(cmd, "--device") == "cuda:0"
    assert any(k == "COPY" and "deploy/launch-workers.sh" in r for k, r in ins)


def test_http_dockerfile_has_no_torch():
    ins = _dockerfile("Dockerfile.http")
    assert "cuda" not in ins[0][1] and "pytorch" not in ins[0][1]
    [install] = [r for k, r in ins if k == "RUN" and "pip install" in r]
    assert ".[producer]" in install
    assert not re.search(r"\[[^\]]*(worker|model|dev)[^\]]*\]", install), install
    [cmd] = [json.loads(r) for k, r in ins if k == "CMD"]
    assert _flag(cmd, "--host") == "0.0.0.0"


def test_dockerignore_keeps_the_context_small():
    for path in (".venv", ".git", ".cache", "tests", ".venv/bin/python", "vela2/__pycache__/x.pyc"):
        assert _dockerignored(path), path
    for path in ("vela2", "worker/settings.py", "producer", "stack", "pyproject.toml", "README.md",
                 "deploy/launch-workers.sh"):
        assert not _dockerignored(path), path


# ---------------------------------------------------------------------------------------------
# KEDA


def test_keda_scaledobject():
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy" / "keda-scaledobject.yaml").read_text()) if d]
    [so] = [d for d in docs if d["kind"] == "ScaledObject"]
    [dep] = [d for d in docs if d["kind"] == "Deployment"]
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    assert so["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
    triggers = so["spec"]["triggers"]
    lists = {t["metadata"]["listName"]: t for t in triggers if t["type"] == "redis"}
    assert set(lists) == {online_queue(DEMO_MODEL), backfill_queue(DEMO_MODEL)}
    for t in lists.values():
        assert int(t["metadata"]["listLength"]) > 0
        assert re.fullmatch(r"[\w.-]+:\d+", t["metadata"]["address"])
    # LLEN misses delivered-but-unacked messages: a prometheus trigger counts them
    [prom] = [t for t in triggers if t["type"] == "prometheus"]
    assert "vela2_unacked_messages" in prom["metadata"]["query"] and prom["metadata"]["query"].startswith("max(")
    # the formula sums every trigger, by name
    mods = so["spec"]["advanced"]["scalingModifiers"]
    assert set(re.findall(r"[A-Za-z_]\w*", mods["formula"])) == {t["name"] for t in triggers}
    assert "+" in mods["formula"] and float(mods["target"]) > 0
    pod = dep["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= 90
    [container] = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["startupProbe"]["httpGet"]["path"] == container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    # the start is given 3x the slowest start measured on the H200 (9B, cold, empty compile cache)
    measured = json.loads((ROOT / "bench/results/gpu-coldstart.json").read_text())["shapes"]["9b"]["starts"]
    slowest = max(v["ready_s"] for k, v in measured.items() if isinstance(v, dict))
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 3 * slowest
    assert _flag(container["args"], "--metrics-host") == "0.0.0.0"  # probes come from the kubelet, not loopback
    assert _flag(container["args"], "--device") == "cuda:0"
    ckpt = _flag(container["args"], "--checkpoint")
    assert {"mountPath": ckpt, "name": "checkpoint", "readOnly": True} in container["volumeMounts"]


# ---------------------------------------------------------------------------------------------
# launch-workers.sh


def test_keda_scaledobject_for_rabbitmq():
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy" / "keda-scaledobject-rabbitmq.yaml").read_text()) if d]
    [so] = [d for d in docs if d["kind"] == "ScaledObject"]
    [auth] = [d for d in docs if d["kind"] == "TriggerAuthentication"]
    [secret] = [d for d in docs if d["kind"] == "Secret"]
    redis_docs = yaml.safe_load_all((ROOT / "deploy" / "keda-scaledobject.yaml").read_text())
    [dep] = [d for d in redis_docs if d and d["kind"] == "Deployment"]
    assert so["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
    triggers = so["spec"]["triggers"]
    queues = {t["metadata"]["queueName"]: t for t in triggers if t["type"] == "rabbitmq"}
    assert set(queues) == {online_queue(DEMO_MODEL), backfill_queue(DEMO_MODEL)} and len(triggers) == 2
    for t in queues.values():
        # over http (the management API) QueueLength counts unacked messages too; over amqp it would not
        assert t["metadata"]["protocol"] == "http" and t["metadata"]["mode"] == "QueueLength"
        assert int(t["metadata"]["value"]) > 0 and t["authenticationRef"]["name"] == auth["metadata"]["name"]
    [ref] = auth["spec"]["secretTargetRef"]
    assert ref["parameter"] == "host" and ref["name"] == secret["metadata"]["name"]
    assert secret["stringData"][ref["key"]].startswith("http://")
    assert secret["stringData"]["amqp-url"].startswith("amqp://")
    mods = so["spec"]["advanced"]["scalingModifiers"]
    assert set(re.findall(r"[A-Za-z_]\w*", mods["formula"])) == {t["name"] for t in triggers}


def test_the_rabbitmq_profile(compose):
    rabbit = compose["services"]["rabbitmq"]
    assert rabbit["profiles"] == ["rabbitmq"] and rabbit["image"].startswith("rabbitmq:")
    assert rabbit["volumes"][0].split(":")[0] in compose["volumes"]  # durable: a named volume
    assert all(not p.startswith(("5672", "0.0.0.0")) for p in rabbit.get("ports", []))  # only the UI, on loopback
    for name in ("worker", "http"):  # the broker URL reaches both from the environment, never argv
        assert "VELA2_BROKER_URL" in compose["services"][name]["environment"], name


# ---------------------------------------------------------------------------------------------
# Grafana dashboard and alert rules (tests/integration/worker/obs/test_dashboards.py has a real
# Prometheus evaluate them against a worker, and promtool fire every alert)


def test_the_dashboard_is_importable():
    board = promql.dashboard()
    assert isinstance(board["schemaVersion"], int) and board["schemaVersion"] >= 36
    assert board["uid"] and board["title"] and board["id"] is None  # Grafana gives the id on import
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    model = variables["model"]
    assert model["type"] == "query" and model["datasource"]["uid"] == "${datasource}"
    assert model["query"]["query"] == "label_values(vela2_worker_info, model)" and model["allValue"] == ".+"
    everything = board["panels"] + [c for p in board["panels"] if p["type"] == "row" for c in p.get("panels", [])]
    assert len({p["id"] for p in everything}) == len(everything)
    taken: set[tuple[int, int]] = set()  # grid cells: no two panels overlap, none is wider than the grid
    for p in everything:
        g = p["gridPos"]
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert g["x"] + g["w"] <= 24 and not cells & taken, p["title"]
        taken |= cells
    usable = (set(variables) - {"datasource"}) | set(promql.GRAFANA_BUILTINS)
    for p in promql.panels(board):
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["description"] and p["fieldConfig"]["defaults"]["unit"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"] and t["expr"].strip(), p["title"]
            assert promql.variables(t["expr"]) <= usable, (p["title"], t["expr"])


def test_the_alert_rules_are_complete_and_loaded():
    rules = promql.alert_rules()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names)) and all(re.fullmatch(r"Vela2[A-Z]\w+", n) for n in names), names
    for r in rules:
        assert _seconds(r["for"]) > 0 and r["labels"]["severity"] in {"critical", "warning"}, r["alert"]
        assert set(r["annotations"]) == {"summary", "description"}, r["alert"]
        for text in r["annotations"].values():  # $labels only: test_dashboards.py renders them so
            assert all(re.fullmatch(r"\{\{ \$labels\.\w+ \}\}", t) for t in re.findall(r"\{\{.*?\}\}", text)), text
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    assert [(ROOT / "deploy" / f).resolve() for f in prom["rule_files"]] == [promql.ALERTS]


def _exported() -> dict[str, list[dict[str, str]]]:
    """Every sample a worker exports, by name: its labels. A worker's Metrics with every path
    taken (GPU figures given, a batch that raised, a failure), plus Prometheus's own `up`."""
    import fakeredis

    m = Metrics()
    m.describe_worker(model=DEMO_MODEL, device="cuda:0", precision="bf16", redis=fakeredis.FakeRedis(),
                      queues=[online_queue(DEMO_MODEL), backfill_queue(DEMO_MODEL)],
                      gpu_memory_source=lambda: {"allocated": 1.0, "reserved": 2.0, "peak": 2.0, "total": 4.0})
    m.observe_batch([10, 20], ok=True)
    m.observe_batch([10], ok=False)
    m.observe_result("ok", None, {"queue_ms": 1.0, "render_ms": 1.0, "model_ms": 1.0, "decode_ms": 1.0})
    m.observe_result("error", "model_error", None)
    out: dict[str, list[dict[str, str]]] = {"up": [{}]}
    for family in m.registry.collect():
        for sample in family.samples:
            out.setdefault(sample.name, []).append(dict(sample.labels))
    return out


def test_dashboard_and_alerts_select_what_a_worker_exports():
    """Names and labels, without a Prometheus: a typo fails here first."""
    exported = _exported()
    exprs = [(title, promql.fill(e, {"model": DEMO_MODEL})) for title, e in promql.queries(promql.dashboard())]
    exprs += [(r["alert"], r["expr"]) for r in promql.alert_rules()]
    assert len(exprs) > 30
    for where, expr in exprs:
        found = promql.selectors(expr)
        assert found, (where, expr)
        for sel in found:
            assert sel.name in exported, f"{where}: {sel.name} is not a metric a worker exports"
            for label, op, value in sel.matches():
                values = {s.get(label) for s in exported[sel.name]}
                assert label in {"instance", "job"} or values != {None}, f"{where}: {sel} has no label {label}"
                assert op != "=" or label in {"instance", "job"} or value in values, f"{where}: {sel}: {values}"


def test_the_callers_errors_left_out_of_the_error_alerts_are_the_invalid_request_codes():
    codes, todo = set(), [InvalidRequest]
    while todo:
        cls = todo.pop()
        codes.add(cls.code)
        todo += cls.__subclasses__()
    text = promql.ALERTS.read_text() + promql.DASHBOARD.read_text()
    excluded = re.findall(r'reason!~\\?"([^"\\]+)', text)
    assert len(excluded) >= 2 and all(set(x.split("|")) == codes for x in excluded), (excluded, codes)
