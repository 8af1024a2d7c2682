"""The JSON-schema suite of the structured-output benchmarks.

``SCHEMAS`` is a tuple of ``(name, schema)`` pairs: 26 JSON schemas (draft 2020-12 keywords), each a plain
dict, chosen to cover what requests with ``response_format={"type": "json_schema", ...}`` carry in practice:

* objects: nested objects, optional (non-required) fields, ``additionalProperties: false``, ``$defs`` and
  ``$ref`` (including a recursive tree), ``anyOf`` over scalars and over objects (with ``const``
  discriminators);
* arrays: ``minItems`` / ``maxItems``, arrays of objects, arrays of arrays;
* scalars: ``enum``, ``const``, booleans, ``null`` and nullable types, integers and numbers with
  ``minimum`` / ``maximum`` and ``exclusiveMinimum`` / ``exclusiveMaximum``, strings with ``pattern``,
  ``format`` (``date``, ``date-time``, ``time``, ``email``, ``uuid``: formats llguidance implements),
  ``minLength`` / ``maxLength``;
* a "long fixed parts" schema (``long_fixed_parts``): many required keys with long names whose values are
  ``const`` or one-of-a-few ``enum`` strings, so that most of the output text is fixed by the schema (the case
  where fast-forwarding forced tokens pays off);
* sizes: ``SIZES`` maps every name to ``"small"`` (at most ~6 properties, flat or one level),
  ``"medium"`` (~7-25 properties, nesting, arrays of objects) or ``"large"`` (~30-50 properties).

Strings constrained by ``pattern`` carry an ``examples`` entry (an annotation that grammar compilers ignore)
so that ``mask_cost.make_instance`` can produce a valid instance without a regex sampler. Every schema
compiles with llguidance on the embedded tokenizer (``tests/bench/test_structured_schemas.py``).
"""

from __future__ import annotations


def _obj(properties: dict, required=None, closed: bool = False) -> dict:
    """An object schema; ``required`` defaults to every property."""
    out = {"type": "object", "properties": properties,
           "required": list(properties) if required is None else list(required)}
    if closed:
        out["additionalProperties"] = False
    return out


_SKU = {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$", "examples": ["KTX-0042"]}
_ZIP = {"type": "string", "pattern": "^[0-9]{5}(-[0-9]{4})?$", "examples": ["94107"]}
_COUNTRY = {"type": "string", "enum": ["US", "CA", "MX", "GB", "FR", "DE", "JP", "BR", "IN", "AU"]}
_ADDRESS = _obj({
    "street": {"type": "string", "minLength": 1, "maxLength": 80},
    "city": {"type": "string", "minLength": 1, "maxLength": 40},
    "zip": _ZIP,
    "country": _COUNTRY,
}, closed=True)

# ----------------------------------------------------------------------------------------------- small

FLAT_PERSON = _obj({
    "name": {"type": "string", "minLength": 1, "maxLength": 40},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "email": {"type": "string", "format": "email"},
}, required=["name", "age"])

SENTIMENT = _obj({
    "sentiment": {"type": "string", "enum": ["positive", "negative", "neutral", "mixed"]},
    "confidence": {"type": "number", "minimum": 0, "maximum": 1},
}, closed=True)

CONST_HEADER = _obj({
    "schema_version": {"const": "2.1"},
    "kind": {"const": "heartbeat"},
    "healthy": {"type": "boolean"},
}, closed=True)

NULLABLE = _obj({
    "middle_name": {"type": ["string", "null"], "maxLength": 20},
    "deleted_at": {"type": "null"},
    "manager_id": {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}]},
})

NUMERIC_BOUNDS = _obj({
    "count": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 100},
    "ratio": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
    "temperature_c": {"type": "number", "minimum": -273.15, "maximum": 1000},
    "offset": {"type": "integer", "minimum": -50, "maximum": 50},
}, closed=True)

STRING_PATTERNS = _obj({
    "sku": _SKU,
    "zip": _ZIP,
    "hex_color": {"type": "string", "pattern": "^#[0-9a-f]{6}$", "examples": ["#1a2b3c"]},
    "semver": {"type": "string", "pattern": "^[0-9]+\\.[0-9]+\\.[0-9]+$", "examples": ["1.12.3"]},
}, closed=True)

