"""recruit_trl: a Hugging Face TRL plugin for reinforcement learning on long-horizon environments.

Training samples are taken from environment snapshots anywhere in an episode, actions are compared in
step-level groups from the same state, and model output goes through a strict action contract with a
safe fallback. The plugin reaches an environment only through a small protocol (reset, step,
snapshot/restore, a text rendering of the observation and the legal actions), so environments other
than the bundled clinical recruitment one (:mod:`env`) can be added without touching it.
"""

__version__ = "0.1.0"
