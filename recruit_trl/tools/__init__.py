"""Developer tools, apart from the core and the workflow: the learning check (credit against its control across
training seeds), the RL-step benchmark (``python -m recruit_trl.tools.bench_rollout``) and the profiler."""
