"""Every wire model, and a valid example of each built from its JSON schema.

The compatibility test (tests/unit/gpud/test_compatibility.py) walks these: what a client,
a peer daemon, a rank or a part runner may send, and everything a daemon answers or
publishes. The list is derived (methods, event topics, trainer messages, attach lines, and
every model nested in them), so a model added to any of those is walked without being named
here. An example sets every field, optional ones included, to a valid value other than its
default where the schema allows it.
"""

from __future__ import annotations

from typing import Any, get_args

from pydantic import BaseModel

from gpud.attach import wire
from gpud.model.run import HealthSummary, RunEvent
from gpud.model.snapshot import NodeEvent, NodeSnapshot
from gpud.model.trainer_messages import TRAINER_MESSAGES
from gpud.notify.targets import Webhook
from gpud.wire.brief import NodeBrief
from gpud.wire.envelope import ErrorInfo, Event, Reply, Request
from gpud.wire.protocol import METHODS, RunLogEvent, RunMetricsEvent
from gpud.wire.run_messages import RUN_ID_PATTERN, RunSummary

#: A value for each field pattern the wire models use; a new pattern must be added here.
PATTERNS = {
    RUN_ID_PATTERN: "run-3f9a2c",
    wire.TOKEN_PATTERN: "0123456789abcdef" * 2,
    wire.POD_UID_PATTERN: "1f0c2d3e-4a5b-6c7d-8e9f-0a1b2c3d4e5f",
    wire.JOB_ID_PATTERN: "4242",
}

#: Examples of models whose validators need more than their schema says.
OVERRIDES: dict[str, dict[str, Any]] = {
    Webhook.__name__: {"url": "https://hooks.example.com/gpud", "format": "slack"},
}

#: Models that stay strict on purpose: what a person writes (a `notify:` webhook, the
#: same model in gpud.yaml and in a run spec), refused naming the field it does not know.
STRICT: frozenset[type[BaseModel]] = frozenset({Webhook})


def roots() -> list[type[BaseModel]]:
    """The models that travel on their own: request and reply bodies, envelopes, event
    bodies, trainer messages and attach lines."""
    found: list[type[BaseModel]] = [Request, Reply, ErrorInfo, Event]
    for method in METHODS.values():
        found += [method.request, method.reply]
    found += [NodeSnapshot, NodeBrief, NodeEvent, RunSummary, RunLogEvent, RunMetricsEvent]
    found += [RunEvent, HealthSummary]
    found += list(TRAINER_MESSAGES.values())
    found += [wire.AttachRequest, wire.AttachReply, *get_args(get_args(wire.Update)[0])]
    return list(dict.fromkeys(found))


def wire_models() -> list[type[BaseModel]]:
    """`roots()` and every model nested in their fields, each once."""
    seen: dict[type[BaseModel], None] = {}
    todo = roots()
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen[model] = None
        for field in model.model_fields.values():
            todo += [m for m in _models_in(field.annotation) if m not in seen]
    return list(seen)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def example(model: type[BaseModel]) -> dict[str, Any]:
    """A valid JSON object of `model` with every field set."""
    if model.__name__ in OVERRIDES:
        return dict(OVERRIDES[model.__name__])
    schema = model.model_json_schema(mode="validation")
    value = _value(schema, schema.get("$defs", {}))
    assert isinstance(value, dict)
    return value


def _value(schema: dict[str, Any], defs: dict[str, Any]) -> Any:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return dict(OVERRIDES[name]) if name in OVERRIDES else _value(defs[name], defs)
    if "allOf" in schema:
        return _value(schema["allOf"][0], defs)
    if "anyOf" in schema:
        options = [o for o in schema["anyOf"] if o.get("type") != "null"]
        return _value(options[0], defs) if options else None
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][-1]
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties")
        if props is None:
            return {}
        return {name: _value(sub, defs) for name, sub in props.items()}
    if kind == "array":
        if schema.get("maxItems") == 0:
            return []
        return [_value(schema.get("items", {}), defs)] * max(1, schema.get("minItems", 1))
    if kind == "string":
        if "pattern" in schema:
            return PATTERNS[schema["pattern"]]
        return "x" * max(3, schema.get("minLength", 0))
    if kind == "boolean":
        return True
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0) + 1)
        high = schema.get("maximum", schema.get("exclusiveMaximum", low + 10) - 1)
        number = min(max(low, 2), high)
        return int(number) if kind == "integer" else float(number) + 0.5 * (number < high)
    return 1  # Any
