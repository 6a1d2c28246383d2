"""What an article copied on its own (or still to copy) does to a batch's delivery: the skips
and the stop of :func:`dist_subscription_articles.delivery_limits`, and the articles held."""

from __future__ import annotations

from airflow_repl.engine.postgres.lsn import lsn_to_int
from airflow_repl.engine.state.dist_subscription_articles import HeldArticle, delivery_limits, held_names

W = "0/1000"


def test_articles_copied_with_the_snapshot_limit_nothing():
    held = [HeldArticle("items", "active", None), HeldArticle("stores", "active", None)]
    limits = delivery_limits(held, W, {"items", "stores"})
    assert limits.none and limits.skip == {} and limits.stop is None


def test_an_article_not_copied_yet_is_skipped_altogether_and_stops_nothing():
    held = [HeldArticle("items", "active", None), HeldArticle("stores", None, None)]
    limits = delivery_limits(held, W, {"items"})
    assert limits.skip == {"stores": None} and limits.stop is None


def test_a_copy_exporting_its_snapshot_stops_delivery_where_it_is():
    limits = delivery_limits([HeldArticle("stores", "copying", None)], W, {"stores"})
    assert limits.skip == {"stores": None} and limits.stop == lsn_to_int(W)


def test_a_copy_under_way_skips_up_to_its_handoff_and_stops_there():
    limits = delivery_limits([HeldArticle("stores", "copying", "0/2000")], W, {"stores"})
    assert limits.skip == {"stores": lsn_to_int("0/2000")} and limits.stop == lsn_to_int("0/2000")


def test_a_done_copy_skips_up_to_its_handoff_then_nothing():
    held = [HeldArticle("stores", "active", "0/2000")]
    limits = delivery_limits(held, W, {"stores"})
    assert limits.skip == {"stores": lsn_to_int("0/2000")} and limits.stop is None
    assert delivery_limits(held, "0/2000", {"stores"}).none  # the watermark passed it


def test_a_copy_done_since_the_run_started_stops_that_run_at_its_handoff():
    held = [HeldArticle("stores", "active", "0/2000")]
    assert delivery_limits(held, W, {"items"}).stop == lsn_to_int("0/2000")
    assert delivery_limits(held, "0/2000", {"items"}).stop == lsn_to_int("0/2000")  # and ends there


def test_the_earliest_stop_wins():
    held = [HeldArticle("a", "copying", "0/3000"), HeldArticle("b", "copying", "0/2000")]
    assert delivery_limits(held, W, {"a", "b"}).stop == lsn_to_int("0/2000")


def test_held_names_by_status():
    held = [HeldArticle("a", "active", None), HeldArticle("b", "copying", "0/1"), HeldArticle("c", None, None)]
    assert held_names(held, "active") == {"a"} and held_names(held, "active", "copying") == {"a", "b"}
