"""URLs and options of ``zookeeper://``: strict parsing, masked passwords, TLS. No server needed."""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

import pytest

import multilock
from multilock.backend import LockURL
from multilock.errors import InvalidOption, InvalidURL
from multilock_zookeeper import AsyncZooKeeperLocker, ZooKeeperLocker, backend
from multilock_zookeeper._config import DEFAULT_ROOT, Config


def config(url: str, **options: object) -> Config:
    return Config.from_url(LockURL.parse(url, **options))


def test_every_host_and_the_chroot_are_kept() -> None:
    parsed = config("zookeeper://zk1:2181,zk2,[::1]:2182/apps/locks/")
    assert parsed.hosts == "zk1:2181,zk2:2181,[::1]:2182"
    assert parsed.root == "/apps/locks"
    assert parsed.node_path("job") == "/apps/locks/job"


def test_defaults_are_modest_and_safe() -> None:
    parsed = config("zk://127.0.0.1")
    assert parsed.root == DEFAULT_ROOT
    assert parsed.session_timeout == 10.0
    assert parsed.connect_timeout == 5.0
    assert parsed.suspended == "lost"
    assert parsed.auth_data == []


def test_options_are_converted() -> None:
    parsed = config("zookeeper://h/x?session_timeout=500ms&connect_timeout=2&suspended=KEEP&ttl=1m")
    assert (parsed.session_timeout, parsed.connect_timeout, parsed.suspended, parsed.ttl) == (
        0.5,
        2.0,
        "keep",
        60.0,
    )


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("zookeeper://h/x?session_timout=1s", "unknown option 'session_timout'"),
        ("zookeeper://h/x?suspended=maybe", "expected one of lost, keep"),
        ("zookeeper://h/x?session_timeout=0", "must be positive"),
        ("zookeeper://h/x?connect_timeout=soon", "connect_timeout"),
    ],
)
def test_bad_options_are_named(url: str, fragment: str) -> None:
    with pytest.raises(InvalidOption, match=fragment):
        config(url)


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("zookeeper:///x", "names no ZooKeeper server"),
        ("zookeeper://h/a//b", "invalid chroot"),
        ("zookeeper://h/a/../b", "invalid chroot"),
        ("zookeeper://h/a/%01b", "invalid chroot"),
        ("zookeeper://h/zookeeper/locks", "reserved"),
    ],
)
def test_bad_urls_are_explained(url: str, fragment: str) -> None:
    with pytest.raises(InvalidURL, match=fragment):
        config(url)


def test_credentials_from_the_url_or_options() -> None:
    in_url = config("zookeeper://app:s3cret@h/x")
    as_options = config("zookeeper://h/x", username="app", password="s3cret")
    assert in_url.auth_data == as_options.auth_data == [("digest", "app:s3cret")]
    perms = sorted((acl.id.scheme, acl.perms) for acl in in_url.acl)
    assert perms == [("digest", 31)]  # all for us, nothing (not even read) for others


@pytest.mark.parametrize(
    "url", ["zookeeper://app@h/x", "zookeeper://h/x?password=p", "zookeeper://a%3Ab:p@h/x"]
)
def test_incomplete_or_bad_credentials_are_refused(url: str) -> None:
    with pytest.raises(InvalidOption):
        config(url)


