import os
import sys

if not sys.stderr.isatty():  # a log file: no progress-bar frames from libraries (model loading, GGUF conversion)
    os.environ.setdefault("TQDM_DISABLE", "1")  # read when tqdm is imported, so before anything imports it

from evolrl.cli import main  # noqa: E402

if __name__ == "__main__":
    if sys.argv[1:2] == ["export"]:  # not a Trainer method, so not one of LightningCLI's subcommands
        from evolrl.training.export import main as export

        export(sys.argv[2:])
    elif sys.argv[1:2] == ["compare"]:  # runs fit as subprocesses: not a Trainer method either
        from evolrl.compare.cli import main as compare

        compare(sys.argv[2:])
    else:
        main()
