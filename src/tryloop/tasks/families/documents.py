"""Structured-document tasks: a semi-structured text in, a JSON document valid against a schema out.

Four kinds of document — invoices, incident tickets, shipping notices, meeting
notes — each from a record drawn from a seeded RNG, rendered in a layout that
depends on the tier:

    tier 1  labelled lines ("Invoice number: ..."), ISO dates, one value per label
    tier 2  varied labels, dates and amounts in mixed formats, tables, boilerplate,
            a subtotal beside the total
    tier 3  prose (an e-mail, minutes) with distractors: a superseded number, a
            quoted earlier message, values restated in passing

The workspace holds `document.txt` and `schema.json`; the agent writes
`answer.json`. The hidden check holds the schema, the gold record (dates as
YYYY-MM-DD, amounts as numbers, enums in their canonical spelling) and a rule
per field: exact for ids, enum, normalized text, relative error for amounts,
normalized dates, sets for lists, records matched field by field (F1) for rows.
A (kind, tier) pair is a family; its variants share one split.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from tryloop.tasks.families.check import DocumentCheck, FieldRule
from tryloop.tasks.families.data import FIRST, LAST, TIERS
from tryloop.tasks.model import Task, TaskMeta

SOURCE = "docs"
ANSWER_FILE = "answer.json"
DATE = {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"}
COMPANIES = ["Acme Supplies", "Borealis Parts", "Cobalt Logistics", "Delta Office", "Everline Foods",
             "Fjord Tools", "Granite Labs", "Harbor Print"]
SUFFIX = ["Ltd", "GmbH", "Inc.", "S.A.", "LLC"]
CITIES = ["Lisbon", "Hamburg", "Osaka", "Nairobi", "Toronto", "Lyon", "Porto", "Denver"]


def _person(rng: random.Random) -> str:
    return f"{rng.choice(FIRST)} {rng.choice(LAST)}"


def _day(rng: random.Random) -> date:
    return date(2024, 1, 1) + timedelta(days=rng.randrange(330))


def _date_text(rng: random.Random, d: date, tier: int) -> str:
    if tier == 1:
        return d.isoformat()
    return d.strftime(rng.choice(["%d %B %Y", "%B %d, %Y", "%d %b %Y", "%Y-%m-%d", "%a, %d %b %Y"]))


def _money(rng: random.Random, v: float, cur: str, tier: int) -> str:
    sign = {"usd": "$", "eur": "€", "gbp": "£"}[cur]
    if tier == 1:
        return f"{v:.2f}"
    return rng.choice([f"{sign}{v:,.2f}", f"{cur.upper()} {v:,.2f}", f"{v:,.2f} {cur.upper()}"])


def _obj(props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


@dataclass(frozen=True)
class Kind:
    name: str
    what: str                                      # what the instruction asks to extract
    schema: dict[str, Any]
    fields: list[FieldRule]
    record: Callable[[random.Random], dict[str, Any]]
    render: Callable[[random.Random, dict[str, Any], int], str]


# ---- invoices --------------------------------------------------------------------------------

ITEMS = ["paper A4 box", "toner cartridge", "desk lamp", "USB-C cable", "office chair", "label printer",
         "stapler", "monitor arm", "notebook pack", "whiteboard markers"]


def invoice_record(rng: random.Random) -> dict[str, Any]:
    issued = _day(rng)
    items = []
    for name in rng.sample(ITEMS, rng.randint(2, 4)):
        qty, price = rng.randint(1, 12), round(rng.uniform(2, 240), 2)
        items.append({"description": name, "quantity": qty, "amount": round(qty * price, 2)})
    subtotal = round(sum(i["amount"] for i in items), 2)
    tax = round(subtotal * rng.choice([0.0, 0.07, 0.19, 0.2]), 2)
    return {"invoice_number": f"INV-{issued.year}-{rng.randint(100, 9999):04d}",
            "vendor": f"{rng.choice(COMPANIES)} {rng.choice(SUFFIX)}", "issue_date": issued.isoformat(),
            "due_date": (issued + timedelta(days=rng.choice([14, 30, 45, 60]))).isoformat(),
            "currency": rng.choice(["usd", "eur", "gbp"]), "total": round(subtotal + tax, 2), "line_items": items,
            "_tax": tax, "_subtotal": subtotal}


def invoice_render(rng: random.Random, r: dict[str, Any], tier: int) -> str:
    cur = r["currency"]
    iss, due = date.fromisoformat(r["issue_date"]), date.fromisoformat(r["due_date"])
    if tier == 1:
        lines = ["INVOICE", f"Invoice number: {r['invoice_number']}", f"Vendor: {r['vendor']}",
                 f"Issue date: {r['issue_date']}", f"Due date: {r['due_date']}", f"Currency: {cur.upper()}", "Items:"]
        lines += [f"- {i['description']}: quantity {i['quantity']}, amount {i['amount']:.2f}" for i in r["line_items"]]
        return "\n".join([*lines, f"Total: {r['total']:.2f}", ""])
    if tier == 2:
        num_label = rng.choice(["Invoice #", "Bill No.", "Invoice no"])
        lines = [f"{r['vendor'].upper()}", f"{rng.randint(1, 200)} {rng.choice(['Main St', 'Harbour Rd', 'Ring 3'])}",
                 f"Tel. +{rng.randint(10, 99)} {rng.randint(100000, 999999)}", "",
                 f"{num_label}: {r['invoice_number']}      Date of issue: {_date_text(rng, iss, 2)}",
                 f"Payment due: {_date_text(rng, due, 2)}", "",
                 f"{'Description':<22}{'Qty':>5}{'Line total':>16}"]
        lines += [f"{i['description']:<22}{i['quantity']:>5}{_money(rng, i['amount'], cur, 2):>16}"
                  for i in r["line_items"]]
        lines += ["", f"Subtotal: {_money(rng, r['_subtotal'], cur, 2)}", f"Tax: {_money(rng, r['_tax'], cur, 2)}",
                  f"TOTAL DUE: {_money(rng, r['total'], cur, 2)}", "", "Thank you for your business!"]
        return "\n".join(lines) + "\n"
    old = f"INV-{iss.year}-{rng.randint(100, 9999):04d}"
    items = "; ".join(f"{i['quantity']} x {i['description']} ({_money(rng, i['amount'], cur, 3)})"
                      for i in r["line_items"])
    return (f"From: billing@{r['vendor'].split()[0].lower()}.example\nSubject: corrected invoice\n\n"
            f"Hello,\n\nplease disregard invoice {old}, which had an error. The corrected invoice is "
            f"{r['invoice_number']}, issued by {r['vendor']} on {_date_text(rng, iss, 3)}. It covers {items}. "
            f"Before tax that comes to {_money(rng, r['_subtotal'], cur, 3)}; with tax the amount due is "
            f"{_money(rng, r['total'], cur, 3)}, payable by {_date_text(rng, due, 3)}.\n\nBest regards,\n"
            f"{_person(rng)}\n\n> On an earlier date you wrote:\n> Could you resend {old}? We were charged "
            f"{_money(rng, round(r['total'] * 1.1, 2), cur, 3)}.\n")


INVOICE = Kind(
    "invoice", "the invoice's number, vendor, issue and due dates, currency, total amount due and line items",
    _obj({"invoice_number": {"type": "string"}, "vendor": {"type": "string"}, "issue_date": DATE, "due_date": DATE,
          "currency": {"enum": ["usd", "eur", "gbp"]}, "total": {"type": "number"},
          "line_items": {"type": "array", "items": _obj({"description": {"type": "string"},
                                                           "quantity": {"type": "integer"},
                                                           "amount": {"type": "number"}})}}),
    [FieldRule(path="invoice_number", match="exact", weight=2), FieldRule(path="vendor", match="text"),
     FieldRule(path="issue_date", match="date"), FieldRule(path="due_date", match="date"),
     FieldRule(path="currency", match="enum"), FieldRule(path="total", match="amount", weight=2),
     FieldRule(path="line_items", match="records", weight=2,
               record_match={"description": "text", "quantity": "amount", "amount": "amount"})],
    invoice_record, invoice_render)


# ---- incident tickets -------------------------------------------------------------------------

SERVICES = ["checkout-api", "search", "auth-gateway", "billing-worker", "image-resizer", "notifications"]
REGIONS = ["eu-west", "eu-central", "us-east", "us-west", "ap-south"]


def incident_record(rng: random.Random) -> dict[str, Any]:
    d = _day(rng)
    return {"incident_id": f"INC-{rng.randint(10000, 99999)}", "severity": rng.choice(["sev1", "sev2", "sev3", "sev4"]),
            "service": rng.choice(SERVICES), "started_on": d.isoformat(), "reported_by": _person(rng),
            "affected_regions": sorted(rng.sample(REGIONS, rng.randint(1, 3))),
            "status": rng.choice(["open", "mitigated", "resolved"])}


def incident_render(rng: random.Random, r: dict[str, Any], tier: int) -> str:
    sev_n = r["severity"][-1]
    d = date.fromisoformat(r["started_on"])
    regions = r["affected_regions"]
    if tier == 1:
        return (f"Incident ID: {r['incident_id']}\nSeverity: {r['severity']}\nService: {r['service']}\n"
                f"Started on: {r['started_on']}\nReported by: {r['reported_by']}\n"
                f"Affected regions: {', '.join(regions)}\nStatus: {r['status']}\n")
    if tier == 2:
        return (f"=== INCIDENT {r['incident_id']} ===\n[{rng.choice(['SEV', 'Sev', 'P'])}{sev_n}] "
                f"{r['service']} degraded\nopened {_date_text(rng, d, 2)} by {r['reported_by']} (on-call)\n"
                f"Regions impacted:\n" + "".join(f"  * {x.upper()}\n" for x in regions) +
                f"Current state: {r['status'].upper()}\nRunbook: https://runbooks.example/{r['service']}\n"
                f"Pager escalations: {rng.randint(0, 4)}\n")
    other = rng.choice([s for s in SERVICES if s != r["service"]])
    return (f"Timeline notes - {_date_text(rng, d, 3)}\n\n{r['reported_by']} noticed errors in {r['service']} "
            f"and opened {r['incident_id']} at severity {sev_n} " +
            (f"(it was first filed as severity {int(sev_n) + 1} and raised soon after). " if sev_n != "4" else
             "(severity 3 was discussed but not needed). ") + f"{other} looked involved at first but was ruled out. "
            f"Customers in {', '.join(regions[:-1]) + ' and ' + regions[-1] if len(regions) > 1 else regions[0]} "
            f"were affected. As of the last update the incident is {r['status']}.\n")


INCIDENT = Kind(
    "incident", "the incident's id, severity, service, start date, reporter, affected regions and status",
    _obj({"incident_id": {"type": "string"}, "severity": {"enum": ["sev1", "sev2", "sev3", "sev4"]},
          "service": {"type": "string"}, "started_on": DATE, "reported_by": {"type": "string"},
          "affected_regions": {"type": "array", "items": {"enum": REGIONS}},
          "status": {"enum": ["open", "mitigated", "resolved"]}}),
    [FieldRule(path="incident_id", match="exact", weight=2), FieldRule(path="severity", match="enum", weight=2),
     FieldRule(path="service", match="text"), FieldRule(path="started_on", match="date"),
     FieldRule(path="reported_by", match="text"), FieldRule(path="affected_regions", match="set", weight=2),
     FieldRule(path="status", match="enum")],
    incident_record, incident_render)


# ---- shipping notices -------------------------------------------------------------------------

CARRIERS = ["dhl", "ups", "fedex", "dpd"]


def shipping_record(rng: random.Random) -> dict[str, Any]:
    n = rng.randint(1, 4)
    return {"shipment_id": f"SHP{rng.randint(100000, 999999)}", "carrier": rng.choice(CARRIERS),
            "ship_date": _day(rng).isoformat(), "destination_city": rng.choice(CITIES),
            "tracking_numbers": [f"{rng.choice('JZ1')}{rng.randint(10**9, 10**10 - 1)}" for _ in range(n)],
            "weight_kg": round(rng.uniform(0.4, 80), 1)}


def shipping_render(rng: random.Random, r: dict[str, Any], tier: int) -> str:
    d = date.fromisoformat(r["ship_date"])
    if tier == 1:
        return (f"Shipment: {r['shipment_id']}\nCarrier: {r['carrier'].upper()}\nShip date: {r['ship_date']}\n"
                f"Destination: {r['destination_city']}\nTracking numbers: {', '.join(r['tracking_numbers'])}\n"
                f"Weight (kg): {r['weight_kg']}\n")
    lb = round(r["weight_kg"] * 2.20462, 1)
    if tier == 2:
        return (f"DISPATCH NOTE  ref {r['shipment_id']}\nvia {r['carrier'].upper()} Express, dispatched "
                f"{_date_text(rng, d, 2)}\nDeliver to: Receiving dock, {r['destination_city']}\n\nParcels:\n" +
                "".join(f"  #{k + 1}  tracking {t}\n" for k, t in enumerate(r["tracking_numbers"])) +
                f"Gross weight: {r['weight_kg']} kg ({lb} lb)\nHandle with care.\n")
    return (f"Good news! Your order left our warehouse on {_date_text(rng, d, 3)} with {r['carrier'].upper()} "
            f"(shipment {r['shipment_id']}) and is on its way to {r['destination_city']}. It weighs {lb} lb "
            f"({r['weight_kg']} kg). You can follow the {len(r['tracking_numbers'])} parcel(s) with: "
            f"{' and '.join(r['tracking_numbers'])}. (Your previous shipment SHP{rng.randint(100000, 999999)} "
            f"was delivered.)\n")


SHIPPING = Kind(
    "shipping", "the shipment id, carrier, ship date, destination city, tracking numbers and weight in kg",
    _obj({"shipment_id": {"type": "string"}, "carrier": {"enum": CARRIERS}, "ship_date": DATE,
          "destination_city": {"type": "string"}, "tracking_numbers": {"type": "array", "items": {"type": "string"}},
          "weight_kg": {"type": "number"}}),
    [FieldRule(path="shipment_id", match="exact", weight=2), FieldRule(path="carrier", match="enum"),
     FieldRule(path="ship_date", match="date"), FieldRule(path="destination_city", match="text"),
     FieldRule(path="tracking_numbers", match="set", weight=2), FieldRule(path="weight_kg", match="amount")],
    shipping_record, shipping_render)


# ---- meeting notes ---------------------------------------------------------------------------

TOPICS = ["Q3 roadmap", "hiring plan", "office move", "release 2.4", "budget review", "security audit"]
ACTIONS = ["draft the proposal", "book the venue", "update the forecast", "review the contract",
           "send the summary", "fix the build"]


def meeting_record(rng: random.Random) -> dict[str, Any]:
    d = _day(rng)
    people = sorted({_person(rng) for _ in range(rng.randint(3, 6))})
    items = [{"owner": rng.choice(people), "task": a, "due": (d + timedelta(days=rng.randint(2, 20))).isoformat()}
             for a in rng.sample(ACTIONS, rng.randint(1, 3))]
    return {"title": rng.choice(TOPICS), "date": d.isoformat(), "attendees": people, "action_items": items}


def meeting_render(rng: random.Random, r: dict[str, Any], tier: int) -> str:
    d = date.fromisoformat(r["date"])
    if tier == 1:
        return (f"Meeting: {r['title']}\nDate: {r['date']}\nAttendees: {', '.join(r['attendees'])}\nAction items:\n" +
                "".join(f"- {a['owner']}: {a['task']} (due {a['due']})\n" for a in r["action_items"]))
    if tier == 2:
        return (f"# {r['title'].title()} -- {_date_text(rng, d, 2)}\n\nPresent: " + "; ".join(r["attendees"]) +
                "\nApologies: none\n\n## Notes\nDiscussion went well.\n\n## Actions\n" +
                "".join(f"* [ ] {a['task']} -> {a['owner']}, by {_date_text(rng, date.fromisoformat(a['due']), 2)}\n"
                        for a in r["action_items"]))
    absent = next(p for p in (_person(rng) for _ in range(100)) if p not in r["attendees"])
    body = " ".join(f"{a['owner']} agreed to {a['task']} by {_date_text(rng, date.fromisoformat(a['due']), 3)}."
                    for a in r["action_items"])
    return (f"Minutes of the {r['title']} meeting held on {_date_text(rng, d, 3)}. "
            f"{', '.join(r['attendees'][:-1])} and {r['attendees'][-1]} attended; {absent} sent apologies. "
            f"{body} The next meeting is on {_date_text(rng, d + timedelta(days=28), 3)}.\n")


MEETING = Kind(
    "meeting", "the meeting's title, date, attendees and action items (owner, task, due date)",
    _obj({"title": {"type": "string"}, "date": DATE, "attendees": {"type": "array", "items": {"type": "string"}},
          "action_items": {"type": "array", "items": _obj({"owner": {"type": "string"}, "task": {"type": "string"},
                                                              "due": DATE})}}),
    [FieldRule(path="title", match="text"), FieldRule(path="date", match="date"),
     FieldRule(path="attendees", match="set", weight=2),
     FieldRule(path="action_items", match="records", weight=2,
               record_match={"owner": "text", "task": "text", "due": "date"})],
    meeting_record, meeting_render)

KINDS = {k.name: k for k in (INVOICE, INCIDENT, SHIPPING, MEETING)}


def instruction_for(kind: Kind) -> str:
    return (f"`document.txt` in /workspace is a {kind.name} document. Extract {kind.what} into `{ANSWER_FILE}`: "
            f"one JSON object valid against the JSON Schema in `schema.json`. Write dates as YYYY-MM-DD, amounts "
            f"and weights as JSON numbers, and enumerated values exactly as the schema spells them. "
            f"Only `{ANSWER_FILE}` is graded: first its validity against the schema, then each field.\n")


def make_document_task(kind: Kind, tier: int, index: int, seed: int, dest: Path) -> Task:
    rng = random.Random(f"{seed}:{SOURCE}:{kind.name}:{tier}:{index}")
    record = kind.record(rng)
    gold = {k: v for k, v in record.items() if not k.startswith("_")}
    text = kind.render(rng, record, tier)
    check = DocumentCheck(kind="document", answer_file=ANSWER_FILE, track=True, schema=kind.schema, gold=gold,
                          fields=kind.fields)
    family = f"{kind.name}-t{tier}"
    meta = TaskMeta(id=f"{SOURCE}/{family}-{index}", family=f"{SOURCE}-{family}", project=SOURCE, source=SOURCE,
                    description=f"{kind.name} extraction (tier {tier})", tier=TIERS[tier],
                    tags=["documents", kind.name, f"tier-{tier}"], grader="answer", environment="documents",
                    test_timeout_s=60.0, agent_timeout_s=600.0,
                    origin={"template": family, "kind": kind.name, "tier": tier, "variant": index, "seed": seed})
    schema = json.dumps(kind.schema, indent=1) + "\n"
    return Task.create(dest, meta, instruction_for(kind),
                       workspace={"document.txt": text, "schema.json": schema},
                       solution={ANSWER_FILE: json.dumps(gold, indent=1) + "\n"},
                       check=check.model_dump_json(indent=1, by_alias=True))


def document_tasks(dest_root: str | Path, *, count: int | None = None, per_family: int = 3, seed: int = 0,
                   tier: int | None = None) -> list[Task]:
    """`per_family` variants of each (kind, tier) family (of `tier` only if given), round-robin;
    `count` caps the total."""
    out: list[Task] = []
    tiers = [tier] if tier else [1, 2, 3]
    for i in range(per_family):
        for kind in KINDS.values():
            for t in tiers:
                if count is not None and len(out) >= count:
                    return out
                out.append(make_document_task(kind, t, i, seed, Path(dest_root) / SOURCE / f"{kind.name}-t{t}-{i}"))
    return out
