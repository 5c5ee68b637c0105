"""Training stages: the recipes' arguments and defaults, the model each stage starts from, the SFT warm start, the
trainers (REINFORCE, episode mode) and the end-of-run report."""
