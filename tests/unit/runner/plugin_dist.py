"""A plug-in distribution on disk, as ``pip install`` would leave it: a module and a dist-info directory.

Its one entry point in the ``corral.job_types`` group registers ``demo_shout`` ({"text"} -> {"shout"}).
"""

from __future__ import annotations

from pathlib import Path

from runner.plugins import ENTRY_POINT_GROUP

__all__ = ["make_plugin_distribution"]


def make_plugin_distribution(root: Path, value: str = "corral_demo_plugin:Shout") -> Path:
    """Write the distribution into ``root`` (put it on PYTHONPATH / sys.path); returns ``root``."""
    (root / "corral_demo_plugin.py").write_text(
        "from runner.registry import JobType\n\n\n"
        "class Shout(JobType):\n"
        '    """Upper-case a text."""\n\n'
        '    name = "demo_shout"\n'
        '    schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}\n\n'
        "    def run(self, payload, ctx):\n"
        '        return {"shout": payload["text"].upper(), "threads": ctx.threads}\n'
    )
    info = root / "corral_demo_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: corral-demo-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\ndemo_shout = {value}\n")
    return root
