"""Operations troubleshooting: a broken service in the sandbox, a symptom, a fix judged by end state.

The workspace holds a small system under `svc/`: a currency-conversion service
(`app.py`: GET /health on loopback, and a worker draining `queue/` into `out/`),
a metrics sidecar (`sidecar.py`), their configuration (`config.json`,
`service.env`, `sidecar.json`), a rate table (`data/rates.json`, with a backup)
and logs. Fault operators plant one fault in the configuration, the data or
the logs — never in the code, which the verifier restores (with `run.sh`)
before it starts anything, so no reply can be hard-coded:

    config_key    a required key of config.json renamed
    port_clash    the sidecar configured on the service's port
    corrupt_data  the rate table truncated (the backup is intact)
    wrong_env     APP_MODE set to a value the service refuses
    log_flood     the log grown past the service's log quota

The instruction is the symptom — an alert, and in tier 1 the log excerpt that
names the failure; tier 2 only the alert; tier 3 two faults at once — never
the cause. A fault plan (one fault or a pair) is a family: its tiers share a
split, since the same fault's fix looks alike whatever the instruction shows. The agent fixes the files and names the root cause(s) in
`answer.json` ({"root_cause": [labels]}). The verdict (tryloop.rewards.answers,
kind `service`) comes from a fresh sandbox: the agent's files over the
pristine workspace, the code restored, `svc/run.sh` started, then four
sub-steps: `root_cause` (the labels, as a set), `healthy` (GET /health answers
200 on the declared port), `probe` (a job with a fresh random id and amount is
converted right) and `backlog` (the jobs already queued are converted too).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tryloop.tasks.families.data import TIERS
from tryloop.tasks.model import Task, TaskMeta

SOURCE = "ops"
ANSWER_FILE = "answer.json"
PROTECTED = ["svc/app.py", "svc/sidecar.py", "svc/run.sh"]
LABELS = ("config_key", "port_clash", "corrupt_data", "wrong_env", "log_flood")

APP = r'''"""Currency conversion service: GET /health, and a worker converting the jobs queued in queue_dir."""
import http.server
import json
import os
import sys
import threading
import time

ROOT = os.path.dirname(os.path.abspath(__file__))
LOG = os.path.join(ROOT, "logs", "app.log")
REQUIRED = ("listen_port", "queue_dir", "out_dir", "rates_file", "max_log_mb")


def log(msg):
    with open(LOG, "a") as f:
        f.write(time.strftime("%Y-%m-%dT%H:%M:%S ") + msg + "\n")


def fatal(msg):
    sys.stderr.write("FATAL " + msg + "\n")
    log("FATAL " + msg)
    sys.exit(2)


def load_env(path):
    env = {}
    for line in open(path):
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            env[k.strip()] = v.strip()
    return env


def main():
    cfg = json.load(open(os.path.join(ROOT, "config.json")))
    for key in REQUIRED:
        if key not in cfg:
            fatal("config.json: missing required key %r" % key)
    if os.path.exists(LOG) and os.path.getsize(LOG) > cfg["max_log_mb"] * 1024 * 1024:
        sys.stderr.write("FATAL log volume %d bytes over the %d MB quota; refusing to start\n"
                         % (os.path.getsize(LOG), cfg["max_log_mb"]))
        sys.exit(2)
    env = load_env(os.path.join(ROOT, "service.env"))
    if env.get("APP_MODE") not in ("production", "staging"):
        fatal("service.env: APP_MODE=%r is not one of production, staging" % env.get("APP_MODE"))
    try:
        rates = json.load(open(os.path.join(ROOT, cfg["rates_file"])))
    except ValueError as e:
        fatal("cannot parse %s: %s" % (cfg["rates_file"], e))
    queue, out = os.path.join(ROOT, cfg["queue_dir"]), os.path.join(ROOT, cfg["out_dir"])

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            ok = self.path == "/health"
            self.send_response(200 if ok else 404)
            self.end_headers()
            self.wfile.write(b"ok\n" if ok else b"not found\n")

        def log_message(self, *args):
            pass

    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", int(cfg["listen_port"])), Health)
    except OSError as e:
        fatal("cannot listen on 127.0.0.1:%s: %s" % (cfg["listen_port"], e))

    def work():
        while True:
            for name in sorted(os.listdir(queue)):
                path = os.path.join(queue, name)
                try:
                    job = json.load(open(path))
                    amount = round(job["amount"] * rates[job["currency"]], 2)
                    with open(os.path.join(out, job["id"] + ".json"), "w") as f:
                        json.dump({"id": job["id"], "eur": amount}, f)
                    os.remove(path)
                    log("converted %s" % job["id"])
                except Exception as e:
                    log("ERROR job %s: %s" % (name, e))
            time.sleep(0.1)

    threading.Thread(target=work, daemon=True).start()
    log("listening on 127.0.0.1:%s (%s)" % (cfg["listen_port"], env["APP_MODE"]))
    server.serve_forever()


main()
'''

SIDECAR = r'''"""Metrics sidecar: a listener on the port sidecar.json names."""
import json
import os
import socket
import time

ROOT = os.path.dirname(os.path.abspath(__file__))
port = int(json.load(open(os.path.join(ROOT, "sidecar.json")))["port"])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen(8)
while True:
    time.sleep(3600)
'''

RUN = r'''#!/bin/bash
# Starts the sidecar, then the service, in the background; logs under svc/logs/.
cd "$(dirname "$0")"
mkdir -p logs
python3 -I -B sidecar.py >>logs/sidecar.err 2>&1 &
sleep 0.3
python3 -I -B app.py >>logs/app.err 2>&1 &
'''


@dataclass
class Fault:
    label: str
    symptom: str        # the log line the failure leaves (tier 1 shows it)


def _plant(label: str, rng: random.Random, files: dict[str, Any], port: int) -> Fault:
    cfg, env, side = files["svc/config.json"], files["svc/service.env"], files["svc/sidecar.json"]
    if label == "config_key":
        key = rng.choice(["listen_port", "queue_dir", "rates_file"])
        cfg[{"listen_port": "port", "queue_dir": "queue", "rates_file": "rates"}[key]] = cfg.pop(key)
        return Fault(label, f"FATAL config.json: missing required key '{key}'")
    if label == "port_clash":
        side["port"] = port
        return Fault(label, f"FATAL cannot listen on 127.0.0.1:{port}: [Errno 98] Address already in use")
    if label == "corrupt_data":
        text = files["svc/data/rates.json"]
        files["svc/data/rates.json"] = text[: rng.randint(5, len(text) - 5)]
        return Fault(label, "FATAL cannot parse data/rates.json: Expecting ',' delimiter")
    if label == "wrong_env":
        env["APP_MODE"] = rng.choice(["prod", "Production", "live", "stagging"])
        return Fault(label, f"FATAL service.env: APP_MODE='{env['APP_MODE']}' is not one of production, staging")
    if label == "log_flood":
        line = "2024-05-01T00:00:00 DEBUG heartbeat ok\n"
        files["svc/logs/app.log"] = line * ((cfg["max_log_mb"] * (1 << 20)) // len(line) + rng.randint(10, 500))
        return Fault(label, f"FATAL log volume over the {cfg['max_log_mb']} MB quota; refusing to start")
    raise ValueError(f"unknown fault {label!r}")


def _render(files: dict[str, Any]) -> dict[str, bytes]:
    out = {}
    for path, v in files.items():
        if path.endswith(".env"):
            v = "".join(f"{k}={x}\n" for k, x in v.items())
        elif isinstance(v, dict):
            v = json.dumps(v, indent=1) + "\n"
        out[path] = v.encode() if isinstance(v, str) else v
    return out


def _healthy(rng: random.Random) -> tuple[dict[str, Any], dict[str, float], int, list[dict]]:
    port = rng.choice([8080, 8081, 8088, 9000, 5000])
    rates = {c: round(rng.uniform(0.005, 1.5), 4) for c in rng.sample(["USD", "GBP", "JPY", "CHF", "SEK", "PLN",
                                                                       "CAD", "AUD"], 5)}
    backlog = [{"id": f"job-{rng.randint(1000, 9999)}-{i}", "amount": round(rng.uniform(1, 900), 2),
                "currency": rng.choice(list(rates))} for i in range(rng.randint(2, 4))]
    rates_text = json.dumps(rates, indent=1) + "\n"
    files: dict[str, Any] = {
        "svc/app.py": APP, "svc/sidecar.py": SIDECAR, "svc/run.sh": RUN,
        "svc/config.json": {"listen_port": port, "queue_dir": "queue", "out_dir": "out",
                            "rates_file": "data/rates.json", "max_log_mb": rng.choice([1, 2])},
        "svc/service.env": {"APP_MODE": rng.choice(["production", "staging"]), "TZ": "UTC"},
        "svc/sidecar.json": {"port": rng.choice([9100, 9102, 9110])},
        "svc/data/rates.json": rates_text, "svc/data/rates.json.bak": rates_text,
        "svc/logs/app.log": "2024-05-01T00:00:00 listening\n", "svc/out/.keep": "",
        **{f"svc/queue/{j['id']}.json": json.dumps(j) + "\n" for j in backlog},
    }
    return files, rates, port, backlog


def instruction_for(port: int, faults: list[Fault], tier: int) -> str:
    alert = (f"ALERT payments-converter: health check GET http://127.0.0.1:{port}/health failing; "
             f"conversion jobs are piling up in svc/queue/.")
    logs = "".join(f"    {f.symptom}\n" for f in faults) if tier == 1 else ""
    excerpt = f"\nThe last lines the service logged:\n\n{logs}" if logs else ""
    return (f"{alert}\n{excerpt}\nThe service lives in `svc/` (start it with `bash svc/run.sh`; logs in `svc/logs/`). "
            f"Find out why it is down and fix it by changing its configuration, data or logs (the code in "
            f"`app.py`, `sidecar.py` and `run.sh` is correct and is restored before judging). It must answer "
            f"its health check on port {port} and convert the queued jobs and new ones.\n\n"
            f"Then write `{ANSWER_FILE}`: {{\"root_cause\": [...]}} with the label(s) of what was wrong, from: "
            f"{', '.join(LABELS)}.\n")


def make_ops_task(labels: tuple[str, ...], tier: int, index: int, seed: int, dest: Path) -> Task:
    rng = random.Random(f"{seed}:{SOURCE}:{'+'.join(labels)}:{tier}:{index}")
    files, rates, port, backlog = _healthy(rng)
    fixed = _render(files)
    faults = [_plant(label, rng, files, port) for label in labels]
    broken = _render(files)
    solution = {p: d for p, d in fixed.items() if broken.get(p) != d}
    gone = [p for p in broken if p not in fixed]
    if gone:   # the fix renames nothing away in this family; keep the layout plain
        raise ValueError(f"fault {labels} adds files {gone}")
    solution[ANSWER_FILE] = (json.dumps({"root_cause": sorted(labels)}) + "\n").encode()
    check = {"kind": "service", "answer_file": ANSWER_FILE, "labels": sorted(labels), "vocabulary": list(LABELS),
             "port": port, "start": "bash svc/run.sh", "error_log": "svc/logs/app.err", "queue_dir": "svc/queue", "out_dir": "svc/out",
             "rates": rates, "backlog": backlog, "protected": PROTECTED}
    family = "-".join(labels)
    meta = TaskMeta(id=f"{SOURCE}/{family}-t{tier}-{index}", family=f"{SOURCE}-{family}",
                    project=SOURCE, source=SOURCE, description=f"service down: {', '.join(labels)} (tier {tier})",
                    tier=TIERS[tier], tags=["ops", *labels, f"tier-{tier}"], grader="answer", environment="software",
                    protected_paths=[*PROTECTED], test_timeout_s=60.0, agent_timeout_s=600.0,
                    origin={"template": family, "faults": list(labels), "tier": tier, "variant": index, "seed": seed})
    return Task.create(dest, meta, instruction_for(port, faults, tier), workspace=broken, solution=solution,
                       check=json.dumps(check, indent=1))


def ops_tasks(dest_root: str | Path, *, count: int | None = None, per_family: int = 3, seed: int = 0,
              tier: int | None = None) -> list[Task]:
    """Single faults in tiers 1 and 2 (one family per fault and tier), pairs of faults in tier 3."""
    plans: list[tuple[tuple[str, ...], int]] = []
    for t in ([tier] if tier else [1, 2, 3]):
        if t in (1, 2):
            plans += [((label,), t) for label in LABELS]
        else:
            plans += [(pair, 3) for pair in (("config_key", "wrong_env"), ("corrupt_data", "log_flood"),
                                             ("port_clash", "wrong_env"), ("config_key", "corrupt_data"))]
    out: list[Task] = []
    for i in range(per_family):
        for labels, t in plans:
            if count is not None and len(out) >= count:
                return out
            out.append(make_ops_task(labels, t, i, seed, Path(dest_root) / SOURCE /
                                     f"{'-'.join(labels)}-t{t}-{i}"))
    return out
