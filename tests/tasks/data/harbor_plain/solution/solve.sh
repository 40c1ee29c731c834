#!/bin/bash
cat > /app/textutil.py <<'PY'
"""Small text helpers."""
import re


def slugify(text: str) -> str:
    """Lowercase, runs of non-alphanumerics become one '-', none at the ends."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
PY
