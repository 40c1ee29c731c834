"""Data-analysis tasks: seeded messy data files, a question, a typed answer in `answer.json`.

Four datasets, each with a realistic schema and realistic mess, drawn from a
seeded RNG (the same seed gives the same bytes):

    sales    data/orders.csv + data/customers.db   duplicate exports, mixed date formats,
                                                   missing and currency-formatted prices,
                                                   entry-error quantities, noisy region names
    logs     data/access.jsonl                     duplicate request ids, two timestamp formats,
                                                   status as number or string, missing bytes,
                                                   query strings on paths
    sensors  data/readings.csv + data/sensors.jsonl  duplicate rows, fault sentinel -999, glitch
                                                   spikes, blanks, two timestamp formats
    tickets  data/tickets.db                       duplicate rows, open tickets (NULL or ''),
                                                   noisy priorities, mixed date formats

The workspace's `data/README.md` states each dataset's rules (what a duplicate
is, which values are missing or invalid), so every question has one right
answer. A question template is a family (its variants share a split); tiers:

    tier 1  one table, one filter or count
    tier 2  a time window, a cleaning rule and an aggregate, or an arg-max
    tier 3  a join, a grouping into a table, or a top-k list with its tie rule

Every task has two sub-steps: `rows` (the distinct records of the main table,
duplicates counted once: the data was loaded and deduplicated right) and
`answer`. Their reference queries go to the hidden check (`tests/check.json`)
and the verifier recomputes the gold from the pristine files; the reference
answer (`solution/workspace/answer.json`) is what the gate checks it against.
"""

from __future__ import annotations

import csv
import io
import json
import random
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from tryloop.tasks.families.check import DataCheck, Step
from tryloop.tasks.model import Task, TaskMeta

SOURCE = "data"
TIERS = {1: "easy", 2: "medium", 3: "hard"}
ANSWER_FILE = "answer.json"
MONTHS = ["January", "February", "March", "April", "May", "June"]


# ---- mess -------------------------------------------------------------------------

def _fmt_date(rng: random.Random, d: datetime) -> str:
    return d.strftime(rng.choice(["%Y-%m-%d", "%Y-%m-%d", "%d/%m/%Y", "%b %d %Y", "%d %B %Y", "%Y%m%d"]))


def _fmt_time(rng: random.Random, t: datetime, styles: tuple[str, ...]) -> str:
    return t.strftime(rng.choice(styles))


def _with_duplicates(rng: random.Random, rows: list, rate: float) -> list:
    out = list(rows)
    for r in rng.sample(rows, max(1, int(len(rows) * rate))):
        out.insert(rng.randrange(len(out) + 1), r)
    return out


def _csv(header: list[str], rows: list[list[Any]]) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    return buf.getvalue().encode()


def _sqlite(tables: dict[str, tuple[str, list[tuple]]]) -> bytes:
    conn = sqlite3.connect(":memory:")
    for name, (ddl, rows) in tables.items():
        conn.execute(f"CREATE TABLE {name} ({ddl})")
        if rows:
            conn.executemany(f"INSERT INTO {name} VALUES ({', '.join('?' * len(rows[0]))})", rows)
    conn.commit()
    data = conn.serialize()
    conn.close()
    return data


FIRST = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivan", "Jun", "Kofi", "Lena", "Mateo",
         "Nora", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tariq", "Uma", "Viktor", "Wen", "Yara", "Zoe"]
LAST = ["Adams", "Berg", "Costa", "Diaz", "Eze", "Fischer", "Garcia", "Haddad", "Ito", "Jensen", "Kim", "Lopez",
        "Moreau", "Novak", "Okafor", "Park", "Rossi", "Silva", "Tanaka", "Weber"]


def _names(rng: random.Random, n: int) -> list[str]:
    pool = [f"{f} {ln}" for f in FIRST for ln in LAST]
    return rng.sample(pool, n)


