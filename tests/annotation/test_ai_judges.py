"""AI judges in campaigns (issue #12): a local LM judged by a REAL Celery worker, an OpenAI-compatible
endpoint played by a real stdlib HTTP server (a malformed reply, a 500, a reply that is not a chat
completion), the swap/tie rule, idempotent re-runs, cancellation, the agreement panel against
hand-computed values, the human/AI/both source of rankings, reward models and DPO, and access.
"""

from __future__ import annotations

import csv
import io
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from annotation import ai_judges, assignment, campaigns, invites, reward_models, uploads
from annotation.ai_backends import Verdict, parse_verdict
from annotation.errors import AnnotationError
from annotation.models import AIJudge, AIJudgment, Item
from annotation.pairs import preference_pairs
from engine.models.builtin import builtin_model_dir
from tests.annotation.conftest import POSITIVE, sentiment_upload


def _campaign(n: int, name: str = "ai", a_is_pos: bool = False) -> Any:
    """A started pairwise campaign of ``n`` review pairs (pos vs neg); ``a_is_pos`` stores "pos" as
    system a on every item, so a/b labels of a constructed case mean the same thing on every item."""
    camp = uploads.create_campaign_from_upload(name, sentiment_upload(n), overlap=3)
    if a_is_pos:
        for it in camp.items.filter(system_a="neg"):
            Item.objects.filter(pk=it.pk).update(
                system_a=it.system_b, output_a=it.output_b, system_b=it.system_a, output_b=it.output_a
            )
    return camp


def _annotator(username: str) -> Any:
    """An annotator who never logs in (judgments are recorded through the service): no password
    hash, which costs a second per user on a loaded machine."""
    from django.contrib.auth.models import Group, User

    user = User(username=username)
    user.set_unusable_password()
    user.save()
    user.groups.add(Group.objects.get_or_create(name="annotator")[0])
    return user


def _items(camp: Any) -> list[Item]:
    return list(camp.items.filter(gold="").order_by("order", "id"))


# ------------------------------------------------------------------------------ an endpoint server


