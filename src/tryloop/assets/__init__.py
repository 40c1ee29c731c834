"""Small real projects that ship with tryloop (demos, tests, the bundled suite)."""

from pathlib import Path

ASSETS = Path(__file__).parent
CALC_PROJECT = ASSETS / "calc_project"