@dataclass
class Dataset:
    files: dict[str, bytes]
    readme: str
    rows_question: str          # what the `rows` step counts
    rows_sql: str
    facts: dict[str, list]      # values questions draw their parameters from


# ---- sales ----------------------------------------------------------------------------

PRODUCTS = {"widget": 12.5, "gadget": 30.0, "gizmo": 7.25, "doohickey": 55.0, "sprocket": 3.4, "flange": 18.0,
            "bracket": 9.9, "valve": 42.0}
REGIONS = ["north", "south", "east", "west"]
SALES_CTE = ("WITH o AS (SELECT order_id, customer_id, iso_date(order_date) AS d, product, num(quantity) AS q, "
             "num(unit_price) AS p, norm(region) AS region FROM orders GROUP BY order_id), "
             "rev AS (SELECT *, q * p AS revenue FROM o WHERE p IS NOT NULL AND q <= 1000) ")


def sales(rng: random.Random) -> Dataset:
    n_cust = rng.randint(25, 40)
    names = _names(rng, n_cust)
    customers = [(f"C-{i + 1:03d}", names[i], rng.choice(["consumer", "business", "enterprise"]),
                  rng.choice(["DE", "FR", "US", "BR", "JP", "KE"])) for i in range(n_cust)]
    rows = []
    start = datetime(2024, 1, 1)
    for i in range(rng.randint(220, 320)):
        product = rng.choice(list(PRODUCTS))
        price = round(PRODUCTS[product] * rng.uniform(0.9, 1.1), 2)
        r = rng.random()
        price_s = "" if r < 0.03 else "NA" if r < 0.05 else f"${price:.2f}" if r < 0.25 else f"{price:.2f}"
        qty = rng.randint(1, 20) if rng.random() > 0.03 else rng.choice([9999, 5000, 1200])
        region = rng.choice(REGIONS)
        region_s = rng.choice([region, region, region.title(), f" {region.upper()}", f"{region} "])
        d = start + timedelta(days=rng.randrange(181))
        rows.append([f"O-{10001 + i}", rng.choice(customers)[0], _fmt_date(rng, d), product, str(qty), price_s,
                     region_s])
    rows = _with_duplicates(rng, rows, 0.06)
    files = {"data/orders.csv": _csv(["order_id", "customer_id", "order_date", "product", "quantity", "unit_price",
                                      "region"], rows),
             "data/customers.db": _sqlite({"customers": ("customer_id TEXT, name TEXT, segment TEXT, country TEXT",
                                                         customers)})}
    readme = """# Sales export

- `orders.csv`: one row per order line: order_id, customer_id, order_date, product, quantity, unit_price, region.
- `customers.db`: SQLite, table `customers` (customer_id, name, segment, country).

Rules:
- Some orders were exported twice: rows with the same order_id are one order; count each order once.
- order_date comes in several formats: YYYY-MM-DD, DD/MM/YYYY, `Mar 05 2024`, `05 March 2024`, YYYYMMDD.
- unit_price may carry a `$` sign, or be missing (empty or `NA`): an order with a missing price has no known
  revenue and is left out of revenue figures.
- A quantity above 1000 is an entry error: leave that order out of quantity and revenue figures.
- region names vary in case and spacing: compare them ignoring both; report them in lower case.
- revenue of an order = quantity x unit_price.
"""
    return Dataset(files, readme, "the number of distinct orders in orders.csv",
                   "SELECT count(DISTINCT order_id) FROM orders",
                   {"product": list(PRODUCTS), "region": REGIONS, "month": list(range(1, 7)),
                    "segment": ["consumer", "business", "enterprise"]})


# ---- access logs ---------------------------------------------------------------------------

PATHS = ["/", "/login", "/logout", "/api/items", "/api/items/42", "/api/cart", "/search", "/static/app.js",
         "/admin", "/api/orders"]