class ChatServer:
    """``POST /v1/chat/completions`` on a loopback port. Replies by the prompt's review number:
    0 → the letter of the positive response; 1 → prose without a verdict; 2 → HTTP 500 (until
    ``healthy``); 3 → ``[[A]]`` whatever the order (a position-following judge); 4 → a JSON body with
    no choices (until ``healthy``). With ``hold_at`` = n, the n-th request sets ``held`` and waits for
    ``release`` (a judge caught in the middle of its work, without sleeping)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.healthy = False
        self.hold_at: int | None = None
        self.held = threading.Event()
        self.release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                text = body["messages"][0]["content"]
                outer.calls.append(
                    {"path": self.path, "auth": self.headers.get("Authorization"), "body": body}
                )
                if len(outer.calls) == outer.hold_at:
                    outer.held.set()
                    outer.release.wait(60)
                review = int(re.search(r"Review (\d+):", text).group(1))
                if review == 2 and not outer.healthy:
                    return self._send(500, {"error": {"message": "overloaded"}})
                if review == 4 and not outer.healthy:
                    return self._send(200, {"object": "chat.completion", "choices": []})
                resp_a = re.search(r"Response A:\n(.*?)\n\nResponse B:", text, re.S).group(1)
                reply = {
                    1: "Both responses have merits; I cannot decide.",
                    3: "[[A]]",
                }.get(review, "A" if any(w in resp_a for w in POSITIVE) else "B")
                self._send(
                    200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": reply}}]}
                )

            def _send(self, code: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def chat_server(settings: Any) -> Iterator[ChatServer]:
    """The endpoint on 127.0.0.1, which this test process allows as a deployment would allow its own
    judge server (``GRUE_OUTBOUND_ALLOW``); by default a loopback base URL is refused."""
    settings.OUTBOUND_ALLOW = ["127.0.0.1"]
    server = ChatServer()
    yield server
    server.stop()


def _review(item: Item) -> int:
    return int(re.search(r"Review (\d+):", item.prompt).group(1))


# ----------------------------------------------------------------------------------------- tests


def test_verdict_parsing_template_and_url_rules():
    assert [parse_verdict(s) for s in ("A", " B. ", "[[A]]", "(B)", "Response A", "Answer: B", "Sure.\nA")] == [
        "A", "B", "A", "B", "A", "B", "A",
    ]  # fmt: skip
    # No verdict (a tie): prose, contradicting brackets, an explicit tie.
    assert [parse_verdict(s) for s in ("I think A is better", "[[A]] or [[B]]", "[[C]]", "", "AB")] == [
        ""
    ] * 5
    ok = "Q: {prompt}\n{{literal}}\nA: {response_a}\nB: {response_b}\n{instructions} {axes}"
    assert ai_judges.check_template(ok) == ok
    assert (
        ai_judges.render_template(
            ok, {"prompt": "p {x}", "response_a": "ra", "response_b": "rb", "instructions": "i", "axes": "x"}
        )
        == "Q: p {x}\n{literal}\nA: ra\nB: rb\ni x"
    )  # values are inserted verbatim, never re-formatted
    for bad, says in [
        ("{prompt.__class__} {response_a} {response_b}", "unknown placeholder {prompt.__class__}"),
        ("{response_a} {response_b} {secret}", "unknown placeholder {secret}"),
        ("{response_a!r} {response_b}", "unknown placeholder {response_a!r}"),
        ("{response_a:>10} {response_b}", "unknown placeholder {response_a:>10}"),
        ("{prompt} {response_a}", "must contain {response_b}"),
        ("{response_a} {response_b", "write {{ and }} for literal braces"),
    ]:
        with pytest.raises(AnnotationError, match=re.escape(says)):
            ai_judges.check_template(bad)
    assert ai_judges.check_base_url("https://api.example.org/v1/") == "https://api.example.org/v1"
    for bad in (
        "ftp://x/v1",
        "file:///etc/passwd",
        "javascript:alert(1)",
        "api.openai.com/v1",
        "https://u:p@h/v1",
    ):
        with pytest.raises(AnnotationError, match="base URL"):
            ai_judges.check_base_url(bad)


@pytest.mark.django_db(transaction=True)
def test_local_lm_judges_each_item_twice_swapped_in_the_worker(celery_worker, wait_for, researcher_client):
    camp = _campaign(3, "local")
    page = researcher_client.post(
        f"/annotate/campaigns/{camp.pk}/",
        {"action": "add_ai_judge", "ai_name": "tiny", "ai_kind": "local", "ai_model": "builtin:tiny-gpt2",
         "ai_template": ai_judges.DEFAULT_TEMPLATE},
        follow=True,
    ).content.decode()  # fmt: skip
    assert "AI judge tiny added" in page
    judge = AIJudge.objects.get(campaign=camp, name="tiny")

    def run_and_wait() -> AIJudge:
        researcher_client.post(
            f"/annotate/campaigns/{camp.pk}/", {"action": "run_ai_judge", "judge_id": judge.pk}
        )
        wait_for(lambda: AIJudge.objects.get(pk=judge.pk).status in ("succeeded", "failed"), timeout=240,
                 interval=0.2, what="AI judge in the worker")  # fmt: skip
        j = AIJudge.objects.get(pk=judge.pk)
        assert j.status == "succeeded", j.error + "\n" + celery_worker.log()[-3000:]
        return j

    j = run_and_wait()
    items = _items(camp)
    assert j.n_total == j.n_done == 3 and j.n_errors == 0
    rows = list(AIJudgment.objects.filter(judge=judge).order_by("item_id", "a_first"))
    assert sorted((r.item_id, r.a_first) for r in rows) == sorted(
        (i.pk, s) for i in items for s in (False, True)
    )
    state = researcher_client.get(f"/annotate/campaigns/{camp.pk}/ai-judges/{judge.pk}.json").json()
    assert state["status"] == "succeeded" and state["progress"] == 1.0 and state["n_judgments"] == 6

    # Hand-check one item with transformers directly: the probabilities of "A"/" A" and "B"/" B"
    # after the prompt decide each pass; the item's verdict is the same system twice, else a tie.
    item = items[0]
    path = builtin_model_dir("builtin:tiny-gpt2")
    tok, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path).eval()
    a_ids = [tok.encode("A")[0], tok.encode(" A")[0]]
    b_ids = [tok.encode("B")[0], tok.encode(" B")[0]]
    expected = {}
    for a_first in (True, False):
        first, second = (item.output_a, item.output_b) if a_first else (item.output_b, item.output_a)
        text = ai_judges.DEFAULT_TEMPLATE.format(
            instructions=camp.instructions, axes="overall quality", prompt=item.prompt, response_a=first,
            response_b=second,
        )  # fmt: skip
        with torch.no_grad():
            probs = torch.softmax(model(torch.tensor([tok.encode(text)])).logits[0, -1], -1)
        pa, pb = float(probs[a_ids].sum()), float(probs[b_ids].sum())
        first_won = pa > pb
        expected[a_first] = (pa, pb, "a" if first_won == a_first else "b")
    stored = {r.a_first: r for r in rows if r.item_id == item.pk}
    for a_first, (pa, pb, choice) in expected.items():
        r = stored[a_first]
        assert r.p_first == pytest.approx(pa, rel=1e-4) and r.p_second == pytest.approx(pb, rel=1e-4)
        assert r.label == ("A" if pa > pb else "B") and r.choice == choice
    hand = expected[True][2] if expected[True][2] == expected[False][2] else "tie"
    verdict = next(v for v in ai_judges.ai_verdicts(camp) if v["item_id"] == item.pk)
    assert verdict["choice"] == hand

    # Idempotent: a second run (through the worker again) judges nothing new and duplicates nothing.
    first_ids = {r.pk for r in rows}
    j = run_and_wait()
    assert (
        j.n_done == 3
        and set(AIJudgment.objects.filter(judge=judge).values_list("pk", flat=True)) == first_ids
    )


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:6379/v1",
        "http://localhost:8000/v1",
        "http://[::1]:5432",
        "http://0177.0.0.1/v1",
        "http://169.254.169.254/latest",
        "http://10.0.0.7/v1",
        "https://192.168.1.20/v1",
    ],
)
def test_base_urls_of_internal_addresses_are_refused_unless_allowed(url, settings):
    """Issue 25.2: a judge could be aimed at the server's own network (Redis, PostgreSQL, the cloud
    metadata service, private hosts) and the worker posted the key there."""
    settings.OUTBOUND_ALLOW = []
    with pytest.raises(AnnotationError, match="base URL: .*(address|ambiguous)"):
        ai_judges.check_base_url(url)
    settings.OUTBOUND_ALLOW = ["127.0.0.0/8", "::1", "10.0.0.7", "169.254.169.254", "192.168.1.0/24"]
    if "0177" in url:  # an ambiguous spelling stays refused whatever is allowed
        with pytest.raises(AnnotationError, match="ambiguous"):
            ai_judges.check_base_url(url)
    else:
        assert ai_judges.check_base_url(url) == url.rstrip("/")


class _Raw:
    """A TCP service on loopback answering every connection with fixed bytes (not HTTP, or a
    hand-written HTTP reply), counting connections."""

    def __init__(self, reply: bytes) -> None:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.reply = reply
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                conn.recv(65536)
                conn.sendall(self.reply)

    def stop(self) -> None:
        self.sock.close()


@pytest.mark.django_db
def test_judge_errors_keep_a_status_and_reason_never_the_reply_and_redirects_are_not_followed(
    chat_server, settings
):
    """Issue 25.2: error texts quoted 200-300 characters of whatever answered (a banner, an internal
    page), a non-HTTP banner crashed the job with it, and a 302 was followed with the key."""
    settings.ANNOTATION_AI_RETRIES = 0
    page = b"<html>internal admin console: db password hunter2</html>"
    services = {
        "banner": _Raw(b"-NOAUTH Authentication required.\r\n"),
        "page": _Raw(
            b"HTTP/1.1 404 Totally Custom Reason hunter2\r\nContent-Length: %d\r\n\r\n%s" % (len(page), page)
        ),
        "not chat": _Raw(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (len(page), page)
        ),
        "redirect": _Raw(
            b"HTTP/1.1 302 Found\r\nLocation: %s/chat/completions\r\nContent-Length: 0\r\n\r\n"
            % chat_server.url.encode()
        ),
    }
    want = {
        "banner": ("not an HTTP reply", "connection closed by the server"),
        "page": ("HTTP 404 Not Found from",),
        "not chat": ("is not a chat completion",),
        "redirect": ("HTTP 302 Found (redirects are not followed)",),
    }
    try:
        camp = _campaign(1, "errors")
        for name, svc in services.items():
            judge = ai_judges.create_judge(
                camp, name=name, kind="endpoint", model="m", base_url=svc.url, api_key="sk-judge-key"
            )
            ai_judges.start_judging(judge, enqueue=False)
            j = ai_judges.run_judging(judge.pk)
            assert svc.connections >= 1, name
            assert j.status == "failed" and j.n_errors == 1, (name, j.status, j.n_errors, j.error)
            assert any(w in j.error for w in want[name]), (name, j.error)
            for leaked in ("hunter2", "NOAUTH", "admin console", "Custom Reason"):
                assert leaked not in j.error, (name, j.error)
    finally:
        for svc in services.values():
            svc.stop()
    assert chat_server.calls == []  # the redirect's target never saw the key


@pytest.mark.django_db
def test_every_call_checks_the_address_again(chat_server, settings):
    """A base URL saved while allowed (or while its name resolved elsewhere) is checked before each
    call: once the address is no longer allowed, the job fails at once and nothing is sent."""
    camp = _campaign(2, "recheck")
    judge = ai_judges.create_judge(camp, name="j", kind="endpoint", model="m", base_url=chat_server.url)
    settings.OUTBOUND_ALLOW = []
    ai_judges.start_judging(judge, enqueue=False)
    j = ai_judges.run_judging(judge.pk)
    assert j.status == "failed" and "loopback address" in j.error, j.error
    assert chat_server.calls == []


@pytest.mark.django_db
def test_endpoint_judge_malformed_reply_500_and_rerun(chat_server, settings):
    settings.ANNOTATION_AI_RETRIES = 1  # one retry, at once: the 500 item is called twice per pass
    settings.ANNOTATION_AI_RETRY_DELAY = 0
    camp = _campaign(5, "endpoint")
    judge = ai_judges.create_judge(
        camp, name="gpt", kind="endpoint", model="gpt-test", base_url=chat_server.url, api_key="sk-test-123"
    )
    ai_judges.start_judging(judge, enqueue=False)
    j = ai_judges.run_judging(judge.pk)
    by_review = {_review(i): i for i in _items(camp)}
    assert j.status == "succeeded" and j.n_total == 5 and j.n_done == 3 and j.n_errors == 2
    assert "could not be judged" in j.error and "run the judge again" in j.error
    assert chat_server.calls[0]["path"] == "/v1/chat/completions"
    assert {c["auth"] for c in chat_server.calls} == {"Bearer sk-test-123"}
    assert {c["body"]["model"] for c in chat_server.calls} == {"gpt-test"}
    assert all(c["body"]["temperature"] == 0 for c in chat_server.calls)
    calls_500 = [c for c in chat_server.calls if "Review 2:" in c["body"]["messages"][0]["content"]]
    assert len(calls_500) == 2  # first pass: tried, retried once, then the item is given up (no 2nd pass)

    def passes(review: int) -> dict[bool, AIJudgment]:
        return {r.a_first: r for r in AIJudgment.objects.filter(judge=judge, item=by_review[review])}

    p0 = passes(0)  # the endpoint prefers the positive review whichever side it is on: consistent
    pos_is_a = by_review[0].system_a == "pos"
    assert p0[True].label == ("A" if pos_is_a else "B") and p0[False].label == ("B" if pos_is_a else "A")
    assert p0[True].choice == p0[False].choice == ("a" if pos_is_a else "b")
    p1 = passes(1)  # prose without a verdict: a tie, with the raw reply kept
    assert {r.label for r in p1.values()} == {""} and {r.choice for r in p1.values()} == {"tie"}
    assert p1[True].reply == "Both responses have merits; I cannot decide."
    p3 = passes(3)  # always "[[A]]": the two passes name different systems, so the item is a tie
    assert (p3[True].choice, p3[False].choice) == ("a", "b")
    assert passes(2) == {} and passes(4) == {}  # errors store nothing
    verdicts = {v["item_id"]: v["choice"] for v in ai_judges.ai_verdicts(camp)}
    assert verdicts == {
        by_review[0].pk: "a" if pos_is_a else "b",
        by_review[1].pk: "tie",
        by_review[3].pk: "tie",
    }

    # Re-run with the endpoint healthy: only the two missing items are asked (2 passes each).
    chat_server.healthy = True
    n_calls = len(chat_server.calls)
    ai_judges.start_judging(j, enqueue=False)
    j = ai_judges.run_judging(judge.pk)
    assert j.status == "succeeded" and j.n_done == 5 and j.n_errors == 0 and j.error == ""
    assert len(chat_server.calls) - n_calls == 4
    assert AIJudgment.objects.filter(judge=judge).count() == 10


@pytest.mark.django_db(transaction=True)
def test_cancel_stops_a_running_judge_after_its_current_item(
    loopback_judge_worker, wait_for, researcher_client, chat_server
):
    chat_server.hold_at = 1
    chat_server.healthy = True
    camp = _campaign(5, "cancel")
    judge = ai_judges.create_judge(camp, name="slow", kind="endpoint", model="m", base_url=chat_server.url)
    researcher_client.post(
        f"/annotate/campaigns/{camp.pk}/", {"action": "run_ai_judge", "judge_id": judge.pk}
    )
    wait_for(chat_server.held.is_set, timeout=60, what="the worker's first call")
    task_id = AIJudge.objects.get(pk=judge.pk).task_id
    assert AIJudge.objects.get(pk=judge.pk).status == "running"
    page = researcher_client.post(
        f"/annotate/campaigns/{camp.pk}/", {"action": "cancel_ai_judge", "judge_id": judge.pk}, follow=True
    ).content.decode()
    assert "cancelling" in page
    assert AIJudge.objects.get(pk=judge.pk).status == "cancelled"  # at once: a dead worker cannot block it
    chat_server.release.set()
    wait_for(lambda: f"run_ai_judge[{task_id}] succeeded" in loopback_judge_worker.log(), timeout=60,
             what="the worker's job to end")  # fmt: skip
    j = AIJudge.objects.get(pk=judge.pk)
    assert j.status == "cancelled" and j.n_total == 5 and j.n_done == 1
    assert AIJudgment.objects.filter(judge=judge).count() == 2  # the item in progress was finished and kept
    assert len(chat_server.calls) == 2  # and nothing after it


def _constructed_case() -> tuple[Any, AIJudge, list[Item]]:
    """Six items, "pos" stored as system a. Three annotators agree on every item:
    a a a a b tie. The AI judge's passes (label with a first, label with b first):
      i0 (A,B) → a,a → a    i1 (A,A) → a,b → tie (inconsistent)    i2 (A,B) → a
      i3 (B,A) → b,b → b    i4 (B,A) → b                           i5 (A,A) → tie (inconsistent)
    By hand: AI verdicts a,tie,a,b,b,tie vs humans a,a,a,a,b,tie: p_o = 4/6; AI marginals a2 b2 tie2,
    humans a4 b1 tie1, p_e = (2·4 + 2·1 + 2·1)/36 = 1/3, kappa = (2/3 − 1/3)/(2/3) = 0.5.
    Accuracy on items both decided (i0, i2, i3, i4) = 3/4; coverage = 4 of 5 human-decided items = 0.8.
    First-position wins: 8 "A" of 12 decided passes = 0.667; inconsistent items 2/6 = 0.333.
    Win rate of pos: humans (12 + 1.5)/18 = 0.75; AI (2 + 0.5 + 0.5)/6 = 0.5; both 16.5/24 = 0.6875.
    """
    camp = _campaign(6, "constructed", a_is_pos=True)
    items = _items(camp)
    human = ["a", "a", "a", "a", "b", "tie"]
    ai = [("A", "B"), ("A", "A"), ("A", "B"), ("B", "A"), ("B", "A"), ("A", "A")]
    index = {it.pk: k for k, it in enumerate(items)}
    users = [_annotator(f"h{k}") for k in range(3)]
    for u in users:
        invites.add_member(camp, u)
    campaigns.start_campaign(camp)
    for u in users:
        while (a := assignment.next_item(camp, u)) is not None:
            want = human[index[a.item_id]]
            choice = "tie" if want == "tie" else ("left" if (want == "a") == a.left_is_a else "right")
            assignment.record_judgment(u, a.token, item_id=a.item_id, choice=choice)
    judge = ai_judges.create_judge(camp, name="constructed judge", kind="local", model="builtin:tiny-gpt2")
    AIJudgment.objects.bulk_create(
        [ai_judges.pass_row(judge, it, a_first, Verdict(label=ai[k][0 if a_first else 1]))
         for k, it in enumerate(items) for a_first in (True, False)]
    )  # fmt: skip
    return camp, judge, items


@pytest.mark.django_db
def test_results_page_agreement_panel_equals_hand_computed_values(researcher_client):
    camp, judge, items = _constructed_case()
    html = researcher_client.get(f"/annotate/campaigns/{camp.pk}/results/").content.decode()
    panel = html[html.index('id="ai-panel"') : html.index('id="source-form"')]
    row = panel[panel.index(f'data-judge="{judge.pk}"') :]
    assert "constructed judge" in panel and "2 / 2 / 2" in row  # verdicts a / b / tie
    assert re.search(r'ai-kappa">0\.500 <span class="muted">n=6', row)
    assert re.search(r'ai-accuracy">0\.750 <span class="muted">n=4', row)
    assert re.search(r'ai-coverage">0\.800<', row)
    assert re.search(r'ai-first">0\.667 <span class="muted">n=12', row)
    assert re.search(r'ai-inconsistent">0\.333 <span class="muted">2 items', row)

    def pos_rate(source: str) -> tuple[float, int]:
        res = researcher_client.get(f"/annotate/campaigns/{camp.pk}/results.json?source={source}").json()
        pos = next(o for o in res["win_rates"]["overall"] if o["system"] == "pos")
        return pos["rate"], res["n_comparisons"]

    assert pos_rate("human") == (pytest.approx(0.75), 18)
    assert pos_rate("ai") == (pytest.approx(0.5), 6)
    assert pos_rate("both") == (pytest.approx(0.6875), 24)
    assert (
        researcher_client.get(f"/annotate/campaigns/{camp.pk}/results.json?source=robots").status_code == 400
    )
    rows = list(
        csv.DictReader(
            io.StringIO(
                researcher_client.get(f"/annotate/campaigns/{camp.pk}/ai-judgments.csv").content.decode()
            )
        )
    )
    assert len(rows) == 12 and {r["judge"] for r in rows} == {"constructed judge"}
    verdict_of = {int(r["item"]): r["item_verdict"] for r in rows}
    assert [verdict_of[it.pk] for it in items] == ["a", "tie", "a", "b", "b", "tie"]
    # The human-only statistics do not see the AI judge: it is no annotator.
    res = researcher_client.get(f"/annotate/campaigns/{camp.pk}/results.json").json()
    assert {a["annotator"] for a in res["annotators"]} == {"h0", "h1", "h2"}


@pytest.mark.django_db
def test_reward_model_and_dpo_take_an_explicit_source(researcher_client, runs_dir):
    camp, judge, items = _constructed_case()
    human, ai, both = (preference_pairs(camp, source=s) for s in ("human", "ai", "both"))
    assert len(human) == 15 and len(ai) == 4 and len(both) == 19  # ties dropped: 3×5 human, 4 AI verdicts
    assert {p["meta"]["source"] for p in human} == {"human"} and {p["meta"]["source"] for p in ai} == {"ai"}
    assert {p["meta"]["ai_judge"] for p in ai} == {"constructed judge"}
    assert sorted(p["meta"]["system_chosen"] for p in ai) == ["neg", "neg", "pos", "pos"]

    jsonl = researcher_client.get(f"/annotate/campaigns/{camp.pk}/export.jsonl?source=both").content.decode()
    assert [json.loads(x) for x in jsonl.splitlines()] == json.loads(json.dumps(both))
    resp = researcher_client.post(f"/annotate/campaigns/{camp.pk}/dpo/", {"source": "ai"})
    assert resp.status_code == 302 and resp["Location"] == f"/launch/?dpo_campaign={camp.pk}-ai"
    path = Path(runs_dir) / "preference_pairs" / f"campaign-{camp.pk}-ai-pairs.jsonl"
    assert [json.loads(x)["meta"]["source"] for x in path.read_text().splitlines()] == ["ai"] * 4
    launch = researcher_client.get(resp["Location"])
    initial = launch.context["form"].initial_config
    assert initial["task"]["args"]["path"] == str(path) and initial["name"].endswith("(AI judges)")
    assert "4 preference pairs (AI judges) exported" in launch.content.decode()

    rm = reward_models.create_reward_model(
        camp, reward_models.TrainRequest(name="ai rm", source="both"), enqueue=False
    )
    assert rm.params["source"] == "both"
    AIJudgment.objects.filter(judge=judge).delete()
    with pytest.raises(AnnotationError, match=r"decided pairwise judgments \(ai\).*have 0"):
        reward_models.create_reward_model(
            camp, reward_models.TrainRequest(name="x", source="ai"), enqueue=False
        )
    r = researcher_client.post(f"/annotate/campaigns/{camp.pk}/dpo/", {"source": "ai"}, follow=True)
    assert "no decided pairwise judgments from AI judges yet" in r.content.decode()


@pytest.mark.django_db
def test_annotators_cannot_add_ai_judges_and_keys_are_never_shown(client, researcher, annotator):
    camp = _campaign(2, "access")
    invites.add_member(camp, annotator)
    client.force_login(annotator)
    r = client.post(
        f"/annotate/campaigns/{camp.pk}/",
        {"action": "add_ai_judge", "ai_name": "x", "ai_kind": "endpoint", "ai_model": "m",
         "ai_base_url": "http://127.0.0.1:9/v1", "ai_api_key": "sk-annotator"},
    )  # fmt: skip
    assert r.status_code in (302, 403) and not AIJudge.objects.exists()
    judge = ai_judges.create_judge(
        camp, name="gpt", kind="endpoint", model="gpt-x", base_url="https://api.example.org/v1",
        api_key="sk-very-secret-key",
    )  # fmt: skip
    r = client.get(f"/annotate/campaigns/{camp.pk}/ai-judges/{judge.pk}.json", HTTP_ACCEPT="application/json")
    assert r.status_code == 403

    client.force_login(researcher)
    for url in (f"/annotate/campaigns/{camp.pk}/", f"/annotate/campaigns/{camp.pk}/results/",
                f"/annotate/campaigns/{camp.pk}/results.json", f"/annotate/campaigns/{camp.pk}/ai-judges/{judge.pk}.json"):  # fmt: skip
        body = client.get(url).content.decode()
        assert "sk-very-secret-key" not in body, url
    assert "key set" in client.get(f"/annotate/campaigns/{camp.pk}/").content.decode()
    # Bad input is refused with the field named, and nothing is stored.
    for post, says in [
        ({"ai_kind": "endpoint", "ai_model": "m", "ai_base_url": "file:///etc/passwd"}, "base URL"),
        ({"ai_kind": "local", "ai_model": "/etc"}, "model:"),
        ({"ai_kind": "local", "ai_template": "{response_a} {response_b} {x.y}"}, "unknown placeholder {x.y}"),
    ]:
        page = client.post(
            f"/annotate/campaigns/{camp.pk}/",
            {"action": "add_ai_judge", "ai_name": "bad", **post},
            follow=True,
        ).content.decode()
        assert says in page, says
    assert not AIJudge.objects.filter(name="bad").exists()