STRING_FORMATS = _obj({
    "id": {"type": "string", "format": "uuid"},
    "birthday": {"type": "string", "format": "date"},
    "created_at": {"type": "string", "format": "date-time"},
    "alarm": {"type": "string", "format": "time"},
    "contact": {"type": "string", "format": "email"},
})

STRING_LENGTHS = _obj({
    "code": {"type": "string", "minLength": 4, "maxLength": 4},
    "nickname": {"type": "string", "minLength": 3, "maxLength": 12},
    "summary": {"type": "string", "minLength": 20, "maxLength": 120},
    "note": {"type": "string", "maxLength": 200},
}, required=["code", "nickname", "summary"])

TAG_LISTS = _obj({
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "minItems": 1, "maxItems": 5},
    "rgb": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 255},
            "minItems": 3, "maxItems": 3},
})

ANY_OF_SCALARS = _obj({
    "id": {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "format": "uuid"}]},
    "value": {"anyOf": [{"type": "number"}, {"type": "string", "maxLength": 30}, {"type": "boolean"},
                        {"type": "null"}]},
})

CLOSED_POINT = _obj({"x": {"type": "number"}, "y": {"type": "number"}}, closed=True)

BOOLEAN_FLAGS = _obj({
    "is_admin": {"type": "boolean"},
    "is_verified": {"type": "boolean"},
    "newsletter": {"type": "boolean"},
    "beta_features": {"type": "boolean"},
}, required=["is_admin", "is_verified"], closed=True)

# ---------------------------------------------------------------------------------------------- medium

NESTED_ADDRESS = _obj({
    "name": {"type": "string", "maxLength": 60},
    "address": _ADDRESS,
    "geo": _obj({
        "lat": {"type": "number", "minimum": -90, "maximum": 90},
        "lon": {"type": "number", "minimum": -180, "maximum": 180},
    }, closed=True),
    "phone": {"type": "string", "pattern": "^\\+[0-9]{7,15}$", "examples": ["+14155550123"]},
}, required=["name", "address", "geo"])

ORDER = _obj({
    "order_id": {"type": "string", "format": "uuid"},
    "status": {"type": "string", "enum": ["pending", "paid", "shipped", "delivered", "cancelled"]},
    "created_at": {"type": "string", "format": "date-time"},
    "customer": _obj({
        "name": {"type": "string", "maxLength": 60},
        "email": {"type": "string", "format": "email"},
    }),
    "items": {"type": "array", "minItems": 1, "maxItems": 10, "items": _obj({
        "sku": _SKU,
        "quantity": {"type": "integer", "minimum": 1, "maximum": 100},
        "unit_price": {"type": "number", "exclusiveMinimum": 0},
    }, closed=True)},
    "coupon": {"type": "string", "maxLength": 12},
}, required=["order_id", "status", "created_at", "customer", "items"])

DEFS_REFS = {
    "$defs": {
        "address": _ADDRESS,
        "person": _obj({
            "name": {"type": "string", "maxLength": 60},
            "email": {"type": "string", "format": "email"},
            "home": {"$ref": "#/$defs/address"},
        }, required=["name", "home"]),
    },
    **_obj({
        "owner": {"$ref": "#/$defs/person"},
        "tenants": {"type": "array", "items": {"$ref": "#/$defs/person"}, "minItems": 1, "maxItems": 4},
        "billing_address": {"$ref": "#/$defs/address"},
    }),
}

RECURSIVE_TREE = {
    "$defs": {
        "node": _obj({
            "label": {"type": "string", "maxLength": 20},
            "weight": {"type": "integer", "minimum": 0, "maximum": 9},
            "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 3},
        }, required=["label", "children"]),
    },
    **_obj({"root": {"$ref": "#/$defs/node"}, "depth": {"type": "integer", "minimum": 0}}),
}