LOGS_CTE = ("WITH r AS (SELECT request_id, iso_time(ts) AS t, ip, method, "
            "CASE WHEN instr(path, '?') > 0 THEN substr(path, 1, instr(path, '?') - 1) ELSE path END AS path, "
            "CAST(status AS INTEGER) AS status, coalesce(num(bytes), 0) AS bytes FROM access GROUP BY request_id) ")


def logs(rng: random.Random) -> Dataset:
    ips = [f"10.{rng.randint(0, 9)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}" for _ in range(rng.randint(18, 30))]
    weights = [rng.random() ** 2 for _ in PATHS]
    day0 = datetime(2024, 5, rng.randint(1, 20))
    recs = []
    for i in range(rng.randint(280, 420)):
        t = day0 + timedelta(seconds=rng.randrange(3 * 86400))
        path = rng.choices(PATHS, weights)[0]
        if path in ("/search", "/api/items") and rng.random() < 0.5:
            path += f"?{rng.choice(['q', 'page'])}={rng.randint(1, 9)}"
        status = rng.choices([200, 201, 301, 304, 400, 401, 403, 404, 500, 502, 503],
                             [50, 5, 4, 6, 3, 3, 2, 8, 3, 2, 2])[0]
        rec: dict[str, Any] = {"request_id": f"r-{100000 + i}",
                               "ts": _fmt_time(rng, t, ("%Y-%m-%dT%H:%M:%SZ", "%d/%b/%Y:%H:%M:%S +0000")),
                               "ip": rng.choice(ips), "method": rng.choices(["GET", "POST", "PUT", "DELETE"],
                                                                            [70, 20, 5, 5])[0],
                               "path": path, "status": status if rng.random() < 0.8 else str(status)}
        b = rng.randint(120, 90000)
        r = rng.random()
        if r < 0.06:
            rec["bytes"] = None
        elif r > 0.1:
            rec["bytes"] = b
        recs.append(rec)
    recs = _with_duplicates(rng, recs, 0.05)
    data = "".join(json.dumps(r) + "\n" for r in recs).encode()
    readme = """# Web server access log

- `access.jsonl`: one JSON object per request: request_id, ts, ip, method, path, status, bytes.

Rules:
- Some requests were logged twice: records with the same request_id are one request; count each once.
- ts is UTC, in one of two formats: `2024-05-06T10:11:12Z` or `06/May/2024:10:11:12 +0000`.
- status is a number or a string holding one; 4xx are client errors, 5xx server errors.
- bytes may be null or absent: count it as 0.
- path may end in a query string (`?page=2`): a path is the part before `?`.
"""
    days = [(day0 + timedelta(days=k)).strftime("%Y-%m-%d") for k in range(3)]
    return Dataset({"data/access.jsonl": data}, readme, "the number of distinct requests in access.jsonl",
                   "SELECT count(DISTINCT request_id) FROM access",
                   {"day": days, "path": PATHS, "method": ["GET", "POST"], "hour": list(range(0, 21))})


# ---- sensors ---------------------------------------------------------------------------------

SITES = ["plant-a", "plant-b", "warehouse", "office"]
SENSORS_CTE = ("WITH r AS (SELECT DISTINCT sensor_id, iso_time(ts) AS t, num(temperature) AS temp FROM readings), "
               "v AS (SELECT r.*, s.site FROM r JOIN sensors s USING (sensor_id) "
               "WHERE temp IS NOT NULL AND temp BETWEEN -50 AND 60) ")


