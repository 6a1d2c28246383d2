"""The queued-updating conflict rules (:mod:`airflow_repl.engine.subscriber.conflicts`) without a
server: classification from row versions, the policy's decision, and what subscriber wins does."""

from __future__ import annotations

import pytest

from airflow_repl.engine.model.updating import ConflictPolicy
from airflow_repl.engine.subscriber.conflicts import (
    Action,
    ConflictKind,
    Convergence,
    DeliveryConflict,
    Met,
    PublisherRow,
    Resolution,
    action,
    classify,
    converge,
    decide,
    delivery_conflict,
    names_new_row,
    stops_at_first,
)

V0, V1 = "00000000-0000-0000-0000-000000000000", "11111111-1111-1111-1111-111111111111"
SAME, CHANGED, GONE = PublisherRow(True, V0), PublisherRow(True, V1), PublisherRow(False)


@pytest.mark.parametrize(
    ("op", "at_old_key", "new_key_taken", "expected"),
    [
        ("I", GONE, False, None),
        ("I", GONE, True, ConflictKind.INSERT_INSERT),
        ("U", SAME, False, None),
        ("U", CHANGED, False, ConflictKind.UPDATE_UPDATE),
        ("U", GONE, False, ConflictKind.UPDATE_DELETE),
        ("U", SAME, True, ConflictKind.INSERT_INSERT),  # a key update onto a key the publisher has
        ("U", CHANGED, True, ConflictKind.UPDATE_UPDATE),  # the version conflict is named first
        ("D", SAME, False, None),
        ("D", CHANGED, False, ConflictKind.DELETE_UPDATE),
        ("D", GONE, False, ConflictKind.ROW_MISSING),
    ],
)
def test_classify_from_row_versions_and_existence(op, at_old_key, new_key_taken, expected):
    assert classify(op, V0, at_old_key, new_key_taken) is expected


def test_classify_refuses_an_unknown_operation():
    with pytest.raises(ValueError, match="unknown queued operation 'T'"):
        classify("T", None, GONE, False)


def test_tables_without_row_versions_conflict_only_on_existence():
    assert classify("U", None, PublisherRow(True, None), False) is None
    assert classify("U", None, GONE, False) is ConflictKind.UPDATE_DELETE


def test_no_conflict_applies_under_every_policy():
    assert {decide(policy, []) for policy in ConflictPolicy} == {Resolution.APPLIED}


@pytest.mark.parametrize(
    ("policy", "met", "expected"),
    [
        (ConflictPolicy.PUB_WINS, [Met(ConflictKind.UPDATE_UPDATE)], Resolution.PUBLISHER_WINS),
        (ConflictPolicy.PUB_WINS, [Met(ConflictKind.UPDATE_UPDATE, key_changed=True)], Resolution.PUBLISHER_WINS),
        (ConflictPolicy.SUB_WINS, [Met(ConflictKind.DELETE_UPDATE)], Resolution.SUBSCRIBER_WINS),
        (
            ConflictPolicy.SUB_WINS,
            [Met(ConflictKind.UPDATE_UPDATE), Met(ConflictKind.UPDATE_DELETE, key_changed=True)],
            Resolution.KEY_UPDATE_NOT_SUPPORTED,
        ),
        (ConflictPolicy.SUB_REINIT, [Met(ConflictKind.INSERT_INSERT)], Resolution.REINITIALIZE),
    ],
)
def test_decide_by_policy(policy, met, expected):
    assert decide(policy, met) is expected


def test_what_each_resolution_means():
    kept = {r for r in Resolution if r.applied}
    assert kept == {Resolution.APPLIED, Resolution.SUBSCRIBER_WINS}
    assert {r for r in Resolution if r.compensates} == {
        Resolution.PUBLISHER_WINS,
        Resolution.KEY_UPDATE_NOT_SUPPORTED,
        Resolution.REFUSED,
    }
    assert {r for r in Resolution if r.returns_to_origin} == {Resolution.SUBSCRIBER_WINS}
    assert "not support primary-key updates" in Resolution.KEY_UPDATE_NOT_SUPPORTED.value