SHAPES = _obj({
    "shapes": {"type": "array", "minItems": 1, "maxItems": 6, "items": {"anyOf": [
        _obj({"kind": {"const": "circle"}, "radius": {"type": "number", "exclusiveMinimum": 0}}, closed=True),
        _obj({"kind": {"const": "rectangle"}, "width": {"type": "number", "exclusiveMinimum": 0},
              "height": {"type": "number", "exclusiveMinimum": 0}}, closed=True),
        _obj({"kind": {"const": "polygon"}, "points": {"type": "array", "minItems": 3, "maxItems": 8,
              "items": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}}},
             closed=True),
    ]}},
    "canvas": {"type": "string", "enum": ["a4", "letter", "square"]},
})

TOOL_CALL = _obj({
    "name": {"const": "get_weather_forecast"},
    "arguments": _obj({
        "location": {"type": "string", "minLength": 2, "maxLength": 60},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit", "kelvin"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "include_hourly": {"type": "boolean"},
    }, required=["location", "unit", "days"], closed=True),
}, closed=True)

EVENT_LOG = _obj({
    "service": {"type": "string", "enum": ["auth", "billing", "search", "storage", "gateway"]},
    "level": {"type": "string", "enum": ["debug", "info", "warning", "error", "critical"]},
    "timestamp": {"type": "string", "format": "date-time"},
    "trace_id": {"type": "string", "pattern": "^[0-9a-f]{32}$",
                 "examples": ["4bf92f3577b34da6a3ce929d0e0e4736"]},
    "message": {"type": "string", "maxLength": 200},
    "http": _obj({
        "method": {"type": "string", "enum": ["GET", "POST", "PUT", "PATCH", "DELETE"]},
        "path": {"type": "string", "pattern": "^/[a-z0-9/_-]*$", "examples": ["/v1/users/42"]},
        "status": {"type": "integer", "minimum": 100, "maximum": 599},
        "latency_ms": {"type": "number", "minimum": 0},
    }, required=["method", "path", "status"], closed=True),
    "user_id": {"type": ["integer", "null"]},
    "retryable": {"type": "boolean"},
}, required=["service", "level", "timestamp", "message"], closed=True)

MATRIX = _obj({
    "name": {"type": "string", "maxLength": 20},
    "rows": {"type": "array", "minItems": 2, "maxItems": 4, "items": {
        "type": "array", "minItems": 3, "maxItems": 3, "items": {"type": "number", "minimum": -10, "maximum": 10}}},
    "labels": {"type": "array", "items": {"type": "string", "enum": ["x", "y", "z"]}, "minItems": 3,
               "maxItems": 3},
})

API_RESPONSE = _obj({
    "status": {"const": "ok"},
    "request_id": {"type": "string", "format": "uuid"},
    "data": {"type": "array", "maxItems": 5, "items": _obj({
        "id": {"type": "integer", "minimum": 1},
        "title": {"type": "string", "maxLength": 80},
        "score": {"type": "number", "minimum": 0, "maximum": 100},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    }, required=["id", "title"])},
    "pagination": _obj({
        "page": {"type": "integer", "minimum": 1},
        "per_page": {"type": "integer", "enum": [10, 25, 50, 100]},
        "total": {"type": "integer", "minimum": 0},
        "next_cursor": {"type": ["string", "null"], "maxLength": 40},
    }, closed=True),
    "warnings": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
}, required=["status", "request_id", "data", "pagination"])

LONG_FIXED_PARTS = _obj({
    "document_classification_schema_version": {"const": "enterprise-records-v3.2.1"},
    "document_primary_category_identifier": {"type": "string", "enum": [
        "financial_statement_quarterly_report", "human_resources_employee_record", "legal_contract_agreement"]},
    "document_confidentiality_level_designation": {"type": "string", "enum": [
        "strictly_confidential_internal_only", "confidential_partners_allowed", "public_unrestricted"]},
    "document_retention_policy_identifier": {"const": "retain_seven_years_then_archive_offsite"},
    "document_language_iso_code_designation": {"type": "string", "enum": ["en-US", "en-GB", "fr-FR", "de-DE"]},
    "regulatory_compliance_framework_reference": {"const": "sarbanes_oxley_section_404_internal_controls"},
    "automated_processing_pipeline_stage_name": {"type": "string", "enum": [
        "optical_character_recognition_completed", "entity_extraction_completed", "human_review_pending"]},
    "originating_business_unit_department_name": {"type": "string", "enum": [
        "corporate_finance_and_accounting_division", "global_human_resources_operations"]},
    "requires_executive_management_approval_flag": {"type": "boolean"},
    "digital_signature_verification_status_code": {"const": "signature_verified_certificate_chain_valid"},
    "number_of_pages_in_scanned_document": {"type": "integer", "minimum": 1, "maximum": 999},
    "data_protection_impact_assessment_status": {"type": "string", "enum": [
        "assessment_not_required_low_risk", "assessment_completed_approved"]},
}, closed=True)

