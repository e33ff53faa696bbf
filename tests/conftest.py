"""Session fixtures for the core's tests: one URL per backend, reachable or skipped.

Each fixture reads its server from the environment (``MULTILOCK_POSTGRES_URL``...,
defaults below) and hands it to :func:`multilock.testing.server_url`, which skips
the test when the server does not answer -- or fails it when backends are
required (``--multilock-require-backends`` / ``MULTILOCK_REQUIRE_BACKENDS=1``).

With ``--docker`` (or ``MULTILOCK_DOCKER=1``) the server URLs come from the
containers of ``docker-compose.yml`` instead, started through pytest-docker's
``docker_services`` fixture and exported as the same environment variables. That
fixture is only requested in that mode, so the plugin stays inert (and Docker
unneeded) on the default path. The containers start with the first test under
``tests/``; a run of only ``backends/`` with ``--docker`` starts none.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from multilock.testing import server_url
from multilock.testing._servers import unavailable

DEFAULT_URLS = {
    "postgres": "postgresql://postgres@127.0.0.1:5432/test",
    "redis": "redis://127.0.0.1:6379/15",
    "zookeeper": "zookeeper://127.0.0.1:2181/multilock-test",
    "etcd": "etcd://127.0.0.1:2379/multilock-test",
    "nats": "nats://127.0.0.1:4222/multilock-test",
    "mysql": "mysql://root@127.0.0.1:3306/test",
}
DOCKER_ENV = "MULTILOCK_DOCKER"

# service in docker-compose.yml -> (container port, URL with {host} and {port})
_DOCKER_SERVICES = {
    "postgres": (5432, "postgresql://postgres@{host}:{port}/test"),
    "redis": (6379, "redis://{host}:{port}/15"),
    "zookeeper": (2181, "zookeeper://{host}:{port}/multilock-test"),
    "mysql": (3306, "mysql://root@{host}:{port}/test"),
}
_DOCKER_START_TIMEOUT = 120.0


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register ``--docker``."""
    parser.addoption(
        "--docker",
        action="store_true",
        default=False,
        help=f"run the servers from docker-compose.yml (env {DOCKER_ENV}=1)",
    )


def use_docker(config: pytest.Config) -> bool:
    """Whether the servers come from docker compose rather than the environment."""
    if config.getoption("docker", default=False):
        return True
    return os.environ.get(DOCKER_ENV, "").strip().lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def docker_compose_file(pytestconfig: pytest.Config) -> str:
    """pytest-docker: the compose file at the repository root."""
    return str(Path(pytestconfig.rootpath) / "docker-compose.yml")


def _answers(config: pytest.Config, url: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            server_url(config, url)
        except (pytest.skip.Exception, pytest.fail.Exception):
            return False
        return True

    return check


@pytest.fixture(scope="session", autouse=True)
def _docker_servers(request: pytest.FixtureRequest) -> None:
    """In docker mode, start the compose services and point ``MULTILOCK_*_URL`` at them.

    Through the environment, so that the backend distributions' own fixtures, which
    read the same variables, use the containers too when they run in this session.
    """
    if not use_docker(request.config):
        return
    docker_services = request.getfixturevalue("docker_services")
    docker_ip = request.getfixturevalue("docker_ip")
    for service, (container_port, template) in _DOCKER_SERVICES.items():
        port = docker_services.port_for(service, container_port)
        url = template.format(host=docker_ip, port=port)
        docker_services.wait_until_responsive(
            check=_answers(request.config, url), timeout=_DOCKER_START_TIMEOUT, pause=0.5
        )
        os.environ[f"MULTILOCK_{service.upper()}_URL"] = url


def _url(request: pytest.FixtureRequest, service: str) -> str:
    url = os.environ.get(f"MULTILOCK_{service.upper()}_URL") or DEFAULT_URLS[service]
    return server_url(request.config, url)


@pytest.fixture(scope="session")
def postgres_url(request: pytest.FixtureRequest) -> str:
    """A reachable PostgreSQL lock URL (``MULTILOCK_POSTGRES_URL``)."""
    return _url(request, "postgres")


@pytest.fixture(scope="session")
def redis_url(request: pytest.FixtureRequest) -> str:
    """A reachable Redis lock URL (``MULTILOCK_REDIS_URL``)."""
    return _url(request, "redis")


@pytest.fixture(scope="session")
def zookeeper_url(request: pytest.FixtureRequest) -> str:
    """A reachable ZooKeeper lock URL (``MULTILOCK_ZOOKEEPER_URL``)."""
    return _url(request, "zookeeper")


@pytest.fixture(scope="session")
def etcd_url(request: pytest.FixtureRequest) -> str:
    """A reachable etcd lock URL (``MULTILOCK_ETCD_URL``)."""
    return _url(request, "etcd")


@pytest.fixture(scope="session")
def nats_url(request: pytest.FixtureRequest) -> str:
    """A reachable NATS JetStream lock URL (``MULTILOCK_NATS_URL``)."""
    return _url(request, "nats")


@pytest.fixture(scope="session")
def mysql_url(request: pytest.FixtureRequest) -> str:
    """A reachable MySQL/MariaDB lock URL (``MULTILOCK_MYSQL_URL``)."""
    return _url(request, "mysql")


@pytest.fixture(scope="session")
def file_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A ``file://`` URL on a fresh directory of this test session."""
    return server_url(request.config, f"file://{tmp_path_factory.mktemp('locks')}")


@pytest.fixture(scope="session")
def memory_url(request: pytest.FixtureRequest) -> str:
    """A ``memory://`` URL on a namespace of this test session's own."""
    return server_url(request.config, f"memory://tests-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _faketime_env(offset: float) -> dict[str, str]:
    """The environment that gives a process a clock ``offset`` s from true time.

    The monotonic clocks stay true, as a skewed host's are. (libfaketime 0.9.10 then
    makes Python's ``time.sleep`` fail with EINVAL; condition waits work, and offsetting
    the monotonic clocks too breaks those instead.)"""
    return {
        # $LIB is the dynamic loader's own token: the library of the right architecture.
        "LD_PRELOAD": "/usr/$LIB/faketime/libfaketimeMT.so.1",
        "FAKETIME": f"{offset:+.3f}",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
    }


@pytest.fixture(scope="session")
def faketime(request: pytest.FixtureRequest) -> Callable[[float], dict[str, str]]:
    """Skewed clocks for processes: ``faketime(offset)`` is the environment of a process
    whose clock is ``offset`` s off (libfaketime: Debian's ``faketime``, which scripts/test
    installs). Skips when it is missing -- fails when backends are required."""
    import shutil
    import subprocess
    import sys
    import time

    works = shutil.which("faketime") is not None
    if works:
        probe = subprocess.run(
            [sys.executable, "-c", "import time; print(time.time())"],
            env={**os.environ, **_faketime_env(1000.0)},
            capture_output=True,
            text=True,
            check=False,
        )
        works = probe.returncode == 0 and float(probe.stdout) > time.time() + 900
    if not works:
        unavailable(
            request.config,
            "libfaketime (Debian's faketime package) is not installed or does not work",
        )
    return _faketime_env
