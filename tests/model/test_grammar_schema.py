"""JSON schemas as llama.cpp reads them (common/json-schema.cpp), checked on the grammar
the compiler builds from ckptd's canonical form."""

from __future__ import annotations

import pytest
import xgrammar as xgr
from xgrammar.testing import _is_grammar_accept_string

from ckptd.model.sampling.grammar import schema_constraint


def _accepts(schema: dict, text: str) -> bool:
    c = schema_constraint(schema)
    return _is_grammar_accept_string(xgr.Grammar.from_json_schema(c.source,
                                                                  any_whitespace=False), text)


@pytest.mark.parametrize("schema,text,ok", [
    ({"type": "object"}, '{"a": 1}', True),              # no properties named: any object
    ({"type": "object"}, "{}", True),
    ({"type": "object"}, "[1]", False),
    ({"type": "object", "properties": {"n": {"type": "integer"}}}, '{"a": 1}', False),
    ({"type": "object", "properties": {"n": {"type": "integer"}}}, '{"n": 1}', True),
    ({"type": "object", "additionalProperties": False}, '{"a": 1}', False),
    ({"items": [{"type": "integer"}]}, "[-3000]", True),   # draft-7 tuples
])
def test_objects_and_tuples_read_as_llama_cpp_does(schema, text, ok):
    assert _accepts(schema, text) is ok