# ----------------------------------------------------------------------------------------------- large


def _product_catalog() -> dict:
    props = {
        "product_id": {"type": "string", "format": "uuid"},
        "sku": _SKU,
        "name": {"type": "string", "minLength": 1, "maxLength": 80},
        "brand": {"type": "string", "maxLength": 40},
        "description": {"type": "string", "maxLength": 300},
        "category": {"type": "string", "enum": ["electronics", "books", "clothing", "home", "garden", "toys",
                                                "sports", "grocery", "beauty", "automotive"]},
        "subcategory": {"type": "string", "maxLength": 40},
        "price": {"type": "number", "exclusiveMinimum": 0, "maximum": 100000},
        "currency": {"type": "string", "enum": ["USD", "EUR", "GBP", "JPY", "CAD"]},
        "discount_percent": {"type": "integer", "minimum": 0, "maximum": 90},
        "in_stock": {"type": "boolean"},
        "stock_quantity": {"type": "integer", "minimum": 0},
        "warehouse_code": {"type": "string", "pattern": "^WH-[A-Z]{2}[0-9]{2}$", "examples": ["WH-CA01"]},
        "weight_kg": {"type": "number", "minimum": 0},
        "length_cm": {"type": "number", "minimum": 0},
        "width_cm": {"type": "number", "minimum": 0},
        "height_cm": {"type": "number", "minimum": 0},
        "color": {"type": "string", "maxLength": 20},
        "size": {"type": "string", "enum": ["XS", "S", "M", "L", "XL", "XXL", "one-size"]},
        "material": {"type": "string", "maxLength": 30},
        "rating_average": {"type": "number", "minimum": 0, "maximum": 5},
        "rating_count": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 8},
        "image_urls": {"type": "array", "items": {"type": "string", "pattern": "^https://[a-z0-9./_-]+$",
                                                  "examples": ["https://cdn.example.com/p/1.jpg"]},
                       "minItems": 1, "maxItems": 4},
        "release_date": {"type": "string", "format": "date"},
        "last_updated": {"type": "string", "format": "date-time"},
        "is_featured": {"type": "boolean"},
        "is_discontinued": {"type": "boolean"},
        "age_restricted": {"type": "boolean"},
        "warranty_months": {"type": "integer", "minimum": 0, "maximum": 120},
        "return_policy": {"type": "string", "enum": ["no_returns", "thirty_days", "ninety_days", "lifetime"]},
        "shipping_class": {"type": "string", "enum": ["standard", "oversized", "hazmat", "digital"]},
        "supplier": _obj({"name": {"type": "string", "maxLength": 60}, "country": _COUNTRY,
                          "contact_email": {"type": "string", "format": "email"}}),
        "variants": {"type": "array", "maxItems": 4, "items": _obj({
            "variant_sku": _SKU, "color": {"type": "string", "maxLength": 20},
            "price_delta": {"type": "number", "minimum": -1000, "maximum": 1000}}, closed=True)},
        "barcode_ean13": {"type": "string", "pattern": "^[0-9]{13}$", "examples": ["4006381333931"]},
        "tax_code": {"type": ["string", "null"], "maxLength": 12},
        "min_order_quantity": {"type": "integer", "minimum": 1, "maximum": 1000},
        "energy_rating": {"anyOf": [{"type": "string", "enum": ["A", "B", "C", "D", "E", "F", "G"]},
                                    {"type": "null"}]},
        "notes": {"type": "string", "maxLength": 200},
        "internal_score": {"type": "number", "exclusiveMinimum": -1, "exclusiveMaximum": 1},
    }
    optional = {"subcategory", "color", "material", "notes", "tax_code", "energy_rating", "variants"}
    return _obj(props, required=[k for k in props if k not in optional], closed=True)


