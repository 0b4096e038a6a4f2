"""What a tool's docstring tells an agent: its description, and a description per argument.

FastMCP (the tool layer of OpenEnv's environments) describes a tool by the
prose of its docstring before the first section, and each argument by its
entry under ``Args:``, continuation lines joined with newlines; an LLM agent
reads those. `parse_docstring` reads the same from the three styles FastMCP
reads: Google (this project's own), Sphinx (``:param name: ...``) and NumPy
(``Parameters`` underlined).

```text
Move the agent on the grid.           the description: the prose
                                      before the first section
The agent walks one cell per step.

Args:
    direction: Where to go.           "direction": "Where to go."
    steps (int): How many cells,      "steps": two lines, joined
        at most 9.

Returns:
    Where it ended.
```
"""

from __future__ import annotations

import re

__all__ = ["parse_docstring"]

_GOOGLE_SECTIONS = (
    "args|arguments|params|parameters|keyword args|keyword arguments|other parameters|other params|"
    "returns|return|yields|yield|raises|exceptions|except|examples|example|notes|note|warnings|warning|"
    "warns|attributes|see also|todo|references|methods|receives"
)
_GOOGLE_HEADER = re.compile(rf"^({_GOOGLE_SECTIONS})\s*:\s*$", re.IGNORECASE)
_GOOGLE_ARGS = frozenset({"args", "arguments", "params", "parameters", "keyword args", "keyword arguments"})
_GOOGLE_ENTRY = re.compile(r"^\**(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*(?:\([^)]*\))?\s*:\s*(?P<text>.*)$")
_SPHINX_FIELD = re.compile(r"^:(?P<kind>[a-z]+)(?:\s+(?P<rest>[^:]*))?:\s*(?P<text>.*)$")
_NUMPY_RULE = re.compile(r"^-{3,}\s*$")
_NUMPY_ENTRY = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*(?::.*)?$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _joined(lines: list[str]) -> str:
    """Lines of text, each stripped of its indentation, joined with newlines (as FastMCP joins them)."""
    return "\n".join(line.strip() for line in lines).strip()


def _prose(lines: list[str]) -> str:
    return "\n".join(lines).strip()


def _indented_next(lines: list[str], index: int) -> bool:
    """Whether the first non-blank line after ``lines[index]`` is indented: a section has a body."""
    for line in lines[index + 1 :]:
        if line.strip():
            return _indent(line) > 0
    return False


def _google(lines: list[str]) -> tuple[str, dict[str, str]] | None:
    headers = [
        index
        for index, line in enumerate(lines)
        if _GOOGLE_HEADER.match(line) and _indent(line) == 0 and _indented_next(lines, index)
    ]
    if not headers:
        return None
    arguments: dict[str, str] = {}
    for position, start in enumerate(headers):
        if _GOOGLE_HEADER.match(lines[start]).group(1).lower() not in _GOOGLE_ARGS:  # type: ignore[union-attr]
            continue
        end = headers[position + 1] if position + 1 < len(headers) else len(lines)
        body = lines[start + 1 : end]
        entry_indent = min((_indent(line) for line in body if line.strip()), default=0)
        name: str | None = None
        text: list[str] = []
        for line in body:
            match = _GOOGLE_ENTRY.match(line.strip()) if line.strip() and _indent(line) == entry_indent else None
            if match is not None:
                if name is not None:
                    arguments[name] = _joined(text)
                name, text = match.group("name"), [match.group("text")]
            elif name is not None:
                text.append(line)
        if name is not None:
            arguments[name] = _joined(text)
    return _prose(lines[: headers[0]]), arguments


def _sphinx(lines: list[str]) -> tuple[str, dict[str, str]] | None:
    fields = [index for index, line in enumerate(lines) if _SPHINX_FIELD.match(line.strip())]
    if not fields:
        return None
    arguments: dict[str, str] = {}
    for position, start in enumerate(fields):
        match = _SPHINX_FIELD.match(lines[start].strip())
        assert match is not None
        end = fields[position + 1] if position + 1 < len(fields) else len(lines)
        if match.group("kind") in ("param", "parameter", "arg", "argument", "key", "keyword") and match.group("rest"):
            name = match.group("rest").split()[-1]
            arguments[name] = _joined([match.group("text"), *lines[start + 1 : end]])
    return _prose(lines[: fields[0]]), arguments


def _numpy(lines: list[str]) -> tuple[str, dict[str, str]] | None:
    sections = [index - 1 for index, line in enumerate(lines) if index and _NUMPY_RULE.match(line.strip())]
    if not sections:
        return None
    arguments: dict[str, str] = {}
    for position, start in enumerate(sections):
        if lines[start].strip().lower() not in ("parameters", "other parameters"):
            continue
        end = sections[position + 1] if position + 1 < len(sections) else len(lines)
        name: str | None = None
        text: list[str] = []
        for line in lines[start + 2 : end]:
            match = _NUMPY_ENTRY.match(line) if line.strip() and _indent(line) == 0 else None
            if match is not None:
                if name is not None:
                    arguments[name] = _joined(text)
                name, text = match.group("name"), []
            elif name is not None:
                text.append(line)
        if name is not None:
            arguments[name] = _joined(text)
    return _prose(lines[: sections[0]]), arguments


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Read a tool's description and its arguments' descriptions from its docstring.

    Args:
        doc: The docstring, cleaned (``inspect.getdoc``).

    Returns:
        The prose before the first section (the whole docstring when it has
        no sections), and each documented argument's description, by name.
    """
    lines = doc.expandtabs().splitlines()
    for style in (_google, _numpy, _sphinx):
        parsed = style(lines)
        if parsed is not None:
            return parsed
    return doc.strip(), {}
