"""TLS to the ensemble: the URL's ``use_ssl`` options, checked, and the connections made.

Verification is on by default: the server's certificate must chain to ``ca`` (only
that CA when given; the system's CAs otherwise) and name the host we dialled.

The TLS connection is ours, not kazoo's: kazoo's checks the host name only when
asked, rebuilds its SSL context (reading the key and CA files) on every
connection attempt, and leaves the socket of a failed handshake for the garbage
collector. :class:`TLSHandler` makes each connection with one context built when
the URL is parsed, so that a bad file or key password is an error of the URL.
kazoo still decides when to connect and to which host; it names that host since
2.11, hence the floor of the requirement.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass, field
from typing import Any

from kazoo.handlers.threading import SequentialThreadingHandler

from multilock.backend import LockURL, as_bool, as_str
from multilock.errors import InvalidOption

__all__ = ["TLS", "TLS_CONVERTERS", "TLSHandler", "parse_tls", "tls_connect"]

TLS_CONVERTERS = {
    "use_ssl": as_bool,
    "ca": as_str,
    "certfile": as_str,
    "keyfile": as_str,
    "keyfile_password": as_str,
    "verify_certs": as_bool,
    "check_hostname": as_bool,
}
"""The URL options of TLS, for the backend's option parser."""
_NEED_TLS = ("ca", "certfile", "keyfile", "keyfile_password", "verify_certs", "check_hostname")


class TLSHandler(SequentialThreadingHandler):  # type: ignore[misc]  # kazoo is untyped
    """kazoo's threading handler, with connections wrapped in our TLS context."""

    def __init__(self, context: ssl.SSLContext) -> None:
        super().__init__()
        self.context = context

    def create_connection(
        self,
        address: tuple[str, int],
        hostname: str | None = None,
        timeout: float | None = None,
        **_kazoo_tls: object,  # kazoo's own TLS arguments: the context has them
    ) -> ssl.SSLSocket:
        """Connect to ``address`` and shake hands as ``hostname`` within ``timeout``."""
        return tls_connect(self.context, address, hostname, timeout)


def tls_connect(
    context: ssl.SSLContext, address: tuple[str, int], hostname: str | None, timeout: float | None
) -> ssl.SSLSocket:
    """A TCP connection to ``address``, TLS-wrapped by ``context`` as ``hostname``."""
    sock = socket.create_connection(address, timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # A handshake that fails closes the TLS socket (connected before wrapping).
        return context.wrap_socket(sock, server_hostname=hostname)
    except BaseException:
        sock.close()
        raise


@dataclass(frozen=True, repr=False)
class TLS:
    """How to speak TLS to the ensemble."""

    ca: str | None
    """PEM file of the CAs to trust; ``None``: the system's."""
    verify_certs: bool
    check_hostname: bool
    context: ssl.SSLContext = field(compare=False)

    def kazoo_options(self) -> dict[str, Any]:
        """Keyword arguments of :class:`kazoo.client.KazooClient` (a handler of its own)."""
        return {"use_ssl": True, "handler": TLSHandler(self.context)}

    def __repr__(self) -> str:
        return f"TLS(ca={self.ca!r}, verify_certs={self.verify_certs})"


def parse_tls(url: LockURL, values: dict[str, Any]) -> TLS | None:
    """The TLS settings of ``url`` (its options converted in ``values``), or ``None``
    without ``use_ssl=true``. A TLS option without it is an error, not ignored: the
    URL's author believes the connection is encrypted."""
    if not values.get("use_ssl", False):
        given = [name for name in _NEED_TLS if name in values]
        if given:
            names = ", ".join(repr(name) for name in given)
            raise InvalidOption(
                f"option {names} of {url.masked!r} needs use_ssl=true (TLS is off without it)"
            )
        return None
    certfile, keyfile = values.get("certfile"), values.get("keyfile")
    if (certfile is None) != (keyfile is None):
        raise InvalidOption(
            f"options 'certfile' and 'keyfile' of {url.masked!r} go together"
            " (the client certificate and its private key)"
        )
    if "keyfile_password" in values and keyfile is None:
        raise InvalidOption(f"option 'keyfile_password' of {url.masked!r} needs a keyfile")
    verify = bool(values.get("verify_certs", True))
    check_hostname = bool(values.get("check_hostname", verify))
    if check_hostname and not verify:
        raise InvalidOption(
            f"check_hostname=true needs verify_certs=true in {url.masked!r}"
            " (a name cannot be checked on a certificate that is not verified)"
        )
    ca = values.get("ca")
    try:
        context = ssl.create_default_context(cafile=ca)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidOption(f"option 'ca' of {url.masked!r}: cannot load {ca!r}: {exc}") from None
    context.check_hostname = check_hostname
    context.verify_mode = ssl.CERT_REQUIRED if verify else ssl.CERT_NONE
    if certfile is not None:
        try:
            context.load_cert_chain(certfile, keyfile, values.get("keyfile_password"))
        except (OSError, ssl.SSLError) as exc:
            raise InvalidOption(
                f"options 'certfile'/'keyfile' of {url.masked!r}: cannot load"
                f" {certfile!r} with {keyfile!r}: {exc}"
            ) from None
    return TLS(ca=ca, verify_certs=verify, check_hostname=check_hostname, context=context)
