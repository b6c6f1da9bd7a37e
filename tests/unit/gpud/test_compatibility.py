"""The compatibility rule (docs/DESIGN.md, "Compatibility"), enforced on every wire model.

Every model a client, a peer daemon, a rank or a part runner sends, and every model a
daemon answers or publishes, is read leniently: a field added by a later version is
ignored, and each optional field an earlier version did not send takes its default. The
models are found, not listed (tests/support/wire_examples.py), so a new one is held to the
rule from the day it is added. Kinds a reader does not know are skipped and counted.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from gpud.model.snapshot import NodeEvent
from gpud.wire import envelope, node_messages, protocol, run_messages
from gpud.wire.node_messages import NodeEventsReply
from gpud.wire.protocol import UnknownKind, decode_event, encode_event, node_event_topic
from tests.support.wire_examples import STRICT, example, roots, wire_models

MODELS = wire_models()
LENIENT = [m for m in MODELS if m not in STRICT]
STRICT_MODELS: list[type[BaseModel]] = sorted(STRICT, key=lambda m: m.__name__)
LATER_FIELD = "a_field_of_a_later_version"


def model_name(model: type[BaseModel]) -> str:
    return model.__name__


def optional_fields(model: type[BaseModel]) -> list[str]:
    return [name for name, field in model.model_fields.items() if not field.is_required()]


def test_every_model_the_protocol_modules_define_is_walked() -> None:
    defined = {
        value
        for module in (protocol, envelope, node_messages, run_messages)
        for value in vars(module).values()
        if inspect.isclass(value)
        and issubclass(value, BaseModel)
        and value.__module__ == module.__name__
        and value not in (envelope.Message,)
    }
    assert defined - set(MODELS) == set()
    assert len(roots()) > 50 and len(MODELS) > 80  # requests, replies, events, messages


@pytest.mark.parametrize("model", MODELS, ids=model_name)
def test_a_model_round_trips_through_json(model: type[BaseModel]) -> None:
    sent = model.model_validate(example(model))
    assert model.model_validate_json(sent.model_dump_json()) == sent


@pytest.mark.parametrize("model", LENIENT, ids=model_name)
def test_a_field_a_later_version_added_is_ignored(model: type[BaseModel]) -> None:
    data = example(model)
    read = model.model_validate_json(json.dumps({**data, LATER_FIELD: {"x": [1, 2]}}))
    assert read == model.model_validate(data)
    assert LATER_FIELD not in read.model_dump()


@pytest.mark.parametrize(
    ("model", "name"),
    [(m, name) for m in LENIENT for name in optional_fields(m)],
    ids=lambda x: x.__name__ if isinstance(x, type) else str(x),
)
def test_an_optional_field_an_earlier_version_did_not_send_takes_its_default(
    model: type[BaseModel], name: str
) -> None:
    data = example(model)
    del data[name]
    read = model.model_validate_json(json.dumps(data))
    expected = model.model_fields[name].get_default(call_default_factory=True)
    assert getattr(read, name) == expected


@pytest.mark.parametrize("model", STRICT_MODELS, ids=model_name)
def test_what_a_person_writes_stays_strict(model: type[BaseModel]) -> None:
    with pytest.raises(ValidationError, match=LATER_FIELD):
        model.model_validate({**example(model), LATER_FIELD: 1})


def node_event(kind: str) -> dict[str, Any]:
    return {"node": "n", "time": 1.0, "kind": kind, "severity": "critical", "message": "m"}


def test_a_node_event_of_an_unknown_kind_is_skipped_and_counted_not_its_whole_reply() -> None:
    reply = NodeEventsReply.model_validate_json(
        json.dumps({"events": [node_event("xid"), node_event("fabric_melt"), node_event("drain")]})
    )
    assert [e.kind for e in reply.events] == ["xid", "drain"]
    assert reply.skipped == 1


def test_a_published_node_event_of_an_unknown_kind_is_told_apart_from_garbage() -> None:
    topic = node_event_topic("n")
    frames = encode_event(topic, 1, NodeEvent.model_validate(node_event("xid")))
    assert isinstance(decode_event(frames).body, NodeEvent)
    later = json.loads(frames[1])
    later["body"]["kind"] = "fabric_melt"
    with pytest.raises(UnknownKind):
        decode_event([frames[0], json.dumps(later).encode()])
