"""Counts with tree(1)."""
import json
import subprocess


def count_files(path: str) -> int:
    out = subprocess.run(["tree", "-J", "-a", path], capture_output=True, text=True, check=True).stdout
    report = json.loads(out)[-1]
    return report["directories"]
