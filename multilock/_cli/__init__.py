"""The ``multilock`` command line (click + rich): run, once, demo, conformance, locks,
jobs, key, next.

Exit codes, for every command: 0 success; 1 the operation ran and failed
(conformance failures, a backend that cannot be reached); 2 bad input (URL,
option, cron expression, timezone...), reported as one line without traceback.
"""

from __future__ import annotations

from ._app import main

__all__ = ["main"]
