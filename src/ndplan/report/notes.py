"""Notes a report prints (shared by the report builders and the commands' option block)."""

PLOT_MISSING = "matplotlib is not installed: figures skipped, tables only; install them with: pip install 'ndplan[plot]'"
