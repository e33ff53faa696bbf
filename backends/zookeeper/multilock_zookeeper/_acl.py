"""Whether a chroot's ACL keeps the promise of digest auth: only we may create or delete."""

from __future__ import annotations

from typing import Any

from kazoo.security import Permissions, make_digest_acl_credential

from multilock.errors import ConfigurationError

from ._config import Config

__all__ = ["acl_problem", "acl_unreadable"]

_FOREIGN_PERMS = Permissions.CREATE | Permissions.DELETE | Permissions.WRITE | Permissions.ADMIN


def acl_problem(config: Config, acls: list[Any]) -> ConfigurationError | None:
    """The error to raise if ``acls`` (the chroot's) let anyone but our digest user create
    or delete lock nodes; ``None`` when they do not."""
    ours = make_digest_acl_credential(config.username, config.password)
    foreign = [
        acl for acl in acls if acl.perms & _FOREIGN_PERMS and not _is_id(acl, "digest", ours)
    ]
    if not foreign:
        return None
    same_user = any(_acl_text(acl) == f"digest:{config.username}" for acl in foreign)
    hint = " (the same user with another password?)" if same_user else ""
    return ConfigurationError(
        f"the chroot {config.root!r} of {config.url.masked} lets others"
        f" create or delete lock nodes ({', '.join(_acl_text(a) for a in foreign)})"
        f"{hint}: with digest auth it must grant those only to our user; set its"
        " ACL or use another chroot"
    )


def acl_unreadable(config: Config) -> ConfigurationError:
    """The error to raise when the chroot's ACL may not be read with our credentials: the
    chroot is another identity's (lock nodes and chroots are private to their creator)."""
    return ConfigurationError(
        f"the chroot {config.root!r} of {config.url.masked} belongs to another identity:"
        f" digest user {config.username!r} may not read it (a wrong password?); use its"
        " credentials or another chroot"
    )


def _is_id(acl: Any, scheme: str, ident: str) -> bool:
    return bool(acl.id.scheme == scheme and acl.id.id == ident)


def _acl_text(acl: Any) -> str:
    return f"{acl.id.scheme}:{acl.id.id.split(':')[0]}"
