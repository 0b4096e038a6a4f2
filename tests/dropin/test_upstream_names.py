"""The rest of upstream's names that environment packages import: provider interfaces, metadata, transforms."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from grid_env.server.environment import GridEnvironment

from openenv.core.containers.runtime import ContainerProvider, RuntimeProvider
from openenv.core.env_server import CompositeTransform, NullTransform, Observation, Transform
from openenv.core.env_server.web_interface import load_environment_metadata


def test_the_provider_interfaces_are_abstract_and_close_with_their_block() -> None:
    with pytest.raises(TypeError, match="abstract"):
        ContainerProvider()  # type: ignore[abstract]
    events: list[str] = []

    class Runtime(RuntimeProvider):
        def start(self, port: int | None = None, env_vars: dict[str, str] | None = None, **kwargs: Any) -> str:
            events.append("start")
            return "http://127.0.0.1:1"

        def stop(self) -> None:
            events.append("stop")

        def wait_for_ready(self, timeout_s: float = 30.0) -> None:
            events.append("ready")

    with Runtime():
        pass
    assert events == ["start", "stop"]


def test_metadata_from_a_factory_and_its_readme(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# Grid\n")
    monkeypatch.setenv("ENV_README_PATH", str(readme))
    metadata = load_environment_metadata(GridEnvironment, "grid_env")
    assert (metadata.name, metadata.description, metadata.version) == (
        "grid_env",
        "GridEnvironment environment",
        "1.0.0",
    )
    assert metadata.readme_content == "# Grid\n"
    monkeypatch.delenv("ENV_README_PATH")
    monkeypatch.chdir(tmp_path)
    assert load_environment_metadata(GridEnvironment).readme_content is None
    assert load_environment_metadata(GridEnvironment()).name == "GridEnvironment"


def test_transforms_compose() -> None:
    class Reward(Transform[Observation]):
        def __call__(self, observation: Observation) -> Observation:
            return observation.model_copy(update={"reward": 1.0})

    composed = CompositeTransform([NullTransform(), Reward()])
    assert composed(Observation()).reward == 1.0
