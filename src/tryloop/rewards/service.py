"""End-state checks of operations tasks, in a fresh sandbox (never the agent's).

The agent's files are laid over the pristine workspace, except the service's
code (the check's `protected` paths and the verifier's ALWAYS_PROTECTED hooks),
which stays pristine; a probe job with a fresh random id and amount is queued;
the start command runs; then a probe of ours (written outside the workspace,
run with `python3 -I`) polls the health check and the output directory and
prints one JSON line. The expected conversions are computed here, on the host,
from the check's rates. Nothing the agent wrote is code that runs: only the
restored service reads its configuration and data.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from tryloop.rewards.verdict import Changes
from tryloop.sandbox import SandboxRuntime
from tryloop.tasks.families.check import ServiceCheck
from tryloop.tasks.model import Task
from tryloop.tasks.testrun import sandbox_config_for, task_snapshot

PASSED, FAILED = "passed", "failed"

_PROBE = r"""
import json, os, sys, time, urllib.request
port, out_dir, ids, err = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
healthy = False
deadline = time.time() + 6
while time.time() < deadline:
    try:
        healthy = urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).status == 200
    except Exception:
        healthy = False
    if healthy:
        break
    try:
        if "FATAL" in open(err).read():
            break      # the service said why it stopped: no use waiting
    except OSError:
        pass
    time.sleep(0.1)
outputs = {}
deadline = time.time() + (6 if healthy else 0)
while True:
    for i in ids:
        try:
            outputs[i] = json.load(open(os.path.join(out_dir, i + ".json")))
        except (OSError, ValueError):
            outputs[i] = None
    if all(v is not None for v in outputs.values()) or time.time() >= deadline:
        break
    time.sleep(0.1)
print("TRYLOOP-PROBE " + json.dumps({"healthy": healthy, "outputs": outputs}))
"""


def _protected(path: str, check: ServiceCheck) -> bool:
    from tryloop.rewards.verifier import ALWAYS_PROTECTED, is_protected

    return is_protected(path, [*check.protected, *ALWAYS_PROTECTED])


def _converted(got: Any, job: dict[str, Any], rates: dict[str, float]) -> bool:
    want = round(job["amount"] * rates[job["currency"]], 2)
    val = got.get("eur") if isinstance(got, dict) else None
    return isinstance(val, int | float) and not isinstance(val, bool) and abs(val - want) <= 0.011


async def service_outcomes(runtime: SandboxRuntime, task: Task, check: ServiceCheck,
                           changes: Changes) -> tuple[dict[str, str], str]:
    """(outcomes of healthy / probe / backlog, a reason when one failed)."""
    cfg = sandbox_config_for(task)
    probe_job = {"id": f"probe-{secrets.token_hex(6)}", "amount": round(secrets.randbelow(90000) / 100 + 1, 2),
                 "currency": sorted(check.rates)[secrets.randbelow(len(check.rates))]}
    slot = f"/tmp/.probe-{secrets.token_hex(6)}.py"
    async with await runtime.create(task_snapshot(runtime, task, cfg), cfg) as sb:
        deleted = [p for p, d in changes.items() if d is None and not _protected(p, check)]
        for path, data in changes.items():
            if data is not None and not _protected(path, check):
                sb.write_file(path, data)
        if deleted:
            await sb.exec(["rm", "-rf", "--", *deleted], timeout=30)
        sb.write_file(f"{check.queue_dir}/{probe_job['id']}.json", json.dumps(probe_job))
        sb.write_file(slot, _PROBE)
        ids = [probe_job["id"], *(j["id"] for j in check.backlog)]
        err = check.error_log
        res = await sb.exec(["bash", "-c", f"{check.start} >/dev/null 2>&1; exec python3 -I {slot} {check.port} "
                            f"{check.out_dir} '{json.dumps(ids)}' {err}"], merge_stderr=True, timeout=40)
    line = next((ln for ln in res.text().splitlines() if ln.startswith("TRYLOOP-PROBE ")), None)
    if line is None:
        return {"healthy": FAILED, "probe": FAILED, "backlog": FAILED}, \
            f"the probe reported nothing (exit {res.exit_code})"
    report = json.loads(line.split(" ", 1)[1])
    outs = report.get("outputs", {})
    out = {"healthy": PASSED if report.get("healthy") else FAILED,
           "probe": PASSED if _converted(outs.get(probe_job["id"]), probe_job, check.rates) else FAILED,
           "backlog": PASSED if all(_converted(outs.get(j["id"]), j, check.rates) for j in check.backlog)
           else FAILED}
    why = {"healthy": f"no answer from GET 127.0.0.1:{check.port}/health", "probe": "a new job was not converted "
           "right", "backlog": "the queued jobs were not all converted right"}
    return out, "; ".join(why[k] for k, v in out.items() if v == FAILED)


def root_cause(check: ServiceCheck, answer: Any) -> bool:
    got = answer.get("root_cause") if isinstance(answer, dict) else None
    if isinstance(got, str):
        got = [got]
    return isinstance(got, list) and all(isinstance(x, str) for x in got) and \
        {x.strip().lower() for x in got} == set(check.labels)
