"""``project://``: a local OpenEnv environment project, in a virtual environment of its own, served for the session.

- `transports.project._transport`: `ProjectTransport`, the client end (a WebSocket to the project's server).
- `transports.project._launcher`: the venv, the server process on a free port, and their ends.
"""

from transports.project._transport import ProjectTransport, project_path

__all__ = ["ProjectTransport", "project_path"]
