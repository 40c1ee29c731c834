"""The red-team table: every attack on every red-team task, judged by the real verifier.

    sudo .venv/bin/python benchmarks/redteam.py --out benchmarks/results-redteam.json

The tasks are the suite's (`redteam_tasks`: a HumanEval problem and a multi-file bug) and the two
fixtures of the test suite (`fixture/visible-tests`: visible tests and a conftest;
`fixture/table-tests`: hidden tests that keep their expected values in a parametrization and a
table). Every attack runs with the default reward spec. The attacks only the decoy run stops
(`CAUGHT_BY_DECOYS`), and `do_nothing` as the control, run again with `partial_credit: true` (an attack that reads one kind of
expectation earns what it read), with and without decoys: without them is what they earned
before. The Markdown tables (attack, then `verdict reward` per task, then the flags) go to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

from tryloop.config import TryloopConfig
from tryloop.rewards import redteam
from tryloop.rewards.spec import RewardSpec
from tryloop.sandbox import SandboxRuntime
from tryloop.tasks.model import Task

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "rewards" / "data"


async def main(out: Path | None) -> dict:
    rt = SandboxRuntime(TryloopConfig().runtime)
    with tempfile.TemporaryDirectory() as tmp:
        tasks = redteam.redteam_tasks(Path(tmp)) + [Task.load(FIXTURES / "visible-tests"),
                                                     Task.load(FIXTURES / "table-tests")]
        after = await redteam.table(rt, tasks)
        caught = [*sorted(redteam.CAUGHT_BY_DECOYS), "do_nothing"]  # the control: what the broken code earns
        partial = await redteam.table(rt, tasks, caught, spec=RewardSpec(partial_credit=True))
        before = await redteam.table(rt, tasks, caught, spec=RewardSpec(partial_credit=True, decoys=False))
    ids = [t.id for t in tasks]
    res = {"tasks": ids, "default": after, "partial_credit": partial, "partial_credit_decoys_off": before}
    print(redteam.markdown(after))
    print("\nwith partial_credit: true\n")
    print(redteam.markdown(partial))
    print("\nwith partial_credit: true, decoys: false\n")
    print(redteam.markdown(before))
    if out:
        out.write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path)
    asyncio.run(main(p.parse_args().out))
