"""How the OpenAPI schema (drf-spectacular) describes the callback endpoint: its signature
authentication and the contract's string grammars. Imported by ``CallbacksConfig.ready`` so
the extensions are registered before any schema is built.
"""

from drf_spectacular.extensions import (
    OpenApiAuthenticationExtension,
    OpenApiSerializerFieldExtension,
)

from payments import signing


class ProcessorSignatureScheme(OpenApiAuthenticationExtension):
    target_class = "callbacks.apis.ProcessorSignatureAuthentication"
    name = "processorSignature"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": signing.HEADER,
            "description": (
                "`t=<unix seconds>,v1=<hex>` where hex = HMAC-SHA256(secret, `<t>.` + the raw "
                "request body, byte for byte). Several `v1=` values may be sent while secrets "
                "rotate. Refused (401) when missing, malformed, not matching any configured "
                "secret, or more than 300 s away from the server's clock."
            ),
        }


class PatternFieldSchema(OpenApiSerializerFieldExtension):
    """The contract's string patterns (amount, timestamp, processor_event_id) in the schema,
    anchored as JSON Schema expects, so schema-driven clients and fuzzers know the grammar."""

    target_class = "callbacks.serializers.PatternField"
    match_subclasses = True

    def map_serializer_field(self, auto_schema, direction):
        return {"type": "string", "pattern": f"^(?:{self.target.pattern.pattern})$"}
