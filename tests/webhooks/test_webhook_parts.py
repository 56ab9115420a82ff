"""The pure parts of webhooks: the apps.toml table checked, the message and its signature (checked
by the standardwebhooks package), which events are announced, and the address check, including a
name that resolves to a loopback address only when the connection is made (DNS rebinding)."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import time

import httpcore
import pytest
from standardwebhooks.webhooks import Webhook

from sessionloop.actors import events as E
from sessionloop.actors.errors import InvalidCommand
from sessionloop.actors.settings.apps import AppManifest
from sessionloop.actors.webhooks.config import EVENT_TYPES, WebhookOptions, WebhookTarget, parse_webhook
from sessionloop.actors.webhooks.events import message_for, outbox_mark, sign, webhook_type
from sessionloop.actors.webhooks.guard import GuardedBackend, TargetRefused, refusal
from sessionloop.eventstore import RecordedEvent

SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()
GOOD = {"url": "https://hooks.example/in", "secret": SECRET, "events": ["turn.completed"]}


def test_a_good_table_is_a_target_and_its_repr_hides_the_secret():
    target = parse_webhook("bot", GOOD)
    assert target == WebhookTarget(url=GOOD["url"], secret=SECRET, events=["turn.completed"])
    assert target.key() == bytes(range(32))
    assert SECRET not in repr(target) and SECRET not in repr(AppManifest(id="bot", webhook=target))


@pytest.mark.parametrize(("change", "says"), [
    ({"url": "ftp://hooks.example/"}, "http:// or https://"),
    ({"url": "https://user:pw@hooks.example/"}, "user or password"),
    ({"url": "https:///nohost"}, "with a host"),
    ({"url": "https://hooks.example/a b"}, "spaces"),
    ({"url": "https://hooks.example:99999/"}, "not a URL"),
    ({"url": "https://h.example/" + "x" * 3000}, "at most 2048"),
    ({"secret": "plain"}, "whsec_"),
    ({"secret": "whsec_!!!notbase64"}, "not base64"),
    ({"secret": "whsec_" + base64.b64encode(b"short").decode()}, "24 to 64 bytes"),
    ({"events": []}, "non-empty list"),
    ({"events": ["turn.done"]}, "unknown event types 'turn.done'"),
    ({"extra": 1}, "unknown keys: extra"),
])
def test_a_wrong_table_is_refused_naming_what_is_wrong_and_never_the_secret(change, says):
    with pytest.raises(InvalidCommand, match="app 'bot': webhook") as raised:
        parse_webhook("bot", {**GOOD, **change})
    assert says in str(raised.value) and SECRET[6:] not in str(raised.value)


def test_the_retry_schedule_doubles_up_to_its_ceiling():
    opts = WebhookOptions(retry_first_s=5, retry_max_delay_s=60)
    assert [opts.delay_after(n) for n in range(1, 7)] == [5, 10, 20, 40, 60, 60]
    assert opts.delay_after(10_000) == 60


def recorded(event, version=7, position=41, stream="session-s1"):
    return RecordedEvent(stream, version, position, 1_700_000_000_123, event)


def test_a_message_is_signed_as_standard_webhooks_does_and_its_id_is_the_session_and_sequence():
    message = message_for("bot", recorded(E.TurnCompleted(turn_id="t1", output_text="hi")))
    assert message is not None and message.id == "msg_s1_7" and message.type == "turn.completed"
    stamp = int(time.time())
    headers = {"webhook-id": message.id, "webhook-timestamp": str(stamp),
               "webhook-signature": sign(bytes(range(32)), message.id, stamp, message.body)}
    body = Webhook(SECRET).verify(message.body, headers)
    assert body == {"type": "turn.completed", "timestamp": "2023-11-14T22:13:20.123Z",
                    "data": {"app": "bot", "sessionId": "s1", "sequence": 7, "cursor": 41, "turnId": "t1",
                             "outputText": "hi", "outcome": "replied"}}


def test_every_announced_type_is_one_a_webhook_may_ask_for_and_others_are_not_announced():
    announced = [
        (E.TurnCompleted(turn_id="t"), "turn.completed"),
        (E.TurnLimitReached(turn_id="t", max_steps=3), "turn.completed"),
        (E.TurnFailed(turn_id="t", code="model"), "turn.failed"), (E.TurnAborted(turn_id="t"), "turn.failed"),
        (E.ToolApprovalRequested(turn_id="t", call_id="c", approval_id="a"), "approval.requested"),
        (E.TurnStarted(turn_id="t"), "turn.started"),
        (E.LlmCompleted(turn_id="t", step_id="s", text="x"), "assistant.message"),
        (E.ToolStarted(turn_id="t", call_id="c", tool="exec"), "tool.started"),
        (E.ToolFinished(turn_id="t", call_id="c", status="completed"), "tool.finished"),
    ]
    assert {kind for _e, kind in announced} == set(EVENT_TYPES)
    for event, kind in announced:
        assert webhook_type(event) == kind
        assert message_for("bot", recorded(event)).type == kind
    assert webhook_type(E.LlmCompleted(turn_id="t", step_id="s", text="")) is None
    assert webhook_type(E.InputAccepted(input_id="i", turn_id="t")) is None


def test_a_commit_owes_its_webhook_only_the_types_it_asked_for():
    app = AppManifest(id="bot", webhook=parse_webhook("bot", {**GOOD, "events": ["turn.failed", "turn.completed"]}))
    events = [E.TurnStarted(turn_id="t"), E.TurnCompleted(turn_id="t"), E.TurnFailed(turn_id="u", code="x")]
    mark = outbox_mark(app, events)
    assert mark is not None and mark.target == "bot" and mark.flags == [False, True, True]
    assert outbox_mark(app, [E.TurnStarted(turn_id="t")]) is None
    assert outbox_mark(AppManifest(id="bot"), events) is None and outbox_mark(None, events) is None


@pytest.mark.parametrize("address", ["127.0.0.1", "10.1.2.3", "172.16.0.9", "192.168.1.1", "169.254.169.254",
                                     "0.0.0.0", "100.64.0.1", "224.0.0.1", "::1", "fe80::1", "fc00::1",
                                     "::ffff:127.0.0.1", "::ffff:10.0.0.1", "240.0.0.1"])
def test_non_public_addresses_are_refused(address):
    assert refusal(ipaddress.ip_address(address), []) is not None


def test_public_addresses_pass_and_an_allowed_network_opens_exactly_itself():
    assert refusal(ipaddress.ip_address("93.184.215.14"), []) is None
    assert refusal(ipaddress.ip_address("2606:4700::1111"), []) is None
    allowed = [ipaddress.ip_network("127.0.0.1/32")]
    assert refusal(ipaddress.ip_address("127.0.0.1"), allowed) is None
    assert refusal(ipaddress.ip_address("127.0.0.2"), allowed) == "127.0.0.2 is a loopback address"


class Rebinding(GuardedBackend):
    """A resolver that answers a public address first and loopback from then on."""

    def __init__(self) -> None:
        super().__init__([], inner=httpcore.AsyncMockBackend([]))
        self.calls = 0

    async def resolve(self, host, port):
        self.calls += 1
        return [ipaddress.ip_address("93.184.215.14" if self.calls == 1 else "127.0.0.1")]


def test_the_check_runs_at_every_connection_so_a_rebound_name_is_refused():
    backend = Rebinding()

    async def connect_twice():
        await backend.connect_tcp("hooks.example", 443)  # public: the (mock) connection is made
        with pytest.raises(TargetRefused, match="127.0.0.1 is a loopback address"):
            await backend.connect_tcp("hooks.example", 443)

    asyncio.run(connect_twice())


def test_a_name_with_one_private_address_among_public_ones_is_refused():
    class Mixed(GuardedBackend):
        async def resolve(self, host, port):
            return [ipaddress.ip_address("93.184.215.14"), ipaddress.ip_address("10.0.0.5")]

    with pytest.raises(TargetRefused, match="10.0.0.5 is a private address"):
        asyncio.run(Mixed([], inner=httpcore.AsyncMockBackend([])).connect_tcp("hooks.example", 443))


def test_localhost_resolves_and_is_refused():
    with pytest.raises(TargetRefused, match="loopback"):
        asyncio.run(GuardedBackend([]).connect_tcp("localhost", 9))
