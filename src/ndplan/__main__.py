"""``python -m ndplan``: the CLI, for launchers that run a module (``torchrun -m ndplan profile ...``)."""

from ndplan.cli import main

main()