def _user_profile() -> dict:
    return _obj({
        "user_id": {"type": "string", "format": "uuid"},
        "username": {"type": "string", "pattern": "^[a-z][a-z0-9_]{2,15}$", "examples": ["ada_lovelace"]},
        "display_name": {"type": "string", "minLength": 1, "maxLength": 50},
        "email": {"type": "string", "format": "email"},
        "email_verified": {"type": "boolean"},
        "phone": {"type": ["string", "null"], "pattern": "^\\+[0-9]{7,15}$", "examples": ["+442071838750"]},
        "birth_date": {"type": "string", "format": "date"},
        "signup_at": {"type": "string", "format": "date-time"},
        "last_login_at": {"type": "string", "format": "date-time"},
        "locale": {"type": "string", "enum": ["en-US", "en-GB", "fr-FR", "de-DE", "es-ES", "ja-JP", "pt-BR"]},
        "timezone": {"type": "string", "maxLength": 40},
        "role": {"type": "string", "enum": ["viewer", "editor", "admin", "owner"]},
        "plan": {"type": "string", "enum": ["free", "pro", "team", "enterprise"]},
        "seats": {"type": "integer", "minimum": 1, "maximum": 10000},
        "storage_quota_gb": {"type": "number", "minimum": 0, "maximum": 100000},
        "storage_used_gb": {"type": "number", "minimum": 0},
        "two_factor_enabled": {"type": "boolean"},
        "marketing_opt_in": {"type": "boolean"},
        "home_address": _ADDRESS,
        "work_address": {"anyOf": [_ADDRESS, {"type": "null"}]},
        "preferences": _obj({
            "theme": {"type": "string", "enum": ["light", "dark", "system"]},
            "font_size": {"type": "integer", "minimum": 8, "maximum": 32},
            "notifications": _obj({"email": {"type": "boolean"}, "push": {"type": "boolean"},
                                   "sms": {"type": "boolean"}}, closed=True),
            "start_page": {"type": "string", "enum": ["dashboard", "inbox", "projects"]},
        }, closed=True),
        "interests": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 6},
        "skills": {"type": "array", "maxItems": 5, "items": _obj({
            "name": {"type": "string", "maxLength": 30},
            "level": {"type": "integer", "minimum": 1, "maximum": 5}}, closed=True)},
        "linked_accounts": {"type": "array", "maxItems": 3, "items": _obj({
            "provider": {"type": "string", "enum": ["github", "google", "gitlab", "microsoft"]},
            "account_id": {"type": "string", "maxLength": 40}}, closed=True)},
        "bio": {"type": "string", "maxLength": 280},
        "website": {"type": ["string", "null"], "maxLength": 100},
        "followers": {"type": "integer", "minimum": 0},
        "following": {"type": "integer", "minimum": 0},
        "karma": {"type": "integer", "minimum": -1000, "maximum": 1000000},
        "account_status": {"type": "string", "enum": ["active", "suspended", "deactivated"]},
        "api_version": {"const": "2026-01"},
        "referral_code": {"type": "string", "pattern": "^[A-Z0-9]{8}$", "examples": ["Q7X2M9KD"]},
    }, required=None, closed=True)


