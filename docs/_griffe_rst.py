"""A griffe extension for the API reference: Sphinx roles in docstrings as inline code.

The docstrings are written for Python readers and Sphinx alike
(``:class:`~multilock.errors.BackendUnavailable```); Markdown would show the role
markup literally. ``~a.b.C`` becomes ``C``, as Sphinx shows it.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|data|attr|exc|obj|const):`(~?)([^`]+)`")


def _code(match: re.Match[str]) -> str:
    target = match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if match.group(1) else target}`"


class SphinxRolesAsCode(griffe.Extension):
    """Rewrite ``:role:`target``` in every docstring to inline code."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Called by griffe for each object it loads."""
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(_code, obj.docstring.value)
