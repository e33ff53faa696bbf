"""Every distribution of the repository carries what an index page and a user need.

Building them is scripts/wheelhouse (wheels from sdists, LICENSE in each artifact,
``twine check --strict``), run by the newcomer check; this checks the sources fast.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECTS = sorted(
    [ROOT, *(p.parent for p in ROOT.glob("backends/*/pyproject.toml"))]
    + [p.parent for p in ROOT.glob("examples/*/pyproject.toml")]
)


def _project(directory: Path) -> dict[str, Any]:
    with (directory / "pyproject.toml").open("rb") as file:
        project: dict[str, Any] = tomllib.load(file)["project"]
    return project


def test_every_distribution_is_found() -> None:
    names = {_project(directory)["name"] for directory in PROJECTS}
    assert names >= {
        "multilock",
        "multilock-postgres",
        "multilock-redis",
        "multilock-zookeeper",
        "multilock-etcd",
        "multilock-nats",
        "multilock-mysql",
        "multilock-sqlite",
    }


@pytest.mark.parametrize("directory", PROJECTS, ids=[p.name for p in PROJECTS])
def test_metadata_of_a_distribution(directory: Path) -> None:
    project = _project(directory)
    assert (directory / project["readme"]).is_file()
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    # Every distribution ships the same license text, copied beside its pyproject.toml
    # (a build cannot reach above its own directory).
    assert (directory / "LICENSE").read_bytes() == (ROOT / "LICENSE").read_bytes()
    classifiers = set(project["classifiers"])
    assert {"Operating System :: POSIX", "Typing :: Typed"} <= classifiers
    assert not any(c.startswith("License ::") for c in classifiers)  # the expression says it
    assert project["requires-python"] == _project(ROOT)["requires-python"]
    if directory != ROOT:  # a backend needs the core, which pip finds beside it or on an index
        assert any(dep.startswith("multilock>=") for dep in project["dependencies"])


@pytest.mark.parametrize("directory", PROJECTS, ids=[p.name for p in PROJECTS])
def test_the_version_is_written_once(directory: Path) -> None:
    """pyproject.toml reads the version from the package's ``__version__`` (hatch's
    version source): no second copy to forget at a release."""
    with (directory / "pyproject.toml").open("rb") as file:
        config = tomllib.load(file)
    assert "version" not in config["project"]
    assert config["project"]["dynamic"] == ["version"]
    source = directory / config["tool"]["hatch"]["version"]["path"]
    assert source.read_text().count("\n__version__ = ") == 1
