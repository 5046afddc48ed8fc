"""Errors raised by the schema layer. Each names the event type, schema id or field at fault."""


class SchemaError(Exception):
    """Root of every schema-layer error."""


class UnknownEventType(SchemaError):
    """An event type that has no schema in schemas/avro."""


class UnknownSchemaId(SchemaError):
    """A framed message whose schema id is not in the manifest or the registry."""


class DecodeError(SchemaError):
    """Bytes that are not a valid Confluent-framed Avro event."""


class InvalidEvent(SchemaError):
    """A value that does not match its event type's schema."""


class ManifestOutdated(SchemaError):
    """A schema changed without a new version in schemas/manifest.json."""


class IncompatibleSchema(SchemaError):
    """A new schema version cannot read data written with an older one."""