def sensors(rng: random.Random) -> Dataset:
    ids = [f"S{n:02d}" for n in rng.sample(range(1, 60), rng.randint(9, 14))]
    meta = [{"sensor_id": s, "site": SITES[i % len(SITES)] if i < len(SITES) else rng.choice(SITES),
             "kind": "temperature"} for i, s in enumerate(ids)]
    base = {m["site"]: rng.uniform(12, 28) for m in meta}
    site_of = {m["sensor_id"]: m["site"] for m in meta}
    day0 = datetime(2024, 7, rng.randint(1, 25))
    rows = []
    for s in ids:
        for h in sorted(rng.sample(range(48), rng.randint(18, 32))):
            t = day0 + timedelta(hours=h, minutes=rng.choice([0, 0, 15, 30]))
            temp = round(base[site_of[s]] + rng.uniform(-4, 4), 1)
            r = rng.random()
            temp_s = "-999" if r < 0.05 else "" if r < 0.08 else f"{rng.choice([150.0, 212.5, 99.9])}" \
                if r < 0.10 else f"{temp}"
            rows.append([s, _fmt_time(rng, t, ("%Y-%m-%d %H:%M:%S", "%d/%m/%Y %H:%M")), temp_s,
                         "" if rng.random() < 0.1 else str(rng.randint(20, 90))])
    rng.shuffle(rows)
    rows = _with_duplicates(rng, rows, 0.05)
    files = {"data/readings.csv": _csv(["sensor_id", "ts", "temperature", "humidity"], rows),
             "data/sensors.jsonl": "".join(json.dumps(m) + "\n" for m in meta).encode()}
    readme = """# Sensor readings

- `readings.csv`: sensor_id, ts, temperature (degrees C), humidity (%).
- `sensors.jsonl`: one object per sensor: sensor_id, site, kind.

Rules:
- Some rows were recorded twice (same sensor, same time, same values): count each reading once.
- ts comes as `2024-07-03 14:15:00` or `03/07/2024 14:15` (day/month/year).
- temperature `-999` is the sensor's fault code and an empty temperature is missing; a value outside
  -50..60 is a glitch. None of these is a valid temperature (a "fault reading" is any of them).
"""
    days = [(day0 + timedelta(days=k)).strftime("%Y-%m-%d") for k in range(2)]
    return Dataset(files, readme, "the number of distinct readings in readings.csv",
                   "SELECT count(*) FROM (SELECT DISTINCT * FROM readings)",
                   {"day": days, "site": sorted(set(site_of.values())), "sensor": ids})


# ---- tickets ---------------------------------------------------------------------------------

CATEGORIES = ["billing", "login", "shipping", "bug", "feature"]
TICKETS_CTE = ("WITH t AS (SELECT id, iso_time(opened_at) AS opened, iso_time(closed_at) AS closed, "
               "upper(trim(priority)) AS priority, category, agent_id FROM tickets.tickets GROUP BY id) ")


def tickets(rng: random.Random) -> Dataset:
    names = _names(rng, rng.randint(6, 10))
    agents = [(f"A{i + 1:02d}", n, rng.choice(["tier1", "tier2", "platform"])) for i, n in enumerate(names)]
    rows = []
    start = datetime(2024, 1, 1)
    for i in range(rng.randint(200, 300)):
        opened = start + timedelta(minutes=rng.randrange(180 * 24 * 60))
        pr = rng.choice(["P1", "P2", "P2", "P3", "P3", "P3"])
        closed = None if rng.random() < 0.15 else opened + timedelta(minutes=rng.randint(10, 60 * 24 * 6))
        closed_s = (None if rng.random() < 0.5 else "") if closed is None else \
            _fmt_time(rng, closed, ("%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%SZ", "%d/%m/%Y %H:%M"))
        rows.append((1000 + i, _fmt_time(rng, opened, ("%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%SZ", "%d/%m/%Y %H:%M")),
                     closed_s, rng.choice([pr, pr, pr.lower(), f" {pr}"]), rng.choice(CATEGORIES),
                     rng.choice(agents)[0]))
    rows = _with_duplicates(rng, rows, 0.04)
    files = {"data/tickets.db": _sqlite({
        "tickets": ("id INTEGER, opened_at TEXT, closed_at TEXT, priority TEXT, category TEXT, agent_id TEXT", rows),
        "agents": ("agent_id TEXT, name TEXT, team TEXT", agents)})}
    readme = """# Support tickets

- `tickets.db`: SQLite. Table `tickets` (id, opened_at, closed_at, priority, category, agent_id);
  table `agents` (agent_id, name, team). agent_id is the agent who handled (and closed) the ticket.

Rules:
- Some tickets appear twice: rows with the same id are one ticket; count each once.
- Timestamps are UTC, as `2024-03-05 14:15:00`, `2024-03-05T14:15:00Z` or `05/03/2024 14:15` (day/month/year).
- closed_at NULL or empty means the ticket is still open.
- priority varies in case and spacing: `P1`, ` p1` are the same; report it upper case.
- resolution time = closed_at - opened_at.
"""
    return Dataset(files, readme, "the number of distinct tickets in tickets.db",
                   "SELECT count(DISTINCT id) FROM tickets.tickets",
                   {"month": list(range(1, 7)), "category": CATEGORIES, "priority": ["P1", "P2", "P3"]})


