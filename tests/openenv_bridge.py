"""OpenEnv's own client (``openenv-core``'s ``GenericEnvClient``) driven over pipes, for tests/test_openenv_client.py.

Run by an interpreter that has ``openenv-core`` (it may be another virtual environment than the tests'): ``python
tests/openenv_bridge.py URL``. Each line on stdin is a JSON request, ``{"op": "reset", "kwargs": {...}}``,
``{"op": "step", "action": {...}}``, ``{"op": "state"}`` or ``{"op": "close"}``; each answer is one JSON line on
stdout: ``{"observation": ..., "reward": ..., "done": ...}`` (a reset or a step), the state, or
``{"error": "..."}``. Only the standard library and openenv are imported here.
"""

from __future__ import annotations

import json
import sys


def main(url: str) -> int:
    from openenv.core.generic_client import GenericEnvClient

    with GenericEnvClient(base_url=url).sync() as client:
        for line in sys.stdin:
            request = json.loads(line)
            op = request["op"]
            try:
                if op == "reset":
                    result = client.reset(**request.get("kwargs", {}))
                elif op == "step":
                    result = client.step(request["action"])
                elif op == "state":
                    answer = client.state()
                elif op == "close":
                    break
                else:
                    raise ValueError(f"unknown op {op!r}")
                if op in ("reset", "step"):
                    answer = {"observation": result.observation, "reward": result.reward, "done": result.done}
            except Exception as exc:  # noqa: BLE001 - reported to the test, which decides
                answer = {"error": f"{type(exc).__name__}: {exc}"}
            print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
