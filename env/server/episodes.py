"""Episode operations shared by both transports: reset, step and state on a session, for any served environment.

The session, not the env, records whether an episode is running and has ended, so that any Gymnasium-style env can
be served (see :class:`~env.server.served.ServedEnv`).
"""

from __future__ import annotations

import time
from typing import Any

from env.server.protocol import ApiError, check_action
from env.server.served import ServedEnv
from env.server.sessions import REPLAY_WINDOW, Session

NO_EPISODE = "No active episode. Call reset first."


def do_reset(
    served: ServedEnv, session: Session, task_id: str, seed: int | None, episode_id: str | None
) -> tuple[dict, dict]:
    """Reset ``session``'s env (task already validated; a new env when the task changes); returns (observation,
    metadata)."""
    env = session.env
    if env is None or session.task != task_id:
        env = session.env = served.make_env(task_id)
        session.task = task_id
    obs, info = env.reset(seed=seed, options={"task": task_id})
    session.new_episode(episode_id)
    return obs, {"info": info, "seed": seed, "episode_id": session.episode_id}


def do_step(served: ServedEnv, session: Session, payload: Any, rate_limit: float) -> tuple[dict, float, bool, dict]:
    """Validate and apply one action; returns (observation, reward, done, metadata)."""
    env = session.env
    if env is None or session.episode_id is None:
        raise ApiError(400, NO_EPISODE)
    if session.done:
        raise ApiError(400, "Episode is done. Call reset() first.")
    action = check_action(served, payload)
    if rate_limit:
        now = time.monotonic()
        stamps = session.stamps
        while stamps and now - stamps[0] >= 1.0:
            stamps.popleft()
        if len(stamps) >= rate_limit:
            raise ApiError(
                429,
                f"Rate limit exceeded: more than {rate_limit:g} steps/second for this session.",
                "RATE_LIMITED",
                {"Retry-After": "1"},
            )
        stamps.append(now)
    obs, reward, terminated, truncated, info = env.step(action)
    done = terminated or truncated
    session.steps += 1
    session.done = done
    metadata: dict[str, Any] = {"info": info}
    for key in served.metadata_keys:
        if key in info:
            metadata[key] = info[key]
    if served.split_done is None:  # clients cannot derive the two flags from the reply: report them
        metadata["terminated"] = terminated
        metadata["truncated"] = truncated
    recent = session.recent
    recent.append(tuple(action.values()))
    if len(recent) == REPLAY_WINDOW and recent.count(recent[0]) == REPLAY_WINDOW:
        metadata["replay_warning"] = (
            f"Replay warning: the last {REPLAY_WINDOW} actions were identical (all fields). This is a warning "
            "only; the reward is unchanged."
        )
    return obs, reward, done, metadata


def state_payload(served: ServedEnv, session: Session) -> dict[str, Any]:
    """The session's episode state: ``served.state(env)`` + ``episode_id`` + ``step_count``."""
    env = session.env
    if env is None or session.episode_id is None:
        raise ApiError(400, NO_EPISODE)
    state = served.state(env)
    state["episode_id"] = session.episode_id
    state["step_count"] = session.steps
    return state
