"""Write the paper's data sets as local files, for a machine without network: ``evolrl.data.Benchmark`` by name.

    python -m tools.commands.prepare_data --out data/                  # all six, from the Hub
    python -m tools.commands.prepare_data --out data/ --sets math500 amc
    python -m tools.commands.prepare_data --out data/ --dataset gpqa_diamond=/path/to/local/copy

Writes ``<out>/eval/<set>.json`` (MATH-500, AIME24, AIME25, AMC, GPQA-Diamond) and ``<out>/train/math_train.json``,
each a JSON array of ``{prompt, answer, id}`` rows (the format ``evolrl.data.PromptFile`` reads), and
``<out>/MANIFEST.json`` with each file's rows and SHA-256, printed too: copy ``<out>`` to the cluster and compare.
A set whose row count differs from the published one is written, with a warning on stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from evolrl.data.benchmarks import SETS, Benchmark


def prepare(out: Path, names: list[str], datasets: dict[str, str]) -> dict[str, dict]:
    """Write each set's file under ``out``; the manifest ``{file: {rows, sha256, dataset}}``."""
    manifest = {}
    for name in names:
        source = Benchmark(name, dataset=datasets.get(name))
        rows = source.rows()
        path = out / ("train" if name == "math_train" else "eval") / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = json.dumps(rows, ensure_ascii=False, indent=1).encode()
        path.write_bytes(data)
        if len(rows) != SETS[name].rows:
            print(f"warning: {name} has {len(rows)} rows, the published set {SETS[name].rows}", file=sys.stderr)
        manifest[str(path.relative_to(out))] = {"rows": len(rows), "sha256": hashlib.sha256(data).hexdigest(),
                                                "dataset": source.dataset}
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.commands.prepare_data", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="directory to write eval/, train/ and MANIFEST.json")
    parser.add_argument("--sets", nargs="+", choices=list(SETS), default=list(SETS))
    parser.add_argument("--dataset", action="append", default=[], metavar="SET=NAME_OR_DIR",
                        help="read a set from another Hub name or a local dataset directory with the same columns")
    args = parser.parse_args()
    datasets = dict(item.split("=", 1) for item in args.dataset)
    for name, entry in prepare(args.out, args.sets, datasets).items():
        print(f"{name}: {entry['rows']} rows, sha256 {entry['sha256']} ({entry['dataset']})")


if __name__ == "__main__":
    main()
