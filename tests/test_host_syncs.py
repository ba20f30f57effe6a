"""No host sync inside a pass: a packed update run on the meta device, where every read of a device value would fail,
with a dispatch mode counting the reads (``aten._local_scalar_dense``: ``.item()``, ``bool()``, ``int()``;
``nonzero`` and boolean indexing, whose output size depends on the data; copies to the host; ``.tolist()``).

Only the designated reads remain: one per optimizer step (is the gradient norm finite?) and one per training step
(the step's statistics). Everything a pass needs to cut, pack and score its rows comes from the host
(``Sequences.layout``) and is copied to the device without blocking."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from helpers import make_tiny_model, mixed_sequences
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from evolrl.logprobs.sequences import Sequences
from evolrl.logprobs.sequencewise_attention import use_sequencewise_attention
from evolrl.models import load_policy
from evolrl.training import Batching
from evolrl.training.update import GRPOLoss, GRPOUpdate

META = torch.device("meta")


class HostReads(TorchDispatchMode):
    """Counts the reads of meta tensors' values by kind, and answers them with placeholders so the update goes on."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not any(isinstance(t, torch.Tensor) and t.device == META for t in tree_leaves((args, kwargs))):
            return func(*args, **kwargs)
        if func is torch.ops.aten._local_scalar_dense.default:
            self.reads["item"] += 1
            return 1.0 if args[0].is_floating_point() else 1
        if func is torch.ops.aten.nonzero.default:
            self.reads["nonzero"] += 1
            return torch.zeros(0, args[0].dim(), dtype=torch.long, device=META)
        if func is torch.ops.aten.index.Tensor and any(i is not None and i.dtype == torch.bool for i in args[1]):
            self.reads["boolean index"] += 1
            return args[0].new_empty((0, *args[0].shape[sum(i is not None for i in args[1]):]))
        if func is torch.ops.aten._to_copy.default and kwargs.get("device") not in (None, META):
            self.reads["copy to the host"] += 1
        return func(*args, **kwargs)


@pytest.mark.parametrize("mini_batch_size", [4, 8])
@pytest.mark.parametrize("packing", ["packed", "shared_prompts"])
def test_an_update_reads_the_device_once_per_optimizer_step_and_once_at_its_end(tmp_path, monkeypatch,
                                                                                mini_batch_size, packing):
    tiny = str(make_tiny_model(tmp_path / "tiny"))
    policy, reference = load_policy(tiny), load_policy(tiny).eval().requires_grad_(False)
    for model in (policy, reference) if packing == "packed" else ():
        use_sequencewise_attention(model)  # what packed runs attend with (build.build_models)
    policy, reference = policy.to(META), reference.to(META)
    seqs = mixed_sequences(int(policy.config.vocab_size))  # 8 sequences, their layout taken on the host
    if packing == "shared_prompts":  # passes of 2 sharing one 4-token prompt (a group a pass: no mask to read)
        seqs = mixed_sequences(int(policy.config.vocab_size), prompts=[4] * 8)
        ids = seqs.input_ids.clone()
        ids[1::2, :4] = ids[::2, :4]
        seqs = Sequences(ids, seqs.attention_mask, seqs.response_mask, seqs.advantages)
        assert seqs.layout.prompts.tolist() == [0, 0, 2, 2, 4, 4, 6, 6]
    seqs = seqs.to(META)
    optimizer = torch.optim.SGD(policy.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    update = GRPOUpdate(GRPOLoss(kl_coef=0.05), Batching(mini_batch_size=mini_batch_size, micro_batch_size=2,
                                                         logprob_chunk_size=16, **{packing: True}),
                        max_grad_norm=1.0)
    mode = HostReads()
    tolist = torch.Tensor.tolist

    def counted(tensor):
        if tensor.device == META:
            mode.reads["tolist"] += 1
            return [0.0] * tensor.numel()
        return tolist(tensor)

    monkeypatch.setattr(torch.Tensor, "tolist", counted)
    with mode:
        update(policy, reference, seqs, temperature=0.7, optimizer=optimizer, scheduler=scheduler)
    optimizer_steps = 8 // mini_batch_size
    # Passes: the reference's and the old log-probs' without gradients, then 4 training passes of 2 sequences.
    assert mode.reads == Counter({"item": optimizer_steps, "tolist": 1})
