"""Old names of options, kept working for a while with a `DeprecationWarning`."""

from __future__ import annotations

import warnings
from typing import TypeVar

__all__ = ["renamed_option"]

_T = TypeVar("_T")


def renamed_option(function: str, old: str, new: str, value: _T) -> _T:
    """Warn that ``function(old=)`` is now ``function(new=)``; give back the value, for the new name.

    Args:
        function: Whose option it is (``"create_app"``).
        old: Its old name.
        new: Its name now.
        value: What the caller gave for it.

    Returns:
        ``value``.
    """
    warnings.warn(f"{function}({old}=) is deprecated: it is {function}({new}=) now", DeprecationWarning, stacklevel=3)
    return value
