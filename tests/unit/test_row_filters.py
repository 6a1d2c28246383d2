"""Row-filter predicates checked before they reach any SQL text
(:func:`airflow_repl.engine.model.row_filters.check_predicate`): what is accepted, stripped, and
what is refused with which reason.  PostgreSQL validates the accepted text itself when the
publication is created (``tests/integration/test_propagation.py``)."""

from __future__ import annotations

import pytest

from airflow_repl.engine.errors import TopologyError
from airflow_repl.engine.model.row_filters import check_predicate


@pytest.mark.parametrize(
    "predicate",
    [
        "id > 1",
        "city = 'Dallas' AND (state = 'TX' OR (zip IS NULL))",
        "note = 'it''s; -- not a comment, nor /* this */ ('",  # everything inside a literal
        '"odd;col" = 1 AND "a""b(" <> 2',  # and inside quoted identifiers, doubled quotes included
        "note = E'\\'; ('",  # an escape string: \' does not end it
        "note = e'\\\\' AND x = 1",  # ... and \\ is one backslash, the next ' ends it
        "note = $$ ; -- ) $$",  # a dollar-quoted string
        "note <> $tag$ $$ ; ) $tag$",  # with a tag; $$ inside it is text
        "a$b = 1 AND c$$ = 2",  # '$' inside an identifier opens nothing
        "x - - 1 > 0 AND y / 2 > 1",  # '-' and '/' alone are operators
        "price::numeric(10, 2) > 9.99",
    ],
)
def test_accepted_predicates_come_back_stripped(predicate):
    assert check_predicate(f"  {predicate}\n", article="a") == predicate


@pytest.mark.parametrize(
    "predicate, why",
    [
        ("a = 1;", "';' is not allowed"),
        ("a = 1; DROP TABLE t", "';' is not allowed"),
        ("note = 'a\\' ; x = 'b'", "';' is not allowed"),  # standard strings: \ is a character, ' ends it
        ("a = 1 -- and then", "comments are not allowed"),
        ("a /* hidden */ = 1", "comments are not allowed"),
        ("(a = 1", "unbalanced parentheses"),
        ("a = 1)", "unbalanced parentheses"),
        ("true) , TABLE other WHERE (true", "unbalanced parentheses"),
        (") OR (", "unbalanced parentheses"),
        ("note = 'open", "an unterminated quoted string or identifier"),
        ('"open = 1', "an unterminated quoted string or identifier"),
        ("note = E'\\'", "an unterminated quoted string or identifier"),  # \' is escaped: nothing closes it
        ("note = $$open", "an unterminated dollar-quoted string"),
        ("note = $a$ text $b$", "an unterminated dollar-quoted string"),
        ("a = 1\x00", "it contains a NUL character"),
        # '$' inside identifiers must not open a dollar quote that hides a ';'
        ("EXISTS (SELECT 1 AS a$$t$) ; DROP TABLE t ; SELECT (SELECT 1 AS b$$t$)", "';' is not allowed"),
    ],
)
def test_refused_predicates_name_the_reason_and_the_article(predicate, why):
    with pytest.raises(TopologyError) as err:
        check_predicate(predicate, article="orders")
    assert str(err.value) == f"row_filter of article 'orders' is not a valid predicate: {why}: {predicate.strip()!r}"


@pytest.mark.parametrize("predicate", ["", "   ", "\n\t", None, 1, ["a = 1"]])
def test_a_predicate_must_be_non_empty_text(predicate):
    with pytest.raises(TopologyError) as err:
        check_predicate(predicate, article="orders")  # type: ignore[arg-type]
    assert str(err.value) == "row_filter of article 'orders' must be a non-empty SQL predicate"