DATASETS: dict[str, Callable[[random.Random], Dataset]] = {"sales": sales, "logs": logs, "sensors": sensors,
                                                           "tickets": tickets}


# ---- question templates ---------------------------------------------------------------------

@dataclass(frozen=True)
class Question:
    family: str
    dataset: str
    tier: int
    type: str                  # number | string | list | table
    text: str                  # formatted with the params
    sql: str                   # the reference query, formatted with the params
    params: Callable[[random.Random, dict[str, list]], dict[str, Any]]
    shape: str = ""            # how to write the answer (lists and tables)
    abs_tol: float = 0.0
    ordered: bool = False


def _pick(**keys: str) -> Callable[[random.Random, dict[str, list]], dict[str, Any]]:
    def draw(rng: random.Random, facts: dict[str, list]) -> dict[str, Any]:
        out = {k: rng.choice(facts[v]) for k, v in keys.items()}
        if "month" in out:
            out["month_name"], out["ym"] = MONTHS[out["month"] - 1], f"2024-{out['month']:02d}"
        if "hour" in out:
            out["hour2"] = out["hour"] + rng.choice([1, 2, 3])
        return out
    return draw


Q = Question
QUESTIONS: tuple[Question, ...] = (
    # sales
    Q("sales-orders-in-month", "sales", 1, "number", "How many orders were placed in {month_name} 2024?",
      SALES_CTE + "SELECT count(*) FROM o WHERE substr(d, 1, 7) = '{ym}'", _pick(month="month")),
    Q("sales-units-of-product", "sales", 1, "number", "How many units of `{product}` were sold in total?",
      SALES_CTE + "SELECT sum(q) FROM o WHERE product = '{product}' AND q <= 1000", _pick(product="product")),
    Q("sales-region-revenue", "sales", 2, "number",
      "What was the revenue of region `{region}` in {month_name} 2024, rounded to 2 decimals?",
      SALES_CTE + "SELECT round(sum(revenue), 2) FROM rev WHERE region = '{region}' AND substr(d, 1, 7) = '{ym}'",
      _pick(region="region", month="month"), abs_tol=0.011),
    Q("sales-best-product", "sales", 2, "string",
      "Which product had the highest revenue in {month_name} 2024? (On a tie, the alphabetically first.)",
      SALES_CTE + "SELECT product FROM rev WHERE substr(d, 1, 7) = '{ym}' GROUP BY product "
                  "ORDER BY round(sum(revenue), 2) DESC, product LIMIT 1", _pick(month="month")),
    Q("sales-top-customers", "sales", 3, "list",
      "Who are the 3 customers of segment `{segment}` with the highest total revenue? Give their names, highest "
      "first (on a tie, alphabetical).",
      SALES_CTE + "SELECT c.name FROM rev JOIN customers.customers c USING (customer_id) WHERE c.segment = "
                  "'{segment}' GROUP BY c.name ORDER BY round(sum(revenue), 2) DESC, c.name LIMIT 3",
      _pick(segment="segment"), shape="a JSON array of 3 names", ordered=True),
    Q("sales-revenue-by-region", "sales", 3, "table",
      "What was the revenue of each region in {month_name} 2024, rounded to 2 decimals?",
      SALES_CTE + "SELECT region, round(sum(revenue), 2) FROM rev WHERE substr(d, 1, 7) = '{ym}' GROUP BY region",
      _pick(month="month"), shape='a JSON array of [region, revenue] rows, e.g. [["north", 12.5], ...], any order',
      abs_tol=0.011),
    # access logs
    Q("logs-server-errors", "logs", 1, "number", "How many requests got a server error (a 5xx status)?",
      LOGS_CTE + "SELECT count(*) FROM r WHERE status BETWEEN 500 AND 599", _pick()),
    Q("logs-method-on-day", "logs", 1, "number", "How many {method} requests were made on {day} (UTC)?",
      LOGS_CTE + "SELECT count(*) FROM r WHERE method = '{method}' AND substr(t, 1, 10) = '{day}'",
      _pick(method="method", day="day")),
    Q("logs-distinct-ips", "logs", 2, "number", "How many distinct client IPs requested the path `{path}`?",
      LOGS_CTE + "SELECT count(DISTINCT ip) FROM r WHERE path = '{path}'", _pick(path="path")),
    Q("logs-bytes-window", "logs", 2, "number",
      "How many bytes were served on {day} from {hour:02d}:00 (inclusive) to {hour2:02d}:00 (exclusive), UTC?",
      LOGS_CTE + "SELECT sum(bytes) FROM r WHERE t >= '{day} {hour:02d}:00:00' AND t < '{day} {hour2:02d}:00:00'",
      _pick(day="day", hour="hour")),
    Q("logs-top-error-paths", "logs", 3, "list",
      "Which 3 paths got the most client errors (4xx)? Most first; on a tie, alphabetical.",
      LOGS_CTE + "SELECT path FROM r WHERE status BETWEEN 400 AND 499 GROUP BY path "
                 "ORDER BY count(*) DESC, path LIMIT 3", _pick(), shape="a JSON array of 3 paths", ordered=True),
    Q("logs-requests-per-hour", "logs", 3, "table",
      "How many requests were made in each hour of {day} (UTC)? Leave out hours without requests.",
      LOGS_CTE + "SELECT CAST(substr(t, 12, 2) AS INTEGER), count(*) FROM r WHERE substr(t, 1, 10) = '{day}' "
                 "GROUP BY 1", _pick(day="day"),
      shape="a JSON array of [hour, requests] rows with hour a number 0-23, e.g. [[0, 12], ...], any order"),
    # sensors
    Q("sensors-readings-of-sensor", "sensors", 1, "number",
      "How many readings does sensor `{sensor}` have (valid or not)?",
      "SELECT count(*) FROM (SELECT DISTINCT * FROM readings) WHERE sensor_id = '{sensor}'", _pick(sensor="sensor")),
    Q("sensors-fault-codes", "sensors", 1, "number", "How many readings carry the fault code -999?",
      "SELECT count(*) FROM (SELECT DISTINCT * FROM readings) WHERE trim(temperature) = '-999'", _pick()),
    Q("sensors-site-mean", "sensors", 2, "number",
      "What was the mean valid temperature at site `{site}` on {day}, rounded to 2 decimals?",
      SENSORS_CTE + "SELECT round(avg(temp), 2) FROM v WHERE site = '{site}' AND substr(t, 1, 10) = '{day}'",
      _pick(site="site", day="day"), abs_tol=0.011),
    Q("sensors-hottest-sensor", "sensors", 2, "string",
      "Which sensor recorded the highest valid temperature on {day}? (On a tie, the smallest sensor_id.)",
      SENSORS_CTE + "SELECT sensor_id FROM v WHERE substr(t, 1, 10) = '{day}' ORDER BY temp DESC, sensor_id LIMIT 1",
      _pick(day="day")),
    Q("sensors-mean-by-site", "sensors", 3, "table",
      "What was the mean valid temperature of each site on {day}, rounded to 2 decimals?",
      SENSORS_CTE + "SELECT site, round(avg(temp), 2) FROM v WHERE substr(t, 1, 10) = '{day}' GROUP BY site",
      _pick(day="day"), shape='a JSON array of [site, mean] rows, e.g. [["office", 21.3], ...], any order',
      abs_tol=0.011),
    Q("sensors-most-faults", "sensors", 3, "list",
      "Which 3 sensors have the most fault readings? Most first; on a tie, the smaller sensor_id first.",
      "SELECT sensor_id FROM (SELECT DISTINCT sensor_id, ts, num(temperature) AS temp FROM readings) "
      "WHERE temp IS NULL OR temp NOT BETWEEN -50 AND 60 GROUP BY sensor_id ORDER BY count(*) DESC, sensor_id LIMIT 3",
      _pick(), shape="a JSON array of 3 sensor ids", ordered=True),
    # tickets
    Q("tickets-still-open", "tickets", 1, "number", "How many tickets are still open?",
      TICKETS_CTE + "SELECT count(*) FROM t WHERE closed IS NULL", _pick()),
    Q("tickets-category-in-month", "tickets", 1, "number",
      "How many `{category}` tickets were opened in {month_name} 2024?",
      TICKETS_CTE + "SELECT count(*) FROM t WHERE category = '{category}' AND substr(opened, 1, 7) = '{ym}'",
      _pick(category="category", month="month")),
    Q("tickets-resolution-hours", "tickets", 2, "number",
      "What is the mean resolution time, in hours rounded to 2 decimals, of the closed {priority} tickets opened in "
      "{month_name} 2024?",
      TICKETS_CTE + "SELECT round(avg((julianday(closed) - julianday(opened)) * 24), 2) FROM t WHERE closed IS NOT "
                    "NULL AND priority = '{priority}' AND substr(opened, 1, 7) = '{ym}'",
      _pick(priority="priority", month="month"), abs_tol=0.011),
    Q("tickets-busiest-agent", "tickets", 2, "string",
      "Which agent (by name) closed the most `{category}` tickets? (On a tie, the alphabetically first name.)",
      TICKETS_CTE + "SELECT a.name FROM t JOIN tickets.agents a USING (agent_id) WHERE t.closed IS NOT NULL AND "
                    "t.category = '{category}' GROUP BY a.name ORDER BY count(*) DESC, a.name LIMIT 1",
      _pick(category="category")),
    Q("tickets-closed-by-team", "tickets", 3, "table",
      "How many tickets opened in {month_name} 2024 did each team close?",
      TICKETS_CTE + "SELECT a.team, count(*) FROM t JOIN tickets.agents a USING (agent_id) WHERE t.closed IS NOT "
                    "NULL AND substr(t.opened, 1, 7) = '{ym}' GROUP BY a.team", _pick(month="month"),
      shape='a JSON array of [team, tickets] rows, e.g. [["tier1", 7], ...], any order'),
    Q("tickets-slowest", "tickets", 3, "list",
      "Which 3 closed {priority} tickets took longest to resolve? Give their ids, longest first (on a tie, "
      "the smaller id first).",
      TICKETS_CTE + "SELECT id FROM t WHERE closed IS NOT NULL AND priority = '{priority}' "
                    "ORDER BY julianday(closed) - julianday(opened) DESC, id LIMIT 3",
      _pick(priority="priority"), shape="a JSON array of 3 ticket ids (numbers)", ordered=True),
)
BY_FAMILY = {q.family: q for q in QUESTIONS}


