"""The error tables: one generic meaning per code, overridden by an API's own, variants folded
into their code."""

from __future__ import annotations

from apps.core.openapi import BODY, COMMON, GENERIC, ErrorSerializer, error_table


def test_a_table_answers_the_generic_meaning_unless_the_api_names_its_own():
    # given
    errors = error_table({404: "No such thing in this tenant.", 429: "Slow down."})

    # when
    answered = errors(*BODY, 404, *COMMON)

    # then
    assert sorted(answered) == [400, 401, 404, 413, 415, 429]
    assert answered[404].description == "No such thing in this tenant."
    assert answered[429].description == "Slow down."
    assert answered[401].description == GENERIC[401]
    assert all(r.response is ErrorSerializer for r in answered.values())


def test_a_variant_documents_its_code_with_its_own_meaning():
    errors = error_table({409: "Any conflict.", "409-confirm": "Confirmed already."})

    answered = errors(401, "409-confirm")

    assert sorted(answered) == [401, 409]
    assert answered[409].description == "Confirmed already."