def test_password_is_masked_everywhere(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    for url in (
        "zookeeper://app:s3cret@127.0.0.1:1/x",
        "zk://127.0.0.1:1/x?username=app&password=s3cret",
    ):
        locker = multilock.connect(url)
        try:
            assert "s3cret" not in repr(locker)
            assert "s3cret" not in locker.url
            assert "s3cret" not in repr(Config.from_url(LockURL.parse(url)))
            with pytest.raises(InvalidOption) as raised:
                multilock.connect(url + ("&" if "?" in url else "?") + "nope=1")
            assert "s3cret" not in str(raised.value)
        finally:
            locker.close()
    assert "s3cret" not in caplog.text


def test_both_schemes_resolve_to_the_backend() -> None:
    for scheme in ("zookeeper", "zk"):
        locker = multilock.connect(f"{scheme}://127.0.0.1:1/x")
        try:
            assert isinstance(locker, ZooKeeperLocker)
        finally:
            locker.close()
        assert isinstance(
            multilock.connect_async(f"{scheme}://127.0.0.1:1/x"), AsyncZooKeeperLocker
        )


def test_hooks_derive_from_the_url() -> None:
    hooks = backend.conformance
    url = LockURL.parse("zookeeper://127.0.0.1/x?session_timeout=2s")
    assert hooks.crash_release_bound(url, 0.0) == pytest.approx(3.5)
    unreachable = hooks.unreachable_url(url)
    assert unreachable is not None
    assert unreachable.startswith("zookeeper://127.0.0.1:")
    assert Config.from_url(LockURL.parse(unreachable)).connect_timeout == 1.0


def test_tls_is_off_by_default_and_verifies_the_certificate_and_name_when_on(
    test_ca: Path,
) -> None:
    assert config("zk://h/x").tls is None
    assert "use_ssl" not in config("zk://h/x").kazoo_options()
    tls = config(f"zk://h/x?use_ssl=true&ca={test_ca / 'ca.crt'}").tls
    assert tls is not None
    assert (tls.verify_certs, tls.check_hostname) == (True, True)
    assert tls.context.verify_mode == ssl.CERT_REQUIRED
    assert tls.context.check_hostname is True
    assert config("zk://h/x?use_ssl=true").tls is not None  # the system's CAs
    opted_out = config("zk://h/x?use_ssl=1&verify_certs=false").tls
    assert opted_out is not None
    assert opted_out.context.verify_mode == ssl.CERT_NONE
    assert opted_out.check_hostname is False


def test_a_client_certificate_is_loaded_when_the_url_is_parsed(test_ca: Path) -> None:
    url = (
        f"zk://h/x?use_ssl=true&ca={test_ca / 'ca.crt'}"
        f"&certfile={test_ca / 'client.crt'}&keyfile={test_ca / 'client.key'}"
    )
    assert config(url).tls is not None
    with pytest.raises(InvalidOption, match="cannot load"):
        config(url.replace("client.key", "server.key"))  # not the certificate's key


@pytest.mark.parametrize(
    ("query", "fragment"),
    [
        ("ca=/etc/ssl/ca.pem", "option 'ca' of .* needs use_ssl=true"),
        ("use_ssl=false&verify_certs=false", "needs use_ssl=true"),
        ("use_ssl=true&certfile=/c.pem", "'certfile' and 'keyfile' .* go together"),
        ("use_ssl=true&keyfile=/k.pem", "go together"),
        ("use_ssl=true&keyfile_password=x", "'keyfile_password' .* needs a keyfile"),
        ("use_ssl=true&verify_certs=false&check_hostname=true", "needs verify_certs=true"),
        ("use_ssl=true&ca=/nonexistent/ca.pem", "option 'ca' .* cannot load"),
        ("use_ssl=maybe", "expected true or false"),
    ],
)
def test_bad_tls_options_are_named(query: str, fragment: str) -> None:
    with pytest.raises(InvalidOption, match=fragment):
        config(f"zookeeper://h/x?{query}")


def test_the_key_password_stays_out_of_reprs_and_errors(test_ca: Path) -> None:
    # Given as a keyword option, so that only this backend's own texts are searched
    # (masking it in the URL's text is LockURL's rule).
    url = f"zk://h/x?use_ssl=true&certfile={test_ca / 'client.crt'}&keyfile={test_ca / '%s'}"
    with pytest.raises(InvalidOption) as raised:
        config(url % "server.key", keyfile_password="k3yPw")  # not the certificate's key
    assert "k3yPw" not in str(raised.value)
    parsed = config(url % "client.key", keyfile_password="k3yPw")
    assert "k3yPw" not in repr(parsed)
    assert "k3yPw" not in repr(parsed.tls)
