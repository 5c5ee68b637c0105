"""Evaluation harness: policies and model policies over full episodes, JSON schema, table and plot."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import env.clinical.agent
from recruit_trl.cli import main as cli
from recruit_trl.workflow.evaluation.evaluate import EvalConfig, evaluate
from recruit_trl.workflow.evaluation.report import format_results, plot_results

TASK = "hard_bench_stage_30"
RESULT_KEYS = {
    "policy", "task", "episodes", "final_score_mean", "final_score_sd", "enrolled_mean", "budget_left_mean",
    "episode_length_mean", "strict_json_rate", "valid_action_rate", "fallback_rate", "teacher_match", "action_types",
    "score_terms_mean", "enrolled_at_mean", "enrolled_peak_mean", "enrolled_by_day_mean", "own_answer_valid_rate",
    "per_episode",
}  # fmt: skip


def test_env_policies_and_teacher_match():
    report = evaluate(
        ["heuristic", "safe"],
        EvalConfig(env="clinical", tasks=(TASK,), seeds=(0, 1), teacher="heuristic"),
        progress=False,
    )
    rows = report["results"]
    assert [r["policy"] for r in rows] == ["heuristic", "safe"]
    assert set(rows[0]) == RESULT_KEYS
    assert rows[0]["teacher_match"] == 1.0 and rows[0]["episodes"] == 2
    assert rows[0]["strict_json_rate"] is None and rows[0]["fallback_rate"] is None
    assert rows[0]["episode_length_mean"] == 30
    assert abs(sum(rows[1]["action_types"].values()) - 1) < 1e-3
    # The grade's weighted parts (hard's grader for a hard stage task) add up to the final score.
    for row in rows:
        assert "curriculum_screening" in row["score_terms_mean"]
        assert abs(sum(row["score_terms_mean"].values()) - row["final_score_mean"]) < 1e-3
    assert "heuristic" in format_results(rows)
    # Validity to a tenth of a percent: rounded to whole percents, 98.5 % read as the 99 % target met.
    row = dict(rows[0], valid_action_rate=0.985)
    assert " 98.5%" in format_results([row]).splitlines()[2]
    assert report["versions"]["python"]


def test_enrolment_over_the_days_follows_each_episode():
    from env.clinical import ClinicalRecruitmentEnv
    from recruit_trl.workflow.evaluation.evaluate import Evaluator
    from recruit_trl.workflow.evaluation.metrics import aggregate

    config = EvalConfig(env="clinical", tasks=("easy_bench",), seeds=(0, 1))
    logs = Evaluator(config).run_policy("safe")
    for log in logs:  # the same episode replayed by hand: enrolled_so_far and budget_remaining after every decision
        game, policy = ClinicalRecruitmentEnv("easy_bench"), env.clinical.agent.CLINICAL.get_policy("safe")
        obs, _ = game.reset(seed=log.seed)
        by_day, budget = [], []
        for _ in range(180):
            obs, *_ = game.step(policy(obs, None))
            by_day.append(obs["enrolled_so_far"])
            budget.append(obs["budget_remaining"])
        assert log.metrics == {"enrolled": by_day, "budget_left": budget}
    (row,) = aggregate("safe", logs, is_model=False, curve_metrics=("enrolled",), metric_days=(15, 30))
    assert row["budget_left_mean"] == round(sum(log.metrics["budget_left"][-1] for log in logs) / 2, 2)
    mean = [(a + b) / 2 for a, b in zip(logs[0].metrics["enrolled"], logs[1].metrics["enrolled"], strict=True)]
    assert row["enrolled_mean"] == pytest.approx(mean[-1], abs=0.006)
    assert row["enrolled_by_day_mean"] == pytest.approx(mean, abs=0.006)
    assert row["enrolled_at_mean"]["30"] == pytest.approx(mean[29], abs=0.006)
    assert row["enrolled_at_mean"]["15"] == pytest.approx(mean[14], abs=0.006)
    assert row["enrolled_peak_mean"] >= row["enrolled_mean"]
    assert row["enrolled_peak_mean"] > row["enrolled_at_mean"]["30"]
    # Without curve metrics a row keeps each metric's value at the end only.
    (plain,) = aggregate("safe", logs, is_model=False)
    assert {k for k in plain if k.startswith(("enrolled", "budget"))} == {"enrolled_mean", "budget_left_mean"}
    for log in logs:  # a metric whose field is taken
        log.metrics["final_score"] = [0.5]
    with pytest.raises(ValueError, match="final_score"):
        aggregate("safe", logs, is_model=False)


def test_model_policy_runs_in_lock_step(tiny_model, tmp_path):
    report = evaluate(
        [f"model:{tiny_model}"], EvalConfig(env="clinical", tasks=(TASK,), seeds=(0, 1, 2)), progress=False
    )
    (row,) = report["results"]
    assert row["episodes"] == 3 and row["episode_length_mean"] == 30
    assert abs(sum(row["score_terms_mean"].values()) - row["final_score_mean"]) < 1e-3
    assert 0.0 <= row["strict_json_rate"] <= 1.0 and 0.0 <= row["fallback_rate"] <= 1.0
    assert 0.001 <= row["final_score_mean"] <= 0.999
    assert len(row["enrolled_by_day_mean"]) == 30 and row["enrolled_by_day_mean"][-1] == row["enrolled_mean"]
    png = plot_results(report["results"], tmp_path / "plot.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_sampled_evaluation_repeats_exactly(tiny_model):
    config = EvalConfig(env="clinical", tasks=(TASK,), seeds=(0, 1), temperature=1.0, top_p=0.8)
    first, second = (evaluate([f"model:{tiny_model}"], config, progress=False)["results"] for _ in range(2))
    assert first == second
    assert evaluate([f"model:{tiny_model}"], config, progress=False)["config"]["top_p"] == 0.8


def test_constrained_decoding_answers_only_listed_candidates(tiny_model):
    from transformers import GenerationConfig

    from recruit_trl.contracts import answer_texts
    from recruit_trl.models.generation import answer_token_ids, eos_ids, sample
    from recruit_trl.models.loading import load_for_inference

    model, tokenizer = load_for_inference(str(tiny_model))
    prompts = [tokenizer("Day 3. Actions:", add_special_tokens=False)["input_ids"]] * 6
    answers = [answer_texts("index", [{}] * n) for n in (1, 2, 3, 5, 11, 30)]
    allowed = [answer_token_ids(tokenizer, texts) for texts in answers]
    config = GenerationConfig(do_sample=True, temperature=3.0, top_k=None)
    ids, logps = sample(model, tokenizer, prompts, config, 12, allowed=allowed)
    for texts, completion, lp in zip(answers, ids, logps, strict=True):
        assert tokenizer.decode(completion, skip_special_tokens=True) in texts
        assert completion[-1] in eos_ids(tokenizer, model.generation_config)
        assert len(lp) == len(completion) and lp[0] == pytest.approx(0.0, abs=1e-6)  # '{"' is forced

    reports = [
        evaluate(
            [f"model:{tiny_model}"],
            EvalConfig(env="clinical", tasks=(TASK,), seeds=(0,), constrained=c),
            progress=False,
        )
        for c in (False, True)
    ]
    assert [r["config"]["constrained"] for r in reports] == [False, True]
    (free,), (constrained,) = (r["results"] for r in reports)
    assert free["valid_action_rate"] < 0.5  # two training steps: the free model rarely parses
    assert constrained["valid_action_rate"] == 1.0
    # Greedy constrained decoding changes exactly the answers that free decoding got wrong: on the first day both
    # runs are in the same state, and later the constrained run still finds the model's own answers mostly invalid.
    assert free["own_answer_valid_rate"] == 1 - free["fallback_rate"]
    assert constrained["own_answer_valid_rate"] < 0.5 and constrained["fallback_rate"] == 0.0


def test_eval_cli_writes_json_and_plot(tmp_path, capsys):
    out, png = tmp_path / "eval.json", tmp_path / "eval.png"
    args = ["eval", "--policy", "random", "--task", TASK, "--seeds", "0-1", "--json", str(out), "--plot", str(png)]
    assert cli([*args, "--no_progress"]) == 0
    report = json.loads(out.read_text())
    assert set(report) == {"results", "config", "versions"}
    assert report["results"][0]["policy"] == "random" and png.is_file()
    assert "random" in capsys.readouterr().out


def test_trace_records_every_decision_and_agrees_with_the_aggregates(tiny_model, tmp_path, capsys):
    path = tmp_path / "trace" / "decisions.jsonl"
    args = ["eval", "--policy", "safe", "--policy", f"model:{tiny_model}", "--task", TASK, "--seeds", "0-1"]
    out = tmp_path / "eval.json"
    assert cli([*args, "--teacher", "heuristic", "--trace", str(path), "--json", str(out), "--no_progress"]) == 0
    assert f"wrote {path}" in capsys.readouterr().out
    records = [json.loads(line) for line in path.read_text().splitlines()]
    results = {r["policy"]: r for r in json.loads(out.read_text())["results"]}
    for policy, row in results.items():
        mine = [r for r in records if r["policy"] == policy]
        assert len(mine) == row["episodes"] * row["episode_length_mean"] == 60
        assert [r["day"] for r in mine if r["seed"] == 1] == list(range(30))
        assert round(sum(r["match"] for r in mine) / 60, 4) == row["teacher_match"]
        assert round(sum(r["valid"] for r in mine) / 60, 4) == row["valid_action_rate"]
        assert all(r["task"] == TASK and r["action"] and r["teacher"] and r["outcome"] for r in mine)
        rejected = [r for r in mine if "error" in r]  # a model's answers the parser rejected: text and reason kept
        assert round(len(rejected) / 60, 4) == (row["fallback_rate"] or 0.0)
        assert all(not r["valid"] and r["error"] and isinstance(r["text"], str) for r in rejected)
    assert set(results) == {"safe", f"model:{tiny_model}"}


def test_evaluation_against_a_server_matches_in_process():
    from servers import env_server_cmd, free_port, start_server, stop_server

    port = free_port()
    proc, url = start_server(env_server_cmd(port), port)
    try:
        local = evaluate(["heuristic"], EvalConfig(env="clinical", tasks=(TASK,), seeds=(0, 1)), progress=False)[
            "results"
        ][0]
        for transport in ("http", "ws"):
            config = EvalConfig(env="clinical", tasks=(TASK,), seeds=(0, 1), env_url=url, transport=transport)
            remote = evaluate(["heuristic"], config, progress=False)["results"][0]
            assert remote["final_score_mean"] == local["final_score_mean"]
            assert remote["action_types"] == local["action_types"]
            assert remote["score_terms_mean"] is None  # the parts need the environment's history: in-process only
    finally:
        stop_server(proc)


def test_report_plots_enrolment_and_summarises_it(tmp_path):
    from recruit_trl.workflow.evaluation.report import summary, write_report

    report = evaluate(
        ["safe", "random"], EvalConfig(env="clinical", tasks=(TASK, "easy_bench"), seeds=(0, 1)), progress=False
    )
    clinical = env.clinical.agent.CLINICAL
    paths = write_report(tmp_path, {"results": report["results"], "config": {"eval_seeds": "0-1"}}, clinical)
    assert Path(paths["enrolled_by_day"]).read_bytes()[:4] == b"\x89PNG"
    assert Path(paths["enrolled_by_day"]).name == "enrolled_by_day.png"
    text = summary(report, clinical)
    assert text.splitlines()[0].startswith("held-out final score (mean ± sd) and (enrolled)")
    assert "enrolled after day 15 / day 30 / peak / end (reference LLMs: 3-5)" in text
    assert f"{'reference':<12}{'nan':>24}{0.607:>24.3f}" in text  # the stage task has no published figure
    assert "reference" not in summary(report)  # the figures come from the interface
    safe = report["results"][0]
    cells = [safe["enrolled_at_mean"]["15"], safe["enrolled_at_mean"]["30"], safe["enrolled_peak_mean"]]
    assert " / ".join(f"{x:.1f}" for x in [*cells, safe["enrolled_mean"]]) in text.splitlines()[-2]
    assert f"({safe['enrolled_mean']:>4.1f})" in text.splitlines()[3]
    worst = dict(safe, valid_action_rate=0.987)  # the lowest validity of a policy's tasks, to a tenth
    assert summary({"results": [worst]}).splitlines()[3].endswith(" 98.7%")
    constrained = dict(safe, valid_action_rate=1.0, fallback_rate=0.0, own_answer_valid_rate=0.9812)
    assert summary({"results": [constrained]}).splitlines()[3].endswith(" 100.0%   98.1%")  # valid, then own


def test_greedy_constrained_decoding_flags_exactly_the_answers_it_changed(warm_model):
    from transformers import GenerationConfig

    from recruit_trl.contracts import answer_texts, parse_index
    from recruit_trl.models.generation import answer_token_ids, encode_prompt, sample
    from recruit_trl.models.loading import load_for_inference
    from recruit_trl.protocol import get_env_interface
    from recruit_trl.traces import collect_traces

    model, tokenizer = load_for_inference(warm_model)
    rows = collect_traces(get_env_interface("clinical"), ["medium_bench"], [5], epsilon=0.5, max_days=60)
    prompts = [encode_prompt(tokenizer, r["messages"]) for r in rows]
    sizes = [len(r["candidate_types"]) for r in rows]
    greedy = GenerationConfig(do_sample=False)
    free, _ = sample(model, tokenizer, prompts, greedy, 12)
    # Every other prompt allows every answer but 0, so that some of the model's own (valid) answers are not.
    first = [k % 2 for k in range(len(rows))]
    allowed = [
        answer_token_ids(tokenizer, answer_texts("index", [{}] * n)[f:]) for n, f in zip(sizes, first, strict=True)
    ]
    unchanged: list = []
    constrained, _ = sample(model, tokenizer, prompts, greedy, 12, allowed=allowed, unchanged=unchanged)
    texts = tokenizer.batch_decode(free, skip_special_tokens=True)
    free_ok = [(parse_index(text, n)[0] or 0) >= f for text, n, f in zip(texts, sizes, first, strict=True)]
    assert unchanged == free_ok and any(free_ok) and not all(free_ok), sum(free_ok)
    assert all((f == c) == same for f, c, same in zip(free, constrained, unchanged, strict=True))


def test_the_evaluation_cache_holds_what_was_evaluated(tmp_path):
    """A cache file evaluated for one policy (or other settings that change the figures) is not reused for another."""
    from dataclasses import replace

    from recruit_trl.workflow.evaluation.cache import cache_key, evaluate_cached

    config, cache = EvalConfig(env="clinical", tasks=(TASK,), seeds=(0,)), tmp_path / "eval.json"

    def fresh(policy: str, cfg: EvalConfig) -> list[dict]:
        return evaluate([policy], cfg, labels=["policy"], progress=False)["results"]

    heuristic = evaluate_cached("heuristic", config, "policy", cache, progress=False)["results"]
    assert heuristic == fresh("heuristic", config)
    safe = evaluate_cached("safe", config, "policy", cache, progress=False)["results"]
    assert safe == fresh("safe", config) != heuristic
    random = evaluate_cached("random", config, "policy", cache, progress=False)["results"]
    for changed in (replace(config, policy_seed=1), replace(config, teacher="safe")):
        again = evaluate_cached("random", changed, "policy", cache, progress=False)["results"]
        assert again == fresh("random", changed) != random
    for changed in (replace(config, recent_k=1), replace(config, env="another"), replace(config, batch_size=8)):
        assert cache_key("random", changed, "policy") != cache_key("random", config, "policy")  # models' settings
    assert cache_key("random", config, "another label") != cache_key("random", config, "policy")
    cache.write_text('{"results": [')  # torn by a kill: evaluated again, with a warning
    with pytest.warns(UserWarning, match="eval.json"):
        assert evaluate_cached("safe", config, "policy", cache, progress=False)["results"] == safe
    assert json.loads(cache.read_text())["results"] == safe


def test_the_evaluation_cache_follows_the_weights_in_a_model_folder(tiny_model, tmp_path):
    """Re-training into the same folder (a re-run with more steps) evaluates the new weights, not the cached ones."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    from recruit_trl.workflow.evaluation.cache import evaluate_cached

    folder = Path(shutil.copytree(tiny_model, tmp_path / "model"))
    config, cache = (
        EvalConfig(env="clinical", tasks=(TASK,), seeds=(0,), constrained=True),
        tmp_path / "eval" / "grpo.json",
    )
    first = evaluate_cached(f"model:{folder}", config, "grpo", cache, progress=False)["results"]
    torch.manual_seed(1)
    AutoModelForCausalLM.from_config(AutoModelForCausalLM.from_pretrained(folder).config).save_pretrained(folder)
    second = evaluate_cached(f"model:{folder}", config, "grpo", cache, progress=False)["results"]
    assert second == evaluate([f"model:{folder}"], config, labels=["grpo"], progress=False)["results"] != first


