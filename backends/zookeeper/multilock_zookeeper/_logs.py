"""kazoo's log, with our digest password taken out, and its last word on connecting."""

from __future__ import annotations

import logging
from typing import Any

from ._config import Config

__all__ = ["KazooLog"]


class KazooLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """kazoo's logger, minus our password (at DEBUG, kazoo logs the Auth packet it sends).

    It also keeps kazoo's last warning: kazoo retries a failed connection forever and
    only says why in its log (a refused connection, a certificate that failed
    verification), so an error about not connecting in time repeats it.
    """

    def __init__(self, config: Config) -> None:
        super().__init__(logging.getLogger("kazoo.client"), {})
        self.secret = config.password
        self.last_warning: str | None = None

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if level < logging.WARNING and not self.isEnabledFor(level):
            return
        text = str(msg) % args if args else str(msg)
        if self.secret:
            text = text.replace(self.secret, "***")
        if level >= logging.WARNING:
            self.last_warning = text
        if self.isEnabledFor(level):
            self.logger.log(level, text, **kwargs)

    def warn(self, msg: object, *args: object, **kwargs: Any) -> None:
        """kazoo still calls the deprecated ``warn``."""
        self.warning(msg, *args, **kwargs)
