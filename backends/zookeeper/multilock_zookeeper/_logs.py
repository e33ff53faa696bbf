"""kazoo's log, with our digest password taken out."""

from __future__ import annotations

import logging
from typing import Any

from ._config import Config

__all__ = ["kazoo_logger"]


class _RedactingLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """kazoo's logger, minus our password: at DEBUG, kazoo logs the Auth packet it sends."""

    def __init__(self, logger: logging.Logger, secret: str) -> None:
        super().__init__(logger, {})
        self.secret = secret

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if self.isEnabledFor(level):
            text = str(msg) % args if args else str(msg)
            self.logger.log(level, text.replace(self.secret, "***"), **kwargs)

    def warn(self, msg: object, *args: object, **kwargs: Any) -> None:
        """kazoo still calls the deprecated ``warn``."""
        self.warning(msg, *args, **kwargs)


def kazoo_logger(config: Config) -> logging.Logger | _RedactingLogger:
    """The logger kazoo should use for ``config``: its own, redacted when there is a password."""
    logger = logging.getLogger("kazoo.client")
    return _RedactingLogger(logger, config.password) if config.password else logger
