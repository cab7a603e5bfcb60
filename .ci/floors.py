"""Print a pip constraints file that pins every direct dependency of pyproject.toml to its declared floor.

``pip install -c <this output> -e ".[dev,vision]"`` then installs the lowest versions the project claims to support
(what ``uv pip install --resolution lowest-direct`` does, with pip): the floors CI proves, not ones it assumes.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib

project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
requirements = list(project["dependencies"])
for extra in ("dev", "vision"):
    requirements += project["optional-dependencies"][extra]
pins = {}
for requirement in requirements:
    match = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(?:\[[^\]]*\])?\s*([^;#]*)", requirement)
    name, specifiers = match.group(1).lower().replace("_", "-"), match.group(2)
    floor = re.search(r">=\s*([0-9][^,\s]*)", specifiers)
    if floor:
        pins[name] = floor.group(1)
if not pins:
    sys.exit("pyproject.toml declares no floors")
print("\n".join(f"{name}=={version}" for name, version in sorted(pins.items())))
