"""The dependency rule: corral <- runner <- worker, corral <- control; control and worker never
import each other; domain modules of control never import grpc."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOMAIN = ["jobs", "queue", "registry", "dispatch", "scheduler", "sessions", "reaper", "backoff", "clock", "watch",
          "config", "admission", "store"]  # fmt: skip


def imports(package: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in (ROOT / package).rglob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(ROOT))] = names
    return found


def test_packages_import_in_one_direction() -> None:
    forbidden = {"corral": {"control", "worker", "runner"}, "runner": {"control", "worker"},
                 "worker": {"control"}, "control": {"worker", "runner"}}  # fmt: skip
    for package, banned in forbidden.items():
        for path, names in imports(package).items():
            assert not names & banned, f"{path} imports {names & banned}"


def test_control_domain_modules_do_not_import_grpc() -> None:
    for path, names in imports("control").items():
        parts = Path(path).parts
        if parts[1].removesuffix(".py") in DOMAIN:
            assert "grpc" not in names, f"{path} imports grpc"
