"""Fixtures of the tests that use the real Docker engine and the images built from deploy/.

- ``docker_client`` (session): a docker SDK client of the local daemon (DOCKER_HOST, else the
  default socket). Docker unreachable: the tests skip, or fail when CI=true (CI must run them).
- ``control_image`` / ``worker_image`` (session): the tags (``corral-control:test``,
  ``corral-worker:test``) of the images built from deploy/Dockerfile (targets ``control`` and
  ``worker``) on the local ``python:3.11-slim`` (made by make-python-base.sh), with host networking
  and no pull. An image is built once per session and reused across sessions while its inputs are
  unchanged: it carries the label ``corral.source-hash``, a digest of the build context (the files
  .dockerignore lets through, which is what the daemon receives) and of the base image's id.
- ``docker_labels`` (function): ``{"corral.test": <unique value>}`` for a test's containers; every
  container carrying it is removed at teardown. :func:`remove_containers` removes by any label.

The daemon is shared with other test sessions: tests only ever remove containers they labelled.
Every test in tests/docker is marked ``docker`` (``pytest -m docker`` / ``-m "not docker"``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
DOCKERFILE = "deploy/Dockerfile"
BASE_IMAGE = "python:3.11-slim"
TEST_LABEL = "corral.test"
SOURCE_HASH_LABEL = "corral.source-hash"
BUILD_TIMEOUT_SEC = 1800
"""A socket read timeout for builds: a compile step can print nothing for minutes."""
IMAGE_TEST_TIMEOUT_SEC = 900
"""pytest-timeout of a test whose fixtures may build an image (the first one of a session pays)."""

_HERE = Path(__file__).resolve().parent


def in_ci() -> bool:
    """Whether this is a CI run (CI=true), where a missing Docker is a failure, not a skip."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def unavailable(reason: str) -> NoReturn:
    """Skip the test for a missing Docker part, or fail it in CI."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: the Docker tests must run; .ci/docker.sh sets Docker up)")
    pytest.skip(reason)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test of this directory ``docker``; give those that may build an image (a cold
    build compiles the kernels: minutes on 2 CPUs) IMAGE_TEST_TIMEOUT_SEC unless they set their own."""
    for item in items:
        if _HERE not in item.path.parents:
            continue
        item.add_marker(pytest.mark.docker)
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & {"control_image", "worker_image"} and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(IMAGE_TEST_TIMEOUT_SEC))


def remove_containers(client: Any, label: str) -> list[str]:
    """Force-remove every container (running or not) with ``label`` (``key=value``), and its anonymous
    volumes; returns their names. Containers without the label are never touched."""
    import docker.errors

    removed = []
    for container in client.containers.list(all=True, filters={"label": label}):
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True, v=True)
            removed.append(container.name)
    return removed


def dockerignore_patterns(root: Path = ROOT) -> list[str]:
    """The patterns of ``root``/.dockerignore, without comments and blank lines."""
    lines = (root / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def build_context_files(root: Path = ROOT) -> list[str]:
    """The files of the build context (relative paths, sorted): what ``docker build`` sends."""
    from docker.utils.build import exclude_paths

    included = exclude_paths(str(root), dockerignore_patterns(root), dockerfile=DOCKERFILE)
    return sorted(p for p in included if (root / p).is_file())


def source_hash(base_image_id: str, root: Path = ROOT) -> str:
    """A digest of the build's inputs: the context's paths and contents, and the base image."""
    digest = hashlib.sha256(base_image_id.encode())
    for rel in build_context_files(root):
        digest.update(rel.encode() + b"\0")
        digest.update(hashlib.sha256((root / rel).read_bytes()).digest())
    return digest.hexdigest()


def build_image(client: Any, target: str, tag: str) -> str:
    """Build ``target`` of deploy/Dockerfile as ``tag`` unless an image of the same inputs has it."""
    import docker
    import docker.errors

    base = None
    with contextlib.suppress(docker.errors.ImageNotFound):
        base = client.images.get(BASE_IMAGE)
    if base is None:
        unavailable(f"the base image {BASE_IMAGE} is missing; build it with ../shared/tools/make-python-base.sh")
    wanted = source_hash(base.id)
    with contextlib.suppress(docker.errors.ImageNotFound):
        if client.images.get(tag).labels.get(SOURCE_HASH_LABEL) == wanted:
            return tag
    builder = docker.from_env(timeout=BUILD_TIMEOUT_SEC)  # the same daemon, with a longer read timeout
    log: list[str] = []
    try:
        for chunk in builder.api.build(
            path=str(ROOT),
            dockerfile=DOCKERFILE,
            target=target,
            tag=tag,
            labels={SOURCE_HASH_LABEL: wanted},
            network_mode="host",
            pull=False,
            rm=True,
            forcerm=True,
            decode=True,
        ):
            if "stream" in chunk:
                log.append(chunk["stream"])
            if "error" in chunk:
                tail = "".join(log)[-4000:]
                pytest.fail(f"docker build --target {target} failed: {chunk['error'].strip()}\n{tail}")
    finally:
        builder.close()
    return tag


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    """A docker SDK client of the local daemon (skip without one; fail in CI)."""
    try:
        import docker
        import docker.errors
    except ImportError:
        unavailable("the docker SDK (PyPI: docker) is not installed")
    problem = ""
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except docker.errors.DockerException as exc:
        problem = f"Docker is not reachable: {exc}"
    if problem:  # outside the except block: the report is the reason, without the SDK's traceback
        unavailable(problem)
    yield client
    client.close()


@pytest.fixture(scope="session")
def control_image(docker_client: Any) -> str:
    """Tag of the control-plane image built from deploy/Dockerfile (target ``control``)."""
    return build_image(docker_client, "control", "corral-control:test")


@pytest.fixture(scope="session")
def worker_image(docker_client: Any) -> str:
    """Tag of the worker image built from deploy/Dockerfile (target ``worker``)."""
    return build_image(docker_client, "worker", "corral-worker:test")


@pytest.fixture
def docker_labels(docker_client: Any, request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """Labels for this test's containers; they are all removed at teardown."""
    value = f"{request.node.name[:48]}-{uuid.uuid4().hex[:8]}"
    yield {TEST_LABEL: value}
    remove_containers(docker_client, f"{TEST_LABEL}={value}")
