"""Episode operations shared by both transports: reset, step and state on a session."""

from __future__ import annotations

import time
from typing import Any

from env.clinical.core import ClinicalRecruitmentEnv
from env.server.protocol import ApiError, check_action
from env.server.sessions import REPLAY_WINDOW, Session


def do_reset(session: Session, task_id: str, seed: int | None, episode_id: str | None) -> tuple[dict, dict]:
    """Reset ``session``'s env (task already validated); returns (observation, metadata)."""
    env = session.env
    if env is None:
        env = session.env = ClinicalRecruitmentEnv(task_id)
    obs, info = env.reset(seed=seed, options={"task": task_id})
    session.new_episode(episode_id)
    return obs, {"info": info, "seed": seed, "episode_id": session.episode_id}


def do_step(session: Session, payload: Any, rate_limit: float) -> tuple[dict, float, bool, dict]:
    """Validate and apply one action; returns (observation, reward, done, metadata)."""
    env = session.env
    if env is None or env.s is None:
        raise ApiError(400, "No active episode. Call reset first.")
    if env.done:
        raise ApiError(400, "Episode is done. Call reset() first.")
    action = check_action(payload)
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
    metadata: dict[str, Any] = {"info": info, "reward_breakdown": info["reward_breakdown"]}
    recent = session.recent
    recent.append(tuple(action.values()))
    if len(recent) == REPLAY_WINDOW and recent.count(recent[0]) == REPLAY_WINDOW:
        metadata["replay_warning"] = (
            f"Replay warning: the last {REPLAY_WINDOW} actions were identical (all fields). This is a warning "
            "only; the reward is unchanged."
        )
    return obs, reward, terminated or truncated, metadata


def state_payload(session: Session) -> dict[str, Any]:
    """The session's episode state: ``state()`` + ``episode_id`` + ``step_count``."""
    env = session.env
    if env is None or env.s is None:
        raise ApiError(400, "No active episode. Call reset first.")
    state = env.state()
    state["episode_id"] = session.episode_id
    state["step_count"] = state["step"]
    return state
