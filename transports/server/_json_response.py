"""The JSON response of the app's Starlette routes: its body encoded by msgspec."""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.responses import Response

__all__ = ["JSONResponse"]


class JSONResponse(Response):
    """A Starlette response whose content is encoded as JSON by msgspec (faster than Starlette's ``json.dumps``).

    It takes what `starlette.responses.Response` takes; its media type is ``application/json``.
    """

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        """Encode the content (anything msgspec encodes).

        Args:
            content: The value to send.

        Returns:
            The body.
        """
        return msgspec.json.encode(content)
