"""Micro-batches of similar prompt lengths (recruit_trl.training.length_batches): the split by hand, the settings
under which it would change the gradient, and one optimizer step's gradient equal to the one TRL's random split gives
for the same generation batch, for every loss type of TRL 1.16."""

from __future__ import annotations

import contextlib
import logging

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from recruit_trl.training.length_batches import LengthSortedBatches, length_sort_differs, length_sorted_split

# Every loss_type TRL 1.16's GRPOConfig accepts.
LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")


def left_padded(lengths: list[int], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for r, n in enumerate(lengths):
        ids[r, width - n :] = torch.arange(1, n + 1) + 10 * r
        mask[r, width - n :] = 1
    return ids, mask


def test_rows_are_split_by_prompt_length_and_each_micro_batch_is_as_wide_as_its_longest_prompt():
    ids, mask = left_padded([3, 1, 6, 2], width=6)
    batch = {
        "prompt_ids": ids, "prompt_mask": mask, "completion_ids": torch.arange(8).view(4, 2),
        "advantages": torch.tensor([0.3, 0.1, 0.6, 0.2]), "num_items_in_batch": torch.tensor(8), "names": list("abcd"),
        "old_per_token_logps": None,
    }  # fmt: skip
    short, long = length_sorted_split(batch, 2)
    assert short["advantages"].tolist() == pytest.approx([0.1, 0.2]) and short["names"] == ["b", "d"]
    assert long["advantages"].tolist() == pytest.approx([0.3, 0.6]) and long["names"] == ["a", "c"]
    assert short["prompt_ids"].shape == (2, 2) and long["prompt_ids"].shape == (2, 6)
    assert short["prompt_ids"].tolist() == [[0, 11], [31, 32]]  # every row's tokens kept, left padding cut
    assert short["completion_ids"].tolist() == [[2, 3], [6, 7]]
    assert short["num_items_in_batch"] is batch["num_items_in_batch"] and short["old_per_token_logps"] is None
    with pytest.raises(ValueError, match="do not split into 3"):
        length_sorted_split(batch, 3)


def test_the_rows_of_one_prompt_share_a_micro_batch():
    # two prompts of one length, their rows interleaved (TRL's shuffle), and a shorter one: a GRPO group's rows stay
    # together, so the packed trainer computes each prompt once
    ids = torch.tensor([[0, 7, 8], [4, 5, 6], [1, 2, 3], [4, 5, 6], [1, 2, 3], [0, 7, 8]])
    mask = torch.tensor([[0, 1, 1]] + [[1, 1, 1]] * 4 + [[0, 1, 1]])
    short, first, second = length_sorted_split({"prompt_ids": ids, "prompt_mask": mask, "names": list("abcdef")}, 3)
    assert short["names"] == ["a", "f"] and first["names"] == ["b", "d"] and second["names"] == ["c", "e"]


def test_the_cut_keeps_prompt_widths_a_multiple_of_pad_to_multiple_of():
    ids, mask = left_padded([3, 1, 6, 2], width=8)
    short, long = length_sorted_split({"prompt_ids": ids, "prompt_mask": mask}, 2, multiple=4)
    assert short["prompt_ids"].shape == (2, 4) and short["prompt_mask"].tolist() == [[0, 0, 0, 1], [0, 0, 1, 1]]
    assert long["prompt_ids"].shape == (2, 8)  # 6 rounds up to 8, the batch's own width


def grpo_config(tmp_path, **kwargs):
    from trl import GRPOConfig

    geometry = {"per_device_train_batch_size": 4, "num_generations": 4, "gradient_accumulation_steps": 4}
    return GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", **{**geometry, **kwargs})


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_loss_types_whose_normaliser_depends_on_the_micro_batch_are_named(tmp_path, loss_type):
    reason = length_sort_differs(grpo_config(tmp_path, loss_type=loss_type))
    if loss_type == "bnpo":
        assert reason == "loss_type='bnpo' normalises by each micro-batch's own token count"
    else:
        assert reason is None


def test_settings_that_reduce_over_a_micro_batch_are_named(tmp_path):
    assert "top_entropy_quantile=0.2" in length_sort_differs(grpo_config(tmp_path, top_entropy_quantile=0.2))
    assert "entropy_coef=0.01" in length_sort_differs(grpo_config(tmp_path, entropy_coef=0.01))
    assert "use_adaptive_entropy=True" in length_sort_differs(grpo_config(tmp_path, use_adaptive_entropy=True))
    assert "router" in length_sort_differs(grpo_config(tmp_path), aux_loss=True)
    # an optimizer step of half a generation batch: a band of lengths, not a random half
    reason = length_sort_differs(grpo_config(tmp_path, steps_per_generation=8))
    assert reason.startswith("steps_per_generation=8 does not divide gradient_accumulation_steps=4")
    # two whole generation batches per optimizer step: every row of each, whatever the split
    assert length_sort_differs(grpo_config(tmp_path, steps_per_generation=2)) is None
    assert length_sort_differs(grpo_config(tmp_path, loss_type="new_loss")).startswith("loss_type='new_loss'")


@contextlib.contextmanager
def trl_split():
    """TRL's own split of a generation batch (shuffled rows, every micro-batch as wide as the batch)."""

    def split(self, generation_batch):
        return super(LengthSortedBatches, self)._prepare_inputs(generation_batch)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LengthSortedBatches, "_prepare_inputs", split)
        yield


