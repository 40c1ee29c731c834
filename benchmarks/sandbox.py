#!/usr/bin/env python3
"""Run the sandbox benchmark from a checkout: the same as `tryloop bench sandbox`.

    sudo .venv/bin/python benchmarks/sandbox.py --quick
    sudo .venv/bin/python benchmarks/sandbox.py --out benchmarks/results-sandbox.json

Options are those of `tryloop bench sandbox --help`; see benchmarks/README.md.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tryloop.cli.main import app  # noqa: E402

if __name__ == "__main__":
    app(["bench", "sandbox", *sys.argv[1:]], prog_name="benchmarks/sandbox.py")
