"""The Confluent Schema Registry wire format, with fastavro.

A value is a magic byte 0, the writer schema's registry id as 4 bytes
big-endian, then the record in Avro's binary encoding (no container-file
header, no schema).  Serializers of other languages (KafkaAvroSerializer,
confluent-kafka's AvroSerializer) write and read the same bytes.

There is no schema registry on this machine: the schema is order.avsc,
next to this file, and its id the fixed SCHEMA_ID.  A real service
registers the schema at start-up (or looks it up) and uses the id the
registry answers; a consumer fetches the writer's schema by the id in each
value (and caches it) instead of comparing it with a constant.
"""
import io
import struct
from pathlib import Path

import fastavro.schema
from fastavro import schemaless_reader, schemaless_writer

SCHEMA = fastavro.schema.load_schema(Path(__file__).with_name("order.avsc"))
SCHEMA_ID = 1
CONTENT_TYPE = "application/vnd.confluent.avro"
MAGIC = 0
_PREFIX = struct.Struct(">BI")  # magic byte, schema id (big-endian)


def encode(record):
    """record as magic byte, SCHEMA_ID and Avro binary body."""
    out = io.BytesIO()
    out.write(_PREFIX.pack(MAGIC, SCHEMA_ID))
    schemaless_writer(out, SCHEMA, record)
    return out.getvalue()


def decode(value):
    """The record in value; ValueError when it is not one of ours."""
    if len(value) < _PREFIX.size:
        raise ValueError(f"{len(value)} bytes: too short for the wire format")
    magic, schema_id = _PREFIX.unpack_from(value)
    if magic != MAGIC:
        raise ValueError(f"magic byte {magic}, want {MAGIC}")
    if schema_id != SCHEMA_ID:
        raise ValueError(f"schema id {schema_id}, this consumer knows {SCHEMA_ID}")
    body = io.BytesIO(value[_PREFIX.size:])
    try:
        record = schemaless_reader(body, SCHEMA)
    except Exception as e:  # fastavro raises EOFError, UnicodeDecodeError...
        raise ValueError(f"not an {SCHEMA['name']}: {e!r}") from e
    if body.tell() != len(value) - _PREFIX.size:
        raise ValueError(f"{len(value) - _PREFIX.size - body.tell()} bytes after the record")
    return record
