from pytest_gputrain.cli import main

# Usage lines name the command as typed; the console script gets its own name from argparse.
raise SystemExit(main(prog="python -m pytest_gputrain"))
