"""conquest: a deterministic territory-conquest board game environment (``docs/spec/conquest/rules.md``).

from env.conquest import ConquestEnv
env = ConquestEnv(task="classic3")
obs, info = env.reset(seed=0)
obs, reward, terminated, truncated, info = env.step_index(0)
print(env.render_text()); print("\\n".join(env.render_candidates()))
"""

from env.conquest.core import ConquestEnv, ConquestSnapshot
from env.conquest.parse import REASONS, parse_reply
from env.conquest.policies import (
    POLICIES,
    ConquestPolicy,
    get_policy,
    play_episode,
    register_policy,
    teacher_index,
    teacher_lookahead_index,
)
from env.conquest.tasks import TASKS, Options, TaskSpec

__all__ = [
    "POLICIES",
    "REASONS",
    "TASKS",
    "ConquestEnv",
    "ConquestPolicy",
    "ConquestSnapshot",
    "Options",
    "TaskSpec",
    "get_policy",
    "parse_reply",
    "play_episode",
    "register_policy",
    "teacher_index",
    "teacher_lookahead_index",
]