@pytest.fixture
def keep_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_an_optimizer_step_gets_the_gradient_of_trls_split(warm_model, tmp_path, caplog, keep_threads, loss_type):
    """The same generation batch (the first step's rollout, before either split draws from the RNG) trained by TRL's
    shuffled split and by the length-sorted one: the gradients summed over the 4 micro-batches agree to rounding
    where :func:`length_sort_differs` finds nothing, and exactly (TRL's own path, reason logged once) elsewhere."""
    from recruit_trl.tools import bench_rollout

    flags = [
        "--steps", "1", "--model_name_or_path", warm_model, "--anchor_seeds", "100", "--anchor_days", "0-60:20",
        "--tasks", "easy_bench", "hard_bench", "--per_device_train_batch_size", "4", "--num_generations", "4",
        "--gradient_accumulation_steps", "4", "--horizon", "2", "--use_peft", "false", "--output_dir", str(tmp_path),
        "--save_strategy", "no", "--learning_rate", "0", "--loss_type", loss_type,
    ]  # fmt: skip

    def step_gradient(baseline: bool) -> tuple[dict[int, torch.Tensor], int]:
        torch.manual_seed(0)
        _, script_args, training_args, model_args = bench_rollout.parse_args(flags)
        grads, widths = {}, []
        if baseline:
            with trl_split():
                trainer, _ = bench_rollout.build(script_args, training_args, model_args)
        else:
            trainer, _ = bench_rollout.build(script_args, training_args, model_args)
        # build takes both cores; one thread is as fast for this model and much faster beside other jobs
        torch.set_num_threads(1)
        real = trainer.compute_loss

        def record(model, inputs, *args, **kwargs):
            widths.append(inputs["prompt_ids"].size(1))
            return real(model, inputs, *args, **kwargs)

        trainer.compute_loss = record

        def keep(optimizer, *_):
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        grads[len(grads)] = p.grad.detach().clone()

        handle = register_optimizer_step_pre_hook(keep)
        try:
            if baseline:
                with trl_split():
                    trainer.train()
            else:
                trainer.train()
        finally:
            handle.remove()
        return grads, sum(widths)

    trl_grads, trl_width = step_gradient(baseline=True)
    with caplog.at_level(logging.WARNING, logger="recruit_trl.training.length_batches"):
        sorted_grads, sorted_width = step_gradient(baseline=False)
    _, _, training_args, _ = bench_rollout.parse_args(flags)
    reason = length_sort_differs(training_args)
    logged = [r.getMessage() for r in caplog.records if r.name == "recruit_trl.training.length_batches"]
    assert trl_grads and len(trl_grads) == len(sorted_grads)
    if reason is None:
        for k, grad in trl_grads.items():
            assert torch.allclose(grad, sorted_grads[k], rtol=1e-4, atol=1e-6), k
        assert sorted_width < trl_width  # the prompts of easy and hard differ in length: narrower micro-batches
        assert not logged
    else:
        for k, grad in trl_grads.items():
            assert torch.equal(grad, sorted_grads[k]), k
        assert sorted_width == trl_width
        assert logged == [f"length-sorted micro-batches off: {reason}; using TRL's split"]
