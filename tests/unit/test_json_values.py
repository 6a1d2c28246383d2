"""JSON values keep their JSON type through Python: a numeric read as Decimal is written back
as the same number, never a float or a string."""

from __future__ import annotations

from decimal import Decimal

import pytest

from airflow_repl.engine.postgres import json_values


@pytest.mark.parametrize(
    "text",
    [
        '{"id":7,"price":12.50,"big":123456789012345678901234567890.123456789,"tiny":1E-7}',
        '[1,-0.0,2.5E+10,"12.50",null,true,{"a":[0.1]}]',
        '{"quote \\" and \\\\":"line\\nbreak","é":"ü"}',
    ],
)
def test_exact_json_round_trips_to_the_same_text(text):
    value = json_values.loads(text)
    assert json_values.dumps(value).replace("\\u00e9", "é").replace("\\u00fc", "ü") == text
    assert json_values.loads(json_values.dumps(value)) == value


def test_decimals_are_numbers_and_other_values_as_json_writes_them():
    assert json_values.dumps({"p": Decimal("12.50"), "n": 3, "s": "12.50"}) == '{"p":12.50,"n":3,"s":"12.50"}'
    assert json_values.dumps([Decimal("NaN"), None]) == '["NaN",null]'  # not a JSON number