def _service_config() -> dict:
    props = {"config_version": {"const": 4}, "service_name": {"type": "string", "pattern": "^[a-z][a-z0-9-]{2,30}$",
                                                              "examples": ["search-gateway"]}}
    for i, name in enumerate(("http", "grpc", "metrics", "admin")):
        props[f"{name}_port"] = {"type": "integer", "minimum": 1024, "maximum": 65535}
        props[f"{name}_enabled"] = {"type": "boolean"}
    for name in ("read_timeout_ms", "write_timeout_ms", "idle_timeout_ms", "shutdown_grace_ms"):
        props[name] = {"type": "integer", "minimum": 0, "maximum": 600000}
    props.update({
        "log_level": {"type": "string", "enum": ["trace", "debug", "info", "warn", "error"]},
        "log_format": {"type": "string", "enum": ["json", "text", "logfmt"]},
        "environment": {"type": "string", "enum": ["development", "staging", "production"]},
        "region": {"type": "string", "enum": ["us-east-1", "us-west-2", "eu-west-1", "ap-south-1"]},
        "replicas": {"type": "integer", "minimum": 1, "maximum": 64},
        "cpu_limit": {"type": "number", "exclusiveMinimum": 0, "maximum": 64},
        "memory_limit_mb": {"type": "integer", "minimum": 64, "maximum": 262144},
        "max_connections": {"type": "integer", "minimum": 1, "maximum": 100000},
        "rate_limit_rps": {"type": "number", "minimum": 0},
        "cache_ttl_s": {"type": "integer", "minimum": 0, "maximum": 86400},
        "cache_backend": {"type": "string", "enum": ["memory", "redis", "memcached", "none"]},
        "database_url": {"type": "string", "pattern": "^postgres://[a-z0-9@:./_-]+$",
                         "examples": ["postgres://app@db.internal:5432/main"]},
        "database_pool_size": {"type": "integer", "minimum": 1, "maximum": 200},
        "tls": _obj({"enabled": {"type": "boolean"}, "min_version": {"type": "string", "enum": ["1.2", "1.3"]},
                     "cert_path": {"type": "string", "maxLength": 120}}, closed=True),
        "feature_flags": _obj({f"flag_{n}": {"type": "boolean"} for n in
                               ("new_ranker", "dark_launch", "shadow_traffic", "strict_mode")}, closed=True),
        "allowed_origins": {"type": "array", "items": {"type": "string", "maxLength": 60}, "maxItems": 4},
        "owners": {"type": "array", "items": {"type": "string", "format": "email"}, "minItems": 1, "maxItems": 3},
        "deployed_at": {"type": "string", "format": "date-time"},
        "maintenance_window": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]-[0-2][0-9]:[0-5][0-9]$",
                               "examples": ["02:00-04:00"]},
        "retry_policy": _obj({"max_attempts": {"type": "integer", "minimum": 0, "maximum": 10},
                              "backoff": {"type": "string", "enum": ["constant", "linear", "exponential"]},
                              "base_delay_ms": {"type": "integer", "minimum": 1, "maximum": 60000}}, closed=True),
        "health_check_path": {"type": "string", "pattern": "^/[a-z/]*$", "examples": ["/healthz"]},
        "sampling_ratio": {"type": "number", "minimum": 0, "maximum": 1},
        "debug_token": {"type": ["string", "null"], "maxLength": 32},
    })
    optional = {"debug_token", "allowed_origins", "maintenance_window", "rate_limit_rps"}
    return _obj(props, required=[k for k in props if k not in optional], closed=True)


def _form_with_defs() -> dict:
    defs = {
        "money": _obj({"amount": {"type": "number", "minimum": 0}, "currency": {"type": "string",
                                                                              "enum": ["USD", "EUR", "GBP"]}},
                      closed=True),
        "address": _ADDRESS,
        "contact": _obj({"name": {"type": "string", "maxLength": 60}, "email": {"type": "string", "format": "email"},
                         "phone": {"type": ["string", "null"], "maxLength": 20}}, required=["name", "email"]),
        "date_range": _obj({"start": {"type": "string", "format": "date"},
                            "end": {"type": "string", "format": "date"}}, closed=True),
    }
    props = {
        "form_id": {"type": "string", "format": "uuid"},
        "form_type": {"const": "insurance_claim"},
        "submitted_at": {"type": "string", "format": "date-time"},
        "claimant": {"$ref": "#/$defs/contact"},
        "claimant_address": {"$ref": "#/$defs/address"},
        "policy_number": {"type": "string", "pattern": "^POL-[0-9]{8}$", "examples": ["POL-20261203"]},
        "policy_period": {"$ref": "#/$defs/date_range"},
        "incident_date": {"type": "string", "format": "date"},
        "incident_type": {"type": "string", "enum": ["collision", "theft", "fire", "flood", "injury", "other"]},
        "incident_description": {"type": "string", "minLength": 10, "maxLength": 500},
        "incident_location": {"$ref": "#/$defs/address"},
        "police_report_filed": {"type": "boolean"},
        "police_report_number": {"type": ["string", "null"], "maxLength": 20},
        "estimated_loss": {"$ref": "#/$defs/money"},
        "deductible": {"$ref": "#/$defs/money"},
        "witnesses": {"type": "array", "items": {"$ref": "#/$defs/contact"}, "maxItems": 3},
        "injured_parties": {"type": "integer", "minimum": 0, "maximum": 50},
        "vehicle_involved": {"type": "boolean"},
        "vehicle_vin": {"type": ["string", "null"], "pattern": "^[A-HJ-NPR-Z0-9]{17}$",
                        "examples": ["1HGCM82633A004352"]},
        "prior_claims_count": {"type": "integer", "minimum": 0, "maximum": 100},
        "preferred_contact_method": {"type": "string", "enum": ["email", "phone", "mail"]},
        "agent": {"anyOf": [{"$ref": "#/$defs/contact"}, {"type": "null"}]},
        "attachments": {"type": "array", "maxItems": 5, "items": _obj({
            "file_name": {"type": "string", "maxLength": 60},
            "mime_type": {"type": "string", "enum": ["image/jpeg", "image/png", "application/pdf"]},
            "size_bytes": {"type": "integer", "minimum": 1}}, closed=True)},
        "payout": {"$ref": "#/$defs/money"},
        "consent_given": {"const": True},
        "signature_name": {"type": "string", "maxLength": 60},
        "signature_date": {"type": "string", "format": "date"},
        "fraud_score": {"type": "number", "minimum": 0, "maximum": 1},
        "reviewer_notes": {"type": "string", "maxLength": 300},
        "status": {"type": "string", "enum": ["received", "in_review", "approved", "denied"]},
    }
    optional = {"reviewer_notes", "agent", "payout"}
    return {"$defs": defs, **_obj(props, required=[k for k in props if k not in optional], closed=True)}


