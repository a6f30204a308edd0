"""runtime.state's pure pieces: container id rules (runc's) and the JSON writer (same text as json.dumps)."""
from __future__ import annotations

import json

import pytest

from runtime import state
from runtime.errors import InvalidContainerId


@pytest.mark.parametrize("cid", ["abc", "a.b-c_d+e", "x" * 1024, "0"])
def test_valid_ids(cid: str) -> None:
    state.validate_id(cid)


@pytest.mark.parametrize("cid", ["", ".", "..", "a/b", "/abs", "a b", "x" * 1025, "é", "a\0b"])
def test_invalid_ids(cid: str) -> None:
    with pytest.raises(InvalidContainerId):
        state.validate_id(cid)


@pytest.mark.parametrize("value", [
    {"a": 1, "b": [True, False, None], "c": "q\"uo\\te\n\t\x01é"}, [], {}, [{"x": {"y": [1, 2]}}], -5, 1.5, "",
])
def test_json_writer_matches_json(value: object) -> None:
    assert json.loads(state.dumps_json(value)) == value
    assert json.loads(state.dumps_json(value, indent=2)) == value
    assert state.dumps_json(value, indent=2) == json.dumps(value, indent=2, ensure_ascii=False)
