"""Object storage for what a run produces: trajectory datasets (Parquet) and their exports.

Local directory by default, any fsspec URL (s3://, gs://, memory://) the same way.
The store keeps data exact and findable; it never interprets it (docs/architecture.md).
"""

from tryloop.store.exports import (
    Export,
    ExportInputMissing,
    chat_messages,
    existing_store,
    export_hf,
    export_sft,
    export_verl,
    successful,
)
from tryloop.store.schema import FILE_SCHEMA, SCHEMA, SCHEMA_VERSION, SchemaError
from tryloop.store.trajectories import Part, TrajectoryStore

__all__ = [
    "FILE_SCHEMA", "SCHEMA", "SCHEMA_VERSION", "Export", "ExportInputMissing", "Part", "SchemaError",
    "TrajectoryStore", "chat_messages", "existing_store", "export_hf", "export_sft", "export_verl", "successful",
]
