"""Run openenv 0.10.0's RFC 008 runtime graders against a running server (with its venv's python).

    python reference_graders.py URL ACTIONS_JSON [--low L --high H]

Collects one raw WebSocket episode as ``openenv validate`` does
(``collect_runtime_evidence``: ``/schema``, then reset, state, and each action
followed by state, on one connection), then grades it with the three runtime
graders (well-formed rewards within [L, H], observations against ``/schema``'s
``observation`` and ``reset_observation``, the state contract). Prints a JSON
list: ``{"check_id", "status", "evidence"}`` per grader.
"""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

from reference_import import import_reference_openenv

import_reference_openenv()

from openenv.validation.graders.runtime.basic import (  # noqa: E402 - after the reference's openenv
    ObservationSchemaGrader,
    RewardWellFormedGrader,
    StateContractGrader,
)
from openenv.validation.runtime.collector import collect_runtime_evidence  # noqa: E402
from openenv.validation.runtime.contracts import RuntimePlan, RuntimeReset  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("actions", help="a JSON list of the actions to step")
    parser.add_argument("--low", type=float, default=-1e9)
    parser.add_argument("--high", type=float, default=1e9)
    args = parser.parse_args()
    plan = RuntimePlan(
        plan_schema_version="1",
        reset=RuntimeReset(episode_id="graded-episode", seed=7),
        actions=json.loads(args.actions),
    )
    evidence = collect_runtime_evidence(args.url, plan, episode_timeout_s=60.0)
    subject = SimpleNamespace(
        runtime_evidence=evidence, manifest=SimpleNamespace(reward=SimpleNamespace(range=(args.low, args.high)))
    )
    results = [
        grader().run(subject) for grader in (RewardWellFormedGrader, ObservationSchemaGrader, StateContractGrader)
    ]
    print(
        json.dumps(
            [
                {"check_id": result.check_id, "status": result.status.value, "evidence": list(result.evidence)}
                for result in results
            ]
            + [{"check_id": "collection", "status": evidence.failure_reason or "complete", "evidence": []}]
        )
    )


if __name__ == "__main__":
    main()
