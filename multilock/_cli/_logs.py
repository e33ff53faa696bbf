"""Log output of ``multilock run``: text or JSON lines, secrets masked in both alike."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from .._masking import mask_text

__all__ = ["JsonFormatter", "TextFormatter", "configure_logging"]

# Attributes every LogRecord has; anything else on a record is a structured field.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields a caller attached to ``record`` (``extra=...``)."""
    return {
        key: value
        for key, value in vars(record).items()
        if key not in _STANDARD and not key.startswith("_")
    }


def _masked(value: Any) -> Any:
    """A JSON-ready ``value``: text masked, anything not JSON-native as masked text."""
    if isinstance(value, str):
        return mask_text(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    return mask_text(str(value))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the structured fields and
    any traceback; every text in it masked as the text format is."""

    def format(self, record: logging.LogRecord) -> str:
        """Render ``record`` as JSON."""
        data: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        data.update(_fields(record))
        if record.exc_info:
            data["traceback"] = self.formatException(record.exc_info)
        if record.stack_info:
            data["stack"] = self.formatStack(record.stack_info)
        return json.dumps({key: _masked(value) for key, value in data.items()})


class TextFormatter(logging.Formatter):
    """Readable lines, with the structured fields appended as ``key=value``; masked."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        """The classic line (and traceback) plus the record's extra fields."""
        line = super().format(record)
        extra = [f"{k}={v}" for k, v in _fields(record).items()]
        return mask_text(f"{line} [{' '.join(extra)}]" if extra else line)


def configure_logging(fmt: str, level: str) -> None:
    """Send every log record to stderr in ``fmt`` (``text`` or ``json``) from ``level`` up."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
