"""The environment packages of these tests (``projects/``) import as installed packages do."""

import sys
from pathlib import Path

PROJECTS = Path(__file__).parent / "projects"
"""Environment packages written against upstream OpenEnv's API, for these tests."""

if str(PROJECTS) not in sys.path:
    sys.path.insert(0, str(PROJECTS))
