import sys

from evolrl.cli import main

if __name__ == "__main__":
    if sys.argv[1:2] == ["export"]:  # not a Trainer method, so not one of LightningCLI's subcommands
        from evolrl.training.export import main as export

        export(sys.argv[2:])
    else:
        main()
