"""Notifications, their pure parts: a notice is an event the publish rules
take, its id is its subject, what each kind tells, and its tenant."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from hooklane import store
from hooklane.errors import InvalidInput
from hooklane.publish import check_event
from hooklane.settings import Settings
from hooklane.worker import notifications
from hooklane.worker.notifications import notice_event, notice_id
from testsupport.notifications import OPS


def _notice(kind: str, **fields: object) -> store.Notice:
    at = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
    values: dict[str, object] = {
        "kind": kind,
        "endpoint_id": 42,
        "namespace": "shop",
        "name": "orders-acme",
        "tenant": "acme",
        "subject": at,
        "transitions": 1,
        "last_notified_at": None,
        "consecutive_failures": 20,
        "failing_since": at,
        "paused_until": at + timedelta(minutes=1),
        "last_error": "HTTP 503",
        "deactivated_at": None,
        "deactivated_reason": None,
        "dead": 0,
        "counted_since": None,
        "counted_until": None,
        "last_dead_at": None,
        "dead_error": None,
        "dead_status": None,
        "dead_failure": None,
        "noticed_at": at + timedelta(seconds=3),
    }
    return store.Notice(**(values | fields))


@pytest.mark.parametrize("kind", store.NOTICE_KINDS)
def test_a_notice_is_an_event_the_publish_rules_take(kind):
    notice = _notice(kind)
    event = notice_event("ops", notice)
    assert event.id == f"hooklane.endpoint.{kind}.42.1772366400123456"
    assert (event.tenant, event.type) == ("ops", f"hooklane.endpoint.{kind}")
    assert event.coalesce_key is None and event.traceparent is None
    data = json.loads(event.data_json)
    check_event(tenant=event.tenant, type=event.type, data=data, id=event.id)
    assert data["endpoint"] == {"namespace": "shop", "name": "orders-acme"}


def test_a_notice_id_is_its_subject_whoever_takes_it():
    one = _notice("paused")
    assert notice_id(one) == notice_id(replace(one, consecutive_failures=99, noticed_at=datetime.now(UTC)))
    assert notice_id(one) != notice_id(replace(one, subject=one.subject + timedelta(microseconds=1)))
    assert notice_id(one) != notice_id(replace(one, endpoint_id=43))


def test_what_each_kind_tells():
    at = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    dead = _notice(
        "deliveries_dead",
        dead=7,
        counted_since=at,
        counted_until=at + timedelta(hours=1),
        last_dead_at=at + timedelta(minutes=50),
        dead_error="gave up after 20 attempts: HTTP 503",
        dead_status=503,
    )
    assert notifications.notice_data(dead) == {
        "endpoint": {"namespace": "shop", "name": "orders-acme"},
        "tenant": "acme",
        "consecutive_failures": 20,
        "noticed_at": "2026-03-01T12:00:03.123456Z",
        "reason": "gave up after 20 attempts: HTTP 503",
        "status": 503,
        "failure": None,
        "dead": 7,
        "from": "2026-03-01T12:00:00Z",
        "until": "2026-03-01T13:00:00Z",
        "last_dead_at": "2026-03-01T12:50:00Z",
    }
    gone = _notice(
        "deactivated",
        deactivated_at=at,
        deactivated_reason="the receiver answered 410 Gone",
        transitions=2,
    )
    told = notifications.notice_data(gone)
    assert (told["reason"], told["deactivated_at"], told["deactivations"], told["last_error"]) == (
        "the receiver answered 410 Gone",
        "2026-03-01T12:00:00Z",
        2,
        "HTTP 503",
    )
    paused = notifications.notice_data(_notice("paused"))
    assert (paused["reason"], paused["openings"], paused["paused_until"]) == (
        "HTTP 503",
        1,
        "2026-03-01T12:01:00.123456Z",
    )


@pytest.mark.parametrize("tenant", ["", "a\x07b", "x" * 254])
def test_the_notifications_tenant_follows_the_tenant_rule(tenant):
    with pytest.raises(InvalidInput, match="HOOKLANE_NOTIFICATIONS_TENANT"):
        Settings.from_env({"HOOKLANE_NOTIFICATIONS_TENANT": tenant})
    assert Settings.from_env({"HOOKLANE_NOTIFICATIONS_TENANT": OPS}).notifications_tenant == OPS
