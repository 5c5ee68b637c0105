"""``recipes/sft_conquest.py`` on a larger tiny model: 4 layers, 256 wide, 8 heads (3.2M parameters against the
default's 0.5M), built from the same texts, trained and benchmarked the same way.

    python docs/results/conquest_bigger_tiny.py --output_dir outputs/sft_conquest_4x256

Run from the repository root; every other flag goes to the recipe. The result is the recipe's ``benchmark.json``.
"""

import runpy
import sys

import recruit_trl.workflow.model_setup as model_setup

SIZE = {"hidden_size": 256, "num_layers": 4, "num_heads": 8, "num_kv_heads": 2, "intermediate_size": 768}
model_folder = model_setup.model_folder


def larger_tiny(name_or_path="tiny", corpus_fn=None, cache_dir=None, **build_kwargs):
    """``model_folder`` with the larger size for ``tiny`` (the size is part of the model cache's key)."""
    if name_or_path.strip().lower() == "tiny":
        build_kwargs.update(SIZE)
    return model_folder(name_or_path, corpus_fn, cache_dir, **build_kwargs)


if __name__ == "__main__":
    model_setup.model_folder = larger_tiny  # the recipe's resolve_model looks model_folder up at call time
    sys.argv = ["recipes/sft_conquest.py", *sys.argv[1:]]
    runpy.run_path("recipes/sft_conquest.py", run_name="__main__")