# ---- tasks -----------------------------------------------------------------------------------

TYPE_NOTE = {"number": "a JSON number", "string": "a JSON string"}


def _trivial(value: Any) -> bool:
    """A gold value a constant guess would hit (0, empty) or a degenerate top-k."""
    return value in (0, None, "", []) or (isinstance(value, list) and len(value) < 2)


def instruction_for(q: Question, params: dict[str, Any], ds: Dataset) -> str:
    files = ", ".join(f"`{p}`" for p in sorted(ds.files))
    shape = q.shape or TYPE_NOTE[q.type]
    return (f"The data files {files} are described, with the rules for duplicates, missing and invalid values, "
            f"in `data/README.md`.\n\nQuestion: {q.text.format(**params)}\n\n"
            f"Write your answer to `{ANSWER_FILE}` in /workspace as a JSON object with two keys:\n"
            f'- "rows": {ds.rows_question} (a JSON number; duplicates counted once);\n'
            f'- "answer": the answer, as {shape}.\n\n'
            f'For example: {{"rows": 120, "answer": ...}}. Only `{ANSWER_FILE}` is graded.\n')


def make_data_task(q: Question, index: int, seed: int, dest: Path, *, attempts: int = 12) -> Task | None:
    """Variant `index` of question `q`: a fresh dataset and parameters until the answer is not
    trivial (None if no draw gives one)."""
    from tryloop.rewards.answers import data_gold

    for attempt in range(attempts):
        rng = random.Random(f"{seed}:{SOURCE}:{q.family}:{index}:{attempt}")
        ds = DATASETS[q.dataset](rng)
        params = q.params(rng, ds.facts)
        check = DataCheck(kind="data", answer_file=ANSWER_FILE, track=True, steps=[
            Step(name="rows", description="distinct records loaded", type="number", sql=ds.rows_sql),
            Step(name="answer", description=q.text.format(**params), type=q.type, sql=q.sql.format(**params),
                 abs_tol=q.abs_tol, ordered=q.ordered, weight=3.0)])
        workspace = {**ds.files, "data/README.md": ds.readme.encode()}
        gold = data_gold(check, workspace)
        if _trivial(gold["answer"]):
            continue
        meta = TaskMeta(id=f"{SOURCE}/{q.family}-{index}", family=f"{SOURCE}-{q.family}", project=SOURCE,
                        source=SOURCE, description=f"{q.family} (tier {q.tier}, {q.dataset}): {q.type} answer",
                        tier=TIERS[q.tier], tags=["data", q.dataset, q.type, f"tier-{q.tier}"], grader="answer",
                        environment="data", test_timeout_s=60.0, agent_timeout_s=600.0,
                        origin={"template": q.family, "dataset": q.dataset, "tier": q.tier, "variant": index,
                                "attempt": attempt, "seed": seed, "params": params})
        return Task.create(dest, meta, instruction_for(q, params, ds), workspace=workspace,
                           solution={ANSWER_FILE: json.dumps(gold, indent=1) + "\n"},
                           check=check.model_dump_json(indent=1, by_alias=True))
    return None


def data_tasks(dest_root: str | Path, *, count: int | None = None, per_family: int = 3, seed: int = 0,
               tier: int | None = None, families: list[str] | None = None) -> list[Task]:
    """Data tasks under `dest_root`: `per_family` variants of each question template (of `tier`,
    or of `families`), round-robin over templates; `count` caps the total."""
    qs = [q for q in QUESTIONS if (tier is None or q.tier == tier) and (families is None or q.family in families)]
    out: list[Task] = []
    for i in range(per_family):
        for q in qs:
            if count is not None and len(out) >= count:
                return out
            t = make_data_task(q, i, seed, Path(dest_root) / SOURCE / f"{q.family}-{i}")
            if t is not None:
                out.append(t)
    return out
