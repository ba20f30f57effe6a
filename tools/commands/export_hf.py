"""Export a training checkpoint as a Hugging Face model directory (safetensors + tokenizer).

    python -m tools.commands.export_hf runs/demo/checkpoints/last.ckpt exported/
    python -c "from transformers import AutoModelForCausalLM; AutoModelForCausalLM.from_pretrained('exported')"

A LoRA run's checkpoint (adapters only) is merged into its base; ``--adapter-dir DIR`` also writes the adapter alone
in peft's format (``peft.PeftModel.from_pretrained(base, DIR)``).
"""

from __future__ import annotations

import argparse

from evolrl.training.export import export_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.commands.export_hf",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a .ckpt written by `python -m evolrl fit` (a file, or the directory of "
                                           "a sharded checkpoint from a run on several devices)")
    parser.add_argument("out_dir", help="directory to write")
    parser.add_argument("--model", help="base model string (default: the checkpoint's own)")
    parser.add_argument("--dtype", default="bfloat16", help="dtype of the saved weights (default: bfloat16)")
    parser.add_argument("--adapter-dir", help="a LoRA checkpoint: also write its adapter, in peft's format, here")
    args = parser.parse_args()
    print(export_checkpoint(args.checkpoint, args.out_dir, model=args.model, dtype=args.dtype,
                            adapter_dir=args.adapter_dir))


if __name__ == "__main__":
    main()
