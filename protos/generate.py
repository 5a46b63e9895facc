"""Regenerate the Python stubs in corral/v1/ from protos/corral/v1/*.proto.

Usage: ``python protos/generate.py [--check]``.  With ``--check`` nothing is written; the exit
status is 1 when the committed stubs differ from what the protos generate (the drift test runs this).
The output is never edited by hand.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
OUT_PACKAGE = ROOT / "corral" / "v1"


def _include_dirs() -> list[str]:
    import google.api
    import grpc_tools

    googleapis = Path(google.api.__path__[0]).parent.parent  # site-packages holding google/api/*.proto
    well_known = Path(grpc_tools.__path__[0]) / "_proto"
    return [str(PROTO_ROOT), str(googleapis), str(well_known)]


def generate(out_root: Path) -> None:
    """Run protoc with the python, grpc and mypy plugins into ``out_root``/corral/v1."""
    from grpc_tools import protoc

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / "corral" / "v1").glob("*.proto"))
    bindir = os.path.dirname(sys.executable)
    args = ["protoc", *(f"-I{d}" for d in _include_dirs()), f"--python_out={out_root}", f"--grpc_python_out={out_root}"]
    # mypy-protobuf's plugins write the .pyi stubs that keep mypy strict over generated code.
    for name, flag in (("protoc-gen-mypy", "mypy"), ("protoc-gen-mypy_grpc", "mypy_grpc")):
        plugin = shutil.which(name, path=bindir + os.pathsep + os.environ.get("PATH", ""))
        if plugin is None:
            raise SystemExit(f"{name} not found: pip install mypy-protobuf")
        args += [f"--plugin={name}={plugin}", f"--{flag}_out={out_root}"]
    if protoc.main([*args, *protos]) != 0:
        raise SystemExit("protoc failed")
    pkg = out_root / "corral" / "v1"
    for path in pkg.glob("*.py*"):
        text = path.read_text()
        # protoc writes absolute imports that match the proto package; they already resolve to
        # corral.v1 because the proto package is corral.v1, so only normalise line endings here.
        text = re.sub(r"[ \t]+\n", "\n", text)
        path.write_text(text)
    (pkg / "__init__.py").write_text(
        '"""Generated gRPC stubs of the corral.v1 contract (protos/generate.py); do not edit."""\n'
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="compare with the committed stubs, write nothing")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        generate(out)
        fresh = out / "corral" / "v1"
        if args.check:
            names = sorted(p.name for p in fresh.iterdir() if p.is_file())
            committed = sorted(p.name for p in OUT_PACKAGE.iterdir() if p.is_file()) if OUT_PACKAGE.exists() else []
            _match, mismatch, errors = filecmp.cmpfiles(fresh, OUT_PACKAGE, names, shallow=False)
            if mismatch or errors or names != committed:
                print(f"corral/v1 drifted from protos/: differ={mismatch + errors} files={names} vs {committed}")
                return 1
            return 0
        OUT_PACKAGE.mkdir(parents=True, exist_ok=True)
        for old in OUT_PACKAGE.iterdir():
            if old.is_file():
                old.unlink()
        for new in fresh.iterdir():
            if new.is_file():
                shutil.copy(new, OUT_PACKAGE / new.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
