"""Tools documented every way FastMCP reads, shared by openenv's tools and FastMCP's in ``tests/core/test_tools.py``.

Stdlib only: the reference venv imports it too (``reference_tools.py``).
"""

from __future__ import annotations


class DocumentedTools:
    """Methods whose docstrings both tool layers must read alike."""

    def move(self, direction: str, steps: int = 1, *, fast: bool = False) -> str:
        """Move the agent on the grid.

        The agent walks one cell per step; walls stop it.
        More prose here.

        Args:
            direction: Where to go: "north", "south",
                "east" or "west".
            steps: How many cells.
            fast (bool): Run instead of walking.

        Returns:
            Where it ended.

        Raises:
            ValueError: An unknown direction.
        """
        return direction

    def one_line(self, x: int) -> int:
        """Just one line."""
        return x

    def undocumented(self, x: int, y: list[str] | None = None) -> int:
        return x

    def sections_only(self, text: str) -> str:
        """Args:
        text: The text.
        """
        return text

    def partly(self, a: int, b: int = 0) -> int:
        """Add a to b.

        Arguments:
            a: The first.

        Example:
            partly(1, 2)
        """
        return a + b

    def sphinx(self, a: int, b: str = "") -> int:
        """Sphinx style.

        :param a: the a,
            on two lines.
        :param str b: the b.
        :returns: a.
        """
        return a

    def numpy(self, a: int, b: float = 0.5) -> int:
        """Numpy style.

        More prose.

        Parameters
        ----------
        a : int
            The a value.
        b : float, optional
            The b value,
            on two lines.

        Returns
        -------
        int
            The a.
        """
        return a


NAMES = ["move", "one_line", "undocumented", "sections_only", "partly", "sphinx", "numpy"]
