"""The planner-learnability tool (recruit_trl.tools.planner_learnability) end to end on the smallest model: labels
on the start's own states, cached; a fine-tuned copy per margin; agreements with the planner on held-out states."""

from __future__ import annotations

import json

from recruit_trl.tools.planner_learnability import LearnabilityArguments, main


def test_the_tool_labels_trains_and_compares_with_the_start(tiny_model, tmp_path, capsys):
    args = LearnabilityArguments(
        start=tiny_model, task=["hard_bench_stage_30"], train_seeds="0-1", heldout_seeds="2", days="5-25:5",
        candidates=3, continuations=2, margins=[0.0, 50.0], epochs=1.0, output_dir=str(tmp_path),
    )  # fmt: skip
    report = main(args)
    counts = report["counts"]
    assert counts["train"]["states"] == 10 and counts["heldout"]["states"] == 5
    assert counts["train"]["clear_0.0se"] == counts["train"]["best_not_greedy"]  # a margin above 0: best != greedy
    assert counts["train"]["clear_50.0se"] <= counts["train"]["clear_0.0se"]
    start = report["start"]
    assert start["all"]["states"] == 5 and 0 <= start["all"]["agree"] <= 1
    # Where the best is not the greedy answer the start disagrees by definition.
    assert start["clear_0.0se"]["agree"] in (0.0, None)
    trained = report["trained"]["0.0"]
    if counts["train"]["clear_0.0se"]:
        assert trained["rows"] == counts["train"]["clear_0.0se"] and (tmp_path / "trained-0.0se").is_dir()
        assert 0 <= trained["all"]["agree"] <= 1
    assert json.loads((tmp_path / "learnability.json").read_text())["counts"] == counts
    assert "the start picks the planner's choice on" in capsys.readouterr().out
    labels = (tmp_path / "labels-train.json").stat().st_mtime
    main(args)  # the labels are reused
    assert (tmp_path / "labels-train.json").stat().st_mtime == labels
