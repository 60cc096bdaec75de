"""Copy the one recording schema (../schema/recording.json) into built wheels.

The schema has a single source of truth at the repository root. Editable installs read it in
place; a built wheel gets a copy under tailscope/data/ so that it works away from the repo.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SCHEMA = Path(__file__).resolve().parent.parent / "schema" / "recording.json"


class BuildPyWithSchema(build_py):
    def run(self):
        super().run()
        if SCHEMA.exists() and not getattr(self, "editable_mode", False):
            dest = Path(self.build_lib) / "tailscope" / "data"
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(SCHEMA, dest / "recording.json")


setup(cmdclass={"build_py": BuildPyWithSchema})