def test_episodes_played_by_worker_processes_are_the_same_episodes(tiny_model):
    """--workers / EvalConfig.workers: every n-th seed in another process; the rows are those of one process."""
    config = EvalConfig(env="clinical", tasks=("hard_bench_stage_30",), seeds=(0, 1, 2))
    policies = ["heuristic", f"model:{tiny_model}"]
    one, two = (evaluate(policies, replace(config, workers=w), progress=False)["results"] for w in (1, 2))
    assert one == two and [r["episodes"] for r in two] == [3, 3]


def test_paired_differences_compare_episodes_on_the_same_seeds_by_hand():
    from recruit_trl.workflow.evaluation.report import paired_differences

    rows = [
        {"policy": "sft", "task": "duel", "per_episode": {"seed": [1, 2, 3], "final_score": [0.1, 0.5, 1.0],
                                                          "win": [0.0, 0.0, 1.0]}},
        {"policy": "grpo", "task": "duel", "per_episode": {"seed": [1, 2, 3], "final_score": [0.2, 0.5, 1.0],
                                                           "win": [1.0, 0.0, 1.0]}},
        {"policy": "other", "task": "duel", "per_episode": {"seed": [7, 8, 9], "final_score": [0.0, 0.0, 0.0]}},
    ]  # fmt: skip
    paired = paired_differences(rows, "sft")
    # win: differences 1, 0, 0 -> mean 1/3, sd sqrt(1/3), se sqrt(1/3)/sqrt(3) = 1/3.
    assert paired == {"duel": {"grpo": {"final_score": {"diff": 0.0333, "se": 0.0333, "n": 3},
                                        "win": {"diff": 0.3333, "se": 0.3333, "n": 3}}}}  # fmt: skip


def test_result_rows_carry_every_episode_for_paired_comparisons():
    import env.conquest.agent  # noqa: F401

    config = EvalConfig(env="conquest", tasks=("duel",), seeds=(0, 1))
    (row,) = evaluate(["balanced"], config, progress=False)["results"]
    assert row["per_episode"]["seed"] == [0, 1] and len(row["per_episode"]["final_score"]) == 2
    assert sum(row["per_episode"]["win"]) / 2 == row["win_rate"]
