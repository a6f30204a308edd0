"""runtime.jsonload parses exactly what json.loads parses and rejects what it rejects."""
from __future__ import annotations

import json

import pytest

from runtime import jsonload

GOOD = ['{"a": [1, 2.5, true, false, null, "x\\u00e9\\n"]}', " [] ", '"s"', '{"a":1}  \n', "1e5", "-0",
        '{"nested": {"deep": [[{}]]}}', '"\\ud83d\\ude00"']
BAD = ['{"ociVersion": "1.0.2",', '{"a":1', '{"a":1}x', "", "[1,]", "{'a':1}", '{"a" 1}', "[1 2]", "nul",
       '{"a": [1,', "\ufeff{}", '"unterminated', "{,}"]


@pytest.mark.parametrize("text", GOOD)
def test_same_as_json(text: str) -> None:
    assert jsonload.loads(text) == json.loads(text)
    assert jsonload.loads(text.encode()) == json.loads(text)


@pytest.mark.parametrize("text", BAD)
def test_rejects_what_json_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError):
        jsonload.loads(text)
