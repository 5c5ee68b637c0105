"""The mean of episode mode's advantages over the decisions of a group, with and without a win in it.

Plays 2 groups of 8 duel games (reset seeds 10-15, three calls) with the model at PATH sampled at temperature 0.5,
as episode mode does with conquest's episode rewards (``win_reward`` and ``potential_reward``, weights 1 and 1: the
win and the change of the potential), and prints per group the wins, the mean and the mean absolute advantage per
decision for the (episode, step) weights (1, 1), (1, 0) and (0, 1).

usage: python docs/results/conquest_advantage_mean.py PATH
"""

import statistics
import sys

from transformers import GenerationConfig

from recruit_trl.models.loading import load_for_inference
from recruit_trl.rollout.advantages import AdvantageWeights, decision_advantages
from recruit_trl.rollout.anchors import Anchor
from recruit_trl.rollout.config import RolloutConfig
from recruit_trl.rollout.rollout_funcs import EpisodeRollout
from rewards import get_reward_funcs

model, tokenizer = load_for_inference(sys.argv[1], {})
rewards = {"reward_funcs": ["win_reward", "potential_reward"], "reward_weights": [1.0, 1.0]}
rollout = EpisodeRollout(
    RolloutConfig(env_name="conquest", mode="episode", continuation_policy="teacher"),
    reward_funcs=get_reward_funcs(rewards["reward_funcs"]),
    reward_weights=rewards["reward_weights"],
)
sampling = GenerationConfig(do_sample=True, temperature=0.5, top_p=1.0)
for seeds in ([10, 11], [12, 13], [14, 15]):
    episodes = rollout.play(None, model, tokenizer, sampling, [Anchor("duel", s, 0, "teacher") for s in seeds], 8, 0)
    for g, seed in enumerate(seeds):
        group = episodes[g * 8 : (g + 1) * 8]
        for weights in (AdvantageWeights(1, 1, 15), AdvantageWeights(1, 0, 15), AdvantageWeights(0, 1, 15)):
            advantages, _ = decision_advantages(
                [e["outcome"] for e in group], [e["step_rewards"] for e in group], [e["keys"] for e in group], weights
            )
            flat = [a for episode in advantages for a in episode]
            wins = sum(e["rates"]["win"] for e in group)
            print(
                f"seed {seed} weights {(weights.episode, weights.step)} wins {wins:.0f} "
                f"decisions {len(flat)} mean {statistics.mean(flat):.4f} abs {statistics.mean(map(abs, flat)):.4f}"
            )
