"""The answer check of an answer-graded task: `tests/check.json`, hidden beside test.sh.

Two kinds, told apart by `kind`:

* `data` — ordered sub-steps, each a key of the answer file with a type
  (number, string, list, table), a reference query (SQL over the pristine data
  files, see `tables`) and a tolerance. The gold value is recomputed from the
  pristine workspace each time the verifier judges; it is stored nowhere.
* `document` — a JSON Schema the answer must satisfy, the gold record and
  per-field matching rules with weights.
* `service` — an operations task: the planted faults' labels, and how to start
  and probe the service in a fresh sandbox (tryloop.rewards.service).

`load_check` validates the file and names the field that is wrong; the gate
rejects a task whose check does not load (reason `check_invalid`).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter, ValidationError, field_validator, model_validator

from tryloop._model import _Model
from tryloop.tasks.model import Task, TaskError

CHECK_MISSING = "check_missing"
CHECK_INVALID = "check_invalid"
DATA_UNREADABLE = "data_unreadable"
ANSWER_TYPES = ("number", "string", "list", "table")
_KEY = r"^[a-z][a-z0-9_]*$"


class Step(_Model):
    """One sub-step of a data task: `answer[name]` compared with the reference query's result."""

    name: str = Field(pattern=_KEY, description="key in the answer file")
    description: str = ""
    type: Literal["number", "string", "list", "table"]
    sql: str = Field(min_length=1, description="reference query over the pristine data (never in the workspace)")
    rel_tol: float = Field(1e-9, ge=0, description="numbers: relative tolerance")
    abs_tol: float = Field(0.0, ge=0, description="numbers: absolute tolerance (e.g. 0.01 for 2 decimals)")
    ordered: bool = Field(False, description="lists and tables: order matters (else compared as multisets)")
    weight: float = Field(1.0, ge=0)


class DataCheck(_Model):
    kind: Literal["data"]
    answer_file: str = "answer.json"
    track: bool = Field(False, description="check the answer file after every turn and record the turn at "
                                           "which each sub-step was first met (cheap: one file read)")
    steps: list[Step] = Field(min_length=1, description="ordered; the last is the final answer")

    @field_validator("steps")
    @classmethod
    def _unique(cls, v: list[Step]) -> list[Step]:
        names = [s.name for s in v]
        if len(set(names)) != len(names):
            raise ValueError(f"step names must be unique: {names}")
        return v


class FieldRule(_Model):
    """How one field of a document answer is scored against the gold record."""

    path: str = Field(min_length=1, description="dotted key in the document, e.g. 'vendor.name'")
    match: Literal["exact", "enum", "text", "amount", "date", "set", "records"]
    weight: float = Field(1.0, ge=0)
    rel_tol: float = Field(0.005, ge=0, description="amounts: relative tolerance")
    keys: list[str] = Field(default_factory=list, description="records: the fields that identify a row, "
                                                              "with their own match in `record_match`")
    record_match: dict[str, Literal["exact", "enum", "text", "amount", "date"]] = Field(default_factory=dict)


class DocumentCheck(_Model):
    kind: Literal["document"]
    answer_file: str = "answer.json"
    track: bool = Field(False, description="as DataCheck.track, per field")
    json_schema: dict[str, Any] = Field(alias="schema", description="the JSON Schema the answer must satisfy")
    gold: dict[str, Any]
    fields: list[FieldRule] = Field(min_length=1)

    @model_validator(mode="after")
    def _schema_ok(self) -> DocumentCheck:
        from jsonschema import Draft202012Validator
        from jsonschema.exceptions import SchemaError

        try:
            Draft202012Validator.check_schema(self.json_schema)
        except SchemaError as e:
            raise ValueError(f"schema is not a valid JSON Schema: {e.message}") from None
        errors = sorted(Draft202012Validator(self.json_schema).iter_errors(self.gold), key=str)
        if errors:
            raise ValueError(f"the gold record does not satisfy the schema: {errors[0].message}")
        return self


class ServiceCheck(_Model):
    """An operations task: the planted fault(s), and how the verifier starts and probes the service."""

    kind: Literal["service"]
    answer_file: str = "answer.json"
    track: bool = False
    labels: list[str] = Field(min_length=1, description="the planted faults' root-cause labels")
    vocabulary: list[str] = Field(min_length=1, description="the labels the instruction offers")
    port: int = Field(ge=1024, le=65535, description="the health check's port on 127.0.0.1")
    start: str = Field(min_length=1, description="the start command, run in /workspace")
    error_log: str = Field(description="where the service writes FATAL on a failed start (the probe stops early)")
    queue_dir: str
    out_dir: str
    rates: dict[str, float] = Field(min_length=1, description="what a job's conversion must use")
    backlog: list[dict[str, Any]] = Field(default_factory=list, description="jobs queued in the workspace")
    protected: list[str] = Field(default_factory=list, description="code restored from the pristine workspace")

    @model_validator(mode="after")
    def _labels_known(self) -> ServiceCheck:
        unknown = sorted(set(self.labels) - set(self.vocabulary))
        if unknown:
            raise ValueError(f"labels {unknown} are not in the vocabulary")
        return self


Check = Annotated[DataCheck | DocumentCheck | ServiceCheck, Field(discriminator="kind")]
_ADAPTER: TypeAdapter = TypeAdapter(Check)


class CheckError(TaskError):
    """The answer check is missing or malformed; `reason` is a gate rejection reason."""

    def __init__(self, message: str, reason: str = CHECK_INVALID):
        super().__init__(message)
        self.reason = reason


def parse_check(raw: bytes | str, where: str = "tests/check.json") -> DataCheck | DocumentCheck | ServiceCheck:
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise CheckError(f"{where}: not JSON: {e}") from None
    try:
        return _ADAPTER.validate_python(doc)
    except ValidationError as err:
        fields = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors()[:5])
        raise CheckError(f"{where}: {fields}") from None


def load_check(task: Task) -> DataCheck | DocumentCheck | ServiceCheck:
    """The task's check; `CheckError` (with the gate's reason) when absent or malformed."""
    if task.meta.grader != "answer":
        raise CheckError(f"task {task.id}: grader is {task.meta.grader!r}, not 'answer'")
    try:
        raw = task.check_path.read_bytes()
    except FileNotFoundError:
        raise CheckError(f"{task.check_path}: missing (an answer-graded task needs its check)",
                         CHECK_MISSING) from None
    return parse_check(raw, str(task.check_path))
