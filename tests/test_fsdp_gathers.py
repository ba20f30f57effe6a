"""``Batching.reshard_after_forward``: on one device FSDP2's "all-gather" is a copy of every parameter, so the update
keeps each block's gathered weights from a forward to its backward and between a mini-batch's passes. Same update,
fewer copies; afterwards the blocks are sharded again and free their weights after a forward, as FSDP2's default."""

from __future__ import annotations

import collections

import pytest
import torch
from helpers import mixed_sequences, one_process_group
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from evolrl.lora import LoRA
from evolrl.training import Batching
from evolrl.logprobs import Passes
from evolrl.training.build import Dtypes, build_models
from evolrl.training.update import GRPOLoss, GRPOUpdate


def sharded_everywhere(model) -> None:
    """Every parameter, the root's and every block's, is its shard again (FSDP2 registers the gathered ones while it
    holds them)."""
    held = [name for name, p in model.named_parameters() if not isinstance(p, DTensor)]
    assert not held, f"gathered, not sharded: {held}"


class CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def update_under_a_mesh_of_one(tiny_model, precision: str, reshard: bool | None, lora: LoRA | None = None):
    """One packed update with KL (2 mini-batches of 2 passes each) under FSDP2 over a one-process gloo mesh: ``(the
    update, policy, sequences, the aten.copy_ count, the trained weights)``."""
    from torch.distributed.device_mesh import init_device_mesh

    torch.manual_seed(0)  # the adapters' initial weights
    policy, reference = build_models(tiny_model, Dtypes.resolve(precision, "float32"), with_reference=True,
                                     mesh=init_device_mesh("cpu", (1,)), gradient_checkpointing=True,
                                     passes=Passes(packed=True), lora=lora)
    optimizer = torch.optim.SGD(policy.parameters(), lr=1e-2)
    # A step while a block still holds a gathered copy would leave that copy stale for the next forward.
    optimizer.register_step_pre_hook(lambda *_: sharded_everywhere(policy))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    update = GRPOUpdate(GRPOLoss(kl_coef=0.05), Batching(mini_batch_size=4, max_tokens_per_micro_batch=40, packed=True,
                                                         reshard_after_forward=reshard), max_grad_norm=1.0)
    seqs = mixed_sequences(policy.config.vocab_size)
    with CountOps() as ops, torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
        update(policy, reference, seqs, temperature=0.7, optimizer=optimizer, scheduler=scheduler)
    weights = {n: p.full_tensor().detach().clone() for n, p in policy.named_parameters()}
    return update, policy, seqs, ops.counts["aten.copy_"], weights


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_keeping_the_gathered_weights_gives_the_same_update_with_fewer_copies(tiny_model, precision):
    runs = {}
    for reshard in (True, None):  # None: the default, which on one device keeps them
        with one_process_group("gloo"):
            runs[reshard] = update_under_a_mesh_of_one(tiny_model, precision, reshard)
    update, policy, seqs, _, _ = runs[None]
    # The plan the count below is derived from: 2 mini-batches of 2 training passes; one pass without gradients for
    # mini-batch 2's old log-probs, two for the reference's over all 8 sequences.
    assert update.plan(seqs) == [[[0, 2], [1, 3]], [[6, 7], [4, 5]]]
    assert len(update.no_grad_plan(seqs, list(range(4, 8)))) == 1
    assert len(update.no_grad_plan(seqs, list(range(8)))) == 2
    blocks = sum(1 for _ in policy.model.layers.parameters())  # copied by each gather of every block
    root = sum(1 for _ in policy.parameters()) - blocks  # the root's (embeddings, final norm, head)
    # Resharding, the policy's blocks are gathered by the old log-probs' pass and by each training pass's forward and
    # backward (1 + 4 x 2), the reference's once per pass (2); FSDP2 keeps the root's weights after a forward, so the
    # root is gathered by the old log-probs' pass and by training passes 2-4 (the first reuses them). Kept: the
    # policy's blocks and root once per mini-batch, mini-batch 1 reusing the old log-probs' pass (1 + 1), the
    # reference's blocks once (1).
    saved = blocks * ((1 + 4 * 2) - (1 + 1)) + blocks * (2 - 1) + root * ((1 + 3) - (1 + 1))
    if precision == "32-true":  # bf16-mixed casts into its gathers, with copies of its own: counted in float32 only
        assert runs[True][3] - runs[None][3] == saved
    # The same operations on the same weights in the same order; a tolerance only because the two runs' buffers sit at
    # different addresses, and CPU matmul libraries may take alignment-dependent paths.
    for name, value in runs[True][4].items():
        torch.testing.assert_close(runs[None][4][name], value, rtol=1e-6, atol=1e-7, msg=name)


def test_a_lora_policy_and_its_adapters_off_reference_give_the_same_update(tiny_model):
    """LoRA: the reference is the policy with its adapters off (``AdaptersOff``), so its passes reuse the policy's
    held weights; the adapters train as with resharding, and every parameter is sharded at each step (the hook)."""
    runs = {}
    for reshard in (True, None):
        with one_process_group("gloo"):
            runs[reshard] = update_under_a_mesh_of_one(tiny_model, "32-true", reshard, lora=LoRA(rank=4, alpha=8.0))
    assert runs[True][3] > runs[None][3]
    for name, value in runs[True][4].items():  # tolerance: as above
        torch.testing.assert_close(runs[None][4][name], value, rtol=1e-6, atol=1e-7, msg=name)


def test_after_the_update_the_blocks_free_their_gathered_weights_again(tiny_model):
    with one_process_group("gloo"):
        _, policy, seqs, _, _ = update_under_a_mesh_of_one(tiny_model, "32-true", None)
        sharded_everywhere(policy)
        with torch.no_grad():
            policy(input_ids=seqs.input_ids[:1], use_cache=False)
        # FSDP2's default again: the blocks free their weights after a forward (the root keeps its own, as FSDP2 does)
        assert all(isinstance(p, DTensor) for p in policy.model.layers.parameters())


def test_reshard_after_forward_is_checked_where_it_is_declared():
    with pytest.raises(ValueError, match="Batching.reshard_after_forward"):
        Batching(reshard_after_forward=0)
    assert Batching().holds_gathered(1) and not Batching().holds_gathered(2)
    assert Batching(reshard_after_forward=False).holds_gathered(8)
    assert not Batching(reshard_after_forward=True).holds_gathered(1)