def test_only_sub_wins_looks_past_the_first_conflict():
    assert [stops_at_first(p) for p in ConflictPolicy] == [True, False, True]


@pytest.mark.parametrize(
    ("op", "kind", "expected"),
    [
        ("I", None, Action.INSERT),
        ("I", ConflictKind.INSERT_INSERT, Action.OVERWRITE),
        ("U", None, Action.UPDATE),
        ("U", ConflictKind.UPDATE_UPDATE, Action.UPDATE),
        ("U", ConflictKind.UPDATE_DELETE, Action.INSERT),
        ("D", None, Action.DELETE),
        ("D", ConflictKind.DELETE_UPDATE, Action.DELETE),
        ("D", ConflictKind.ROW_MISSING, Action.NOTHING),
    ],
)
def test_subscriber_wins_actions(op, kind, expected):
    assert action(op, kind) is expected


@pytest.mark.parametrize(
    ("kind", "op", "expected"),
    [
        (ConflictKind.INSERT_INSERT, "I", True),
        (ConflictKind.INSERT_INSERT, "U", True),  # a row moved to a key the publisher has
        (ConflictKind.CONSTRAINT, "I", True),  # an insert has no old image: its key is the new one's
        (ConflictKind.CONSTRAINT, "U", True),  # the row the publisher refused, as the subscriber has it
        (ConflictKind.CONSTRAINT, "D", False),
        (ConflictKind.UPDATE_UPDATE, "U", False),
        (ConflictKind.UPDATE_DELETE, "U", False),
        (ConflictKind.DELETE_UPDATE, "D", False),
        (ConflictKind.ROW_MISSING, "D", False),
    ],
)
def test_a_conflict_names_the_row_by_the_image_that_has_it(kind, op, expected):
    assert names_new_row(kind, op) is expected


def test_queue_origin_names_fit_and_differ():
    from airflow_repl.engine.model import naming

    a, b = naming.queue_origin("sub1"), naming.queue_origin("x" * 500)
    assert a.startswith("airflow_repl_q_") and len(b.encode()) <= 63 and a != naming.queue_origin("sub2")


# ---------------------------------------------------------------------- delivery to a queued subscriber
@pytest.mark.parametrize(
    ("op", "sqlstate", "expected"),
    [
        ("U", "RP598", DeliveryConflict.UPDATE_MISSING),
        ("D", "RP598", DeliveryConflict.DELETE_MISSING),
        ("I", "23505", DeliveryConflict.DUPLICATE_KEY),
        ("U", "23505", DeliveryConflict.DUPLICATE_KEY),
        ("I", "RP598", None),  # not a delivery conflict: handled as at any subscriber
        ("D", "23505", None),
        ("U", "23502", None),  # a NOT NULL violation
        ("U", None, None),
    ],
)
def test_delivery_conflict_names_the_failures_that_converge(op, sqlstate, expected):
    assert delivery_conflict(op, sqlstate) is expected


def test_a_queued_row_is_kept_a_missing_delete_does_nothing_and_the_rest_take_the_publishers_row():
    assert converge(DeliveryConflict.QUEUED_ROW) is Convergence.KEPT
    assert converge(DeliveryConflict.TAKEN_ROW) is Convergence.KEPT
    assert converge(DeliveryConflict.DELETE_MISSING) is Convergence.NOTHING
    assert converge(DeliveryConflict.UPDATE_MISSING) is Convergence.PUBLISHERS_ROW
    assert converge(DeliveryConflict.DUPLICATE_KEY) is Convergence.PUBLISHERS_ROW


def test_a_command_older_than_the_subscribers_immediate_change_is_not_applied():
    assert converge(DeliveryConflict.IMMEDIATE_ROW) is Convergence.SUPERSEDED
    assert Convergence.SUPERSEDED.value.startswith("not applied")
