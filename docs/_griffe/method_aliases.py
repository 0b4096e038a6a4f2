"""A griffe extension: a method alias assigned in a class body is documented as the method it is.

``reset_async = reset`` makes ``reset_async`` the very same function (a zero-cost
alias), but griffe reads an assignment as an attribute: the API reference then
listed it without a signature. This extension turns such an attribute into a
function with the target's signature and the attribute's own docstring.
"""

from __future__ import annotations

from typing import Any

import griffe


class MethodAliases(griffe.Extension):
    """Document ``alias = method`` class attributes as methods."""

    def on_class_members(self, *, cls: griffe.Class, **kwargs: Any) -> None:
        """Replace each attribute whose value names a method of the same class."""
        for name, member in list(cls.members.items()):
            if member.is_alias or not member.is_attribute:
                continue
            target = cls.members.get(str(member.value)) if member.value is not None else None
            if target is None or target.is_alias or not target.is_function:
                continue
            function = griffe.Function(
                name,
                lineno=member.lineno,
                endlineno=member.endlineno,
                parameters=target.parameters,
                returns=target.returns,
                decorators=target.decorators,
                docstring=member.docstring,
            )
            function.labels = set(target.labels)
            cls.set_member(name, function)
