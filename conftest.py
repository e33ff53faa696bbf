"""What the tests of every distribution in this repository share: the test CA.

The TLS tests of each backend start their servers with certificates that
``scripts/test-ca`` makes once per session. This file is the repository's, as that
script is: the distributions' own conftest files hold what only they use, and the
servers every distribution's tests start are in :mod:`multilock.testing._servers`.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from multilock.testing._servers import unavailable

SCRIPTS = Path(__file__).resolve().parent / "scripts"


@pytest.fixture(scope="session")
def test_ca(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of test certificates made by ``scripts/test-ca`` (see there)."""
    directory = tmp_path_factory.mktemp("tls") / "ca"
    try:
        subprocess.run([SCRIPTS / "test-ca", directory], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        unavailable(request.config, f"cannot make the test CA with scripts/test-ca: {exc}")
    return directory