PRODUCT_CATALOG = _product_catalog()
USER_PROFILE = _user_profile()
SERVICE_CONFIG = _service_config()
INSURANCE_CLAIM_FORM = _form_with_defs()

SCHEMAS: tuple[tuple[str, dict], ...] = (
    ("flat_person", FLAT_PERSON),
    ("sentiment", SENTIMENT),
    ("const_header", CONST_HEADER),
    ("nullable", NULLABLE),
    ("numeric_bounds", NUMERIC_BOUNDS),
    ("string_patterns", STRING_PATTERNS),
    ("string_formats", STRING_FORMATS),
    ("string_lengths", STRING_LENGTHS),
    ("tag_lists", TAG_LISTS),
    ("any_of_scalars", ANY_OF_SCALARS),
    ("closed_point", CLOSED_POINT),
    ("boolean_flags", BOOLEAN_FLAGS),
    ("nested_address", NESTED_ADDRESS),
    ("order", ORDER),
    ("defs_refs", DEFS_REFS),
    ("recursive_tree", RECURSIVE_TREE),
    ("shapes_any_of", SHAPES),
    ("tool_call", TOOL_CALL),
    ("event_log", EVENT_LOG),
    ("matrix", MATRIX),
    ("api_response", API_RESPONSE),
    ("long_fixed_parts", LONG_FIXED_PARTS),
    ("product_catalog", PRODUCT_CATALOG),
    ("user_profile", USER_PROFILE),
    ("service_config", SERVICE_CONFIG),
    ("insurance_claim_form", INSURANCE_CLAIM_FORM),
)

SIZES: dict[str, str] = {
    **{name: "small" for name in ("flat_person", "sentiment", "const_header", "nullable", "numeric_bounds",
                                  "string_patterns", "string_formats", "string_lengths", "tag_lists",
                                  "any_of_scalars", "closed_point", "boolean_flags")},
    **{name: "medium" for name in ("nested_address", "order", "defs_refs", "recursive_tree", "shapes_any_of",
                                   "tool_call", "event_log", "matrix", "api_response", "long_fixed_parts")},
    **{name: "large" for name in ("product_catalog", "user_profile", "service_config", "insurance_claim_form")},
}

SCHEMA_BY_NAME: dict[str, dict] = dict(SCHEMAS)


def by_size(size: str) -> list[tuple[str, dict]]:
    """The ``(name, schema)`` pairs of one size tag, in ``SCHEMAS`` order."""
    return [(name, schema) for name, schema in SCHEMAS if SIZES[name] == size]
