"""How a training step's sequences are cut into optimizer steps and forward/backward passes, and how a pass runs.

A plain dataclass, declared and checked once (the CLI expands its fields: ``model.batching.micro_batch_size``) and
passed whole to :class:`~evolrl.training.update.GRPOUpdate`; what a pass computes with goes on to the log-prob engine
as one :class:`~evolrl.logprobs.Passes` (:attr:`Batching.passes`). None of these settings changes the update's math: the
loss normalizer is fixed per mini-batch before its passes, so every split, padded or packed, fused head or not, gives
the same update up to float rounding (``tests/test_packing.py``, ``tests/test_training.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from evolrl.logprobs import Passes

from evolrl.settings import check_int, require


@dataclass(frozen=True)
class Batching:
    """Mini-batches (one optimizer step each) and micro-batches (one forward/backward pass each)."""

    mini_batch_size: int = 32
    """Sequences per optimizer step (paper: 32, one prompt's G)."""
    micro_batch_size: int = 2
    """Sequences per forward/backward pass (at most ``mini_batch_size``), unless ``max_tokens_per_micro_batch``."""
    max_tokens_per_micro_batch: int | None = None
    """Instead of ``micro_batch_size``, bin each mini-batch's sequences into passes of at most this many tokens
    (padded: rows x longest; packed: the row), a longer one alone; same math."""
    packed: bool = False
    """Each pass's sequences back to back in one row, without padding; ``fit`` refuses it at start for a model whose
    packed sequences would see each other (``evolrl/logprobs/packing.py``)."""
    shared_prompts: bool = False
    """Each pass computes every distinct prompt once and its responses on that prompt's KV cache (a group's prompt
    once, not G times); same math; not with ``packed``, ``compile_blocks``, FSDP or activation checkpointing."""
    flex_attention: bool = False
    """Packed passes attend with one FlexAttention call per layer and row (fewer GPU launches); needs ``packed``;
    refused at start on a CPU, where torch has no FlexAttention backward."""
    fused_head: bool = True
    """The LM head applied chunk by chunk inside the log-prob step, so a pass's logits never exist whole; refused at
    start for a model whose logits are not a plain Linear head's output (e.g. soft-capped)."""
    logprob_chunk_size: int = 1024
    """Tokens per chunk of the log-prob/entropy computation."""
    train_logprob_chunk_size: int | None = None
    """Tokens per chunk of the log-prob/entropy computation (the fused head) in training passes; null:
    logprob_chunk_size. Larger: fewer, larger chunks (more fp32 buffers); passes without gradients keep that one."""
    no_grad_pass_multiple: int = 2
    """A pass without gradients (reference, old log-probs) takes this many times a training pass's sequences or
    tokens, drawn from the whole step: it keeps no activations, so fewer, larger passes, the same numbers."""
    compile_blocks: bool = False
    """Each decoder block's forward (and with ``fused_head`` the head's chunks) through ``torch.compile``: fewer
    kernels; the first passes pay the compilation (``evolrl/logprobs/compiled.py``); same numbers up to rounding."""
    reduce_every_pass: bool = False
    """Under FSDP, reduce-scatter the gradients after every pass instead of once per mini-batch (its last pass): one
    collective per pass, but the full float32 gradients are never held unsharded between passes (4B: 15 GiB a rank;
    ``python -m tools.commands.gpu_budget --reduce-every-pass`` estimates both)."""

    reshard_after_forward: bool | None = None
    """Under FSDP2, free each block's gathered weights after its forward in the update (true) or keep them to its
    backward and between a mini-batch's passes (false: fewer gathers, a copy of the blocks more); null: false on one
    GPU, where a gather is only a copy, true on several."""

    def __post_init__(self) -> None:
        check_int("Batching.mini_batch_size", self.mini_batch_size, 1)
        check_int("Batching.micro_batch_size", self.micro_batch_size, 1)
        if self.max_tokens_per_micro_batch is None:
            require(self.micro_batch_size <= self.mini_batch_size, "Batching.micro_batch_size", self.micro_batch_size,
                    allowed=f"at most mini_batch_size={self.mini_batch_size} "
                    "(a micro-batch is part of one mini-batch)")
        else:
            check_int("Batching.max_tokens_per_micro_batch", self.max_tokens_per_micro_batch, 1)
        require(isinstance(self.packed, bool), "Batching.packed", self.packed, allowed="true or false")
        require(isinstance(self.shared_prompts, bool), "Batching.shared_prompts", self.shared_prompts,
                allowed="true or false")
        require(not (self.shared_prompts and self.packed), "Batching.shared_prompts", self.shared_prompts,
                allowed="false when packed is true (a packed row has no KV cache to share)")
        require(not (self.shared_prompts and self.compile_blocks), "Batching.shared_prompts", self.shared_prompts,
                allowed="false when compile_blocks is true (compiled blocks are untried with a KV cache)")
        require(isinstance(self.flex_attention, bool), "Batching.flex_attention", self.flex_attention,
                allowed="true or false")
        require(not self.flex_attention or self.packed, "Batching.flex_attention", self.flex_attention,
                allowed="false unless packed is true (it attends over a packed row)")
        require(isinstance(self.fused_head, bool), "Batching.fused_head", self.fused_head, allowed="true or false")
        check_int("Batching.logprob_chunk_size", self.logprob_chunk_size, 1)
        if self.train_logprob_chunk_size is not None:
            check_int("Batching.train_logprob_chunk_size", self.train_logprob_chunk_size, 1)
        check_int("Batching.no_grad_pass_multiple", self.no_grad_pass_multiple, 1)
        require(isinstance(self.compile_blocks, bool), "Batching.compile_blocks", self.compile_blocks,
                allowed="true or false")
        require(isinstance(self.reduce_every_pass, bool), "Batching.reduce_every_pass", self.reduce_every_pass,
                allowed="true or false")
        require(self.reshard_after_forward is None or isinstance(self.reshard_after_forward, bool),
                "Batching.reshard_after_forward", self.reshard_after_forward, allowed="true, false or null")

    @property
    def passes(self) -> Passes:
        """How a pass runs, as the log-prob engine takes it (``evolrl.logprobs.Passes``): the passes without
        gradients'."""
        return Passes(packed=self.packed, flex=self.flex_attention, fused_head=self.fused_head,
                      compiled=self.compile_blocks, shared_prompts=self.shared_prompts,
                      chunk_size=self.logprob_chunk_size)

    @property
    def train_passes(self) -> Passes:
        """:attr:`passes` of a training pass: its own chunk size, where one is set."""
        return replace(self.passes, chunk_size=self.train_logprob_chunk_size or self.logprob_chunk_size)

    def holds_gathered(self, world_size: int) -> bool:
        """Whether the update keeps FSDP2's gathered weights through a pass (:attr:`reshard_after_forward`)."""
        return world_size == 1 if self.reshard_after_forward is None else not self.reshard_after_forward
