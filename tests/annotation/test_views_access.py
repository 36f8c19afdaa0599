"""Pages through the Django test client: the researcher/annotator wall, invites, judging, uploads."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User

from annotation import assignment, campaigns, invites, uploads
from annotation.errors import AnnotationError
from annotation.models import Campaign, Item, Judgment
from tests.annotation.conftest import make_user

pytestmark = pytest.mark.django_db

SECRET_UPLOAD = "\n".join(
    json.dumps(
        {"prompt": f"Say something {i}", "outputs": {"SYSTEM_ALPHA": f"first text {i}", "SYSTEM_BETA": f"second text {i}"},
         "metrics": {"SYSTEM_ALPHA": {"secret_metric": 1.0}, "SYSTEM_BETA": {"secret_metric": 0.0}}}
    )
    for i in range(4)
)  # fmt: skip


def _active_campaign(members, overlap=1, name="secret campaign"):
    camp = uploads.create_campaign_from_upload(name, SECRET_UPLOAD, overlap=overlap)
    for u in members:
        invites.add_member(camp, u)
    campaigns.start_campaign(camp)
    return camp


def test_annotator_sees_item_blind_and_cannot_open_researcher_pages(client, annotator):
    camp = _active_campaign([annotator])
    client.force_login(annotator)
    page = client.get(f"/annotate/c/{camp.pk}/")
    html = page.content.decode()
    assert page.status_code == 200 and "Say something" in html and "0 of 4" in html
    for leak in ("SYSTEM_ALPHA", "SYSTEM_BETA", "secret_metric", "run:"):
        assert leak not in html
    assert "A is better" in html and 'class="kbd">Enter' in html  # shortcuts shown on screen
    for url in ("/annotate/campaigns/", f"/annotate/campaigns/{camp.pk}/", f"/annotate/campaigns/{camp.pk}/results/",
                f"/annotate/campaigns/{camp.pk}/export.jsonl", f"/annotate/campaigns/{camp.pk}/results.json",
                "/annotate/leaderboard/", "/annotate/reward-models/"):  # fmt: skip
        r = client.get(url)
        assert r.status_code in (302, 403) and (r.status_code == 403 or r["Location"] == "/annotate/"), url
    assert (
        client.get(f"/annotate/campaigns/{camp.pk}/results.json", HTTP_ACCEPT="application/json").status_code
        == 403
    )
    home = client.get("/annotate/").content.decode()
    assert "secret campaign" in home and "Manage campaigns" not in home


def test_non_member_gets_404_and_cannot_submit(client, annotator):
    member = make_user("member")
    camp = _active_campaign([member])
    a = assignment.next_item(camp, member)
    client.force_login(annotator)
    assert client.get(f"/annotate/c/{camp.pk}/").status_code == 404
    r = client.post(
        f"/annotate/c/{camp.pk}/submit/", {"token": a.token, "item_id": a.item_id, "choice": "left"}
    )
    assert r.status_code == 404 and Judgment.objects.count() == 0
    assert "secret campaign" not in client.get("/annotate/").content.decode()
    # A member of ANOTHER campaign replaying a stolen token through their own campaign is refused too.
    other = _active_campaign([annotator], name="other")
    r = client.post(f"/annotate/c/{other.pk}/submit/", {"token": a.token, "item_id": a.item_id, "choice": "left"},
                    HTTP_ACCEPT="application/json")  # fmt: skip
    assert (
        r.status_code == 409 and "not assigned to you" in r.json()["error"] and Judgment.objects.count() == 0
    )


def test_anonymous_is_sent_to_login(client):
    camp = _active_campaign([make_user("m")])
    for url in ("/annotate/", f"/annotate/c/{camp.pk}/", "/annotate/campaigns/"):
        r = client.get(url)
        assert r.status_code == 302 and r["Location"].startswith("/accounts/login/")


def test_submit_form_flow_duplicate_rejected(client, annotator):
    camp = _active_campaign([annotator])
    client.force_login(annotator)
    client.get(f"/annotate/c/{camp.pk}/")
    a = assignment.next_item(camp, annotator)  # the open assignment the page showed
    post = {
        "token": a.token,
        "item_id": a.item_id,
        "choice": "right",
        "rationale": "clearer",
        "seconds": "4.2",
    }
    r = client.post(f"/annotate/c/{camp.pk}/submit/", post)
    assert r.status_code == 302 and Judgment.objects.count() == 1
    j = Judgment.objects.get()
    assert j.rationale == "clearer" and j.choice == ("b" if a.left_is_a else "a")
    r = client.post(f"/annotate/c/{camp.pk}/submit/", post, follow=True)
    assert "duplicate submission" in r.content.decode() and Judgment.objects.count() == 1
    assert "1 of 4" in r.content.decode()
    client.post(f"/annotate/c/{camp.pk}/undo/")
    assert Judgment.objects.count() == 0


def _open_invite(client, token):
    """What join.js does with the link's fragment: post the code, follow to the clean URL."""
    r = client.post("/annotate/join/", {"token": token})
    assert r.status_code == 302 and r["Location"] == "/annotate/join/"
    return client.get("/annotate/join/")


def test_invite_link_creates_annotator_only_account(client, researcher):
    camp = uploads.create_campaign_from_upload("inv", SECRET_UPLOAD, overlap=1)
    inv = invites.create_invite(camp, researcher)
    assert inv.max_uses == 1 and inv.expires_at is not None  # single use, expiring, by default
    page = client.get("/annotate/join/")
    assert page.status_code == 200 and 'id="invite-code-form"' in page.content.decode()
    page = _open_invite(client, inv.token)
    assert page.status_code == 200 and "Join “inv”" in page.content.decode()
    assert inv.token not in page.content.decode()  # the token is kept in the session, not in pages or URLs
    r = client.post("/annotate/join/", {"username": "newbie", "password": "a-long-password"})
    assert r.status_code == 302 and r["Location"] == f"/annotate/c/{camp.pk}/"
    user = User.objects.get(username="newbie")
    assert list(user.groups.values_list("name", flat=True)) == ["annotator"] and not user.is_staff
    assert invites.is_member(camp, user)
    client.logout()
    r = _open_invite(client, inv.token)
    assert r.status_code == 404 and "used up" in r.content.decode()
    assert _open_invite(client, "not-a-token").status_code == 404
    # Old links with the token in the path still work: the token moves to the session at once.
    inv2 = invites.create_invite(camp, researcher)
    r = client.get(f"/annotate/join/{inv2.token}/")
    assert r.status_code == 302 and r["Location"] == "/annotate/join/"
    assert "Join “inv”" in client.get("/annotate/join/").content.decode()


def test_expired_revoked_and_used_up_invites_are_refused(client, researcher):
    from datetime import timedelta

    from django.utils import timezone

    from annotation.models import Invite

    camp = uploads.create_campaign_from_upload("inv", SECRET_UPLOAD, overlap=1)
    expired = invites.create_invite(camp, researcher, days=1)
    Invite.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    r = _open_invite(client, expired.token)
    assert r.status_code == 404 and "expired" in r.content.decode()
    with pytest.raises(AnnotationError, match="expired"):
        invites.accept_invite(expired.token, make_user("late"))

    revoked = invites.create_invite(camp, researcher, max_uses=5)
    client.force_login(researcher)
    page = client.get(f"/annotate/campaigns/{camp.pk}/").content.decode()
    assert f"/annotate/join/#{revoked.token}" in page and 'class="copy-btn"' in page
    client.post(f"/annotate/campaigns/{camp.pk}/", {"action": "revoke_invite", "invite_id": revoked.pk})
    assert revoked.token not in client.get(f"/annotate/campaigns/{camp.pk}/").content.decode()
    client.logout()
    r = _open_invite(client, revoked.token)
    assert r.status_code == 404 and "revoked" in r.content.decode()
    with pytest.raises(AnnotationError, match="revoked"):
        invites.signup_with_invite(revoked.token, "someone", "a-long-password")

    once = invites.create_invite(camp, researcher)
    invites.accept_invite(once.token, make_user("first"))
    with pytest.raises(AnnotationError, match="used up"):
        invites.accept_invite(once.token, make_user("second"))
    assert camp.memberships.count() == 1 and not User.objects.filter(username="someone").exists()
    with pytest.raises(AnnotationError, match="between 1 and"):
        invites.create_invite(camp, researcher, max_uses=0)
    with pytest.raises(AnnotationError, match="expire within"):
        invites.create_invite(camp, researcher, days=1000)


def test_invite_signup_rejects_weak_passwords_and_hides_them_from_error_reports(client, researcher):
    camp = uploads.create_campaign_from_upload("inv", SECRET_UPLOAD, overlap=1)
    inv = invites.create_invite(camp, researcher)
    _open_invite(client, inv.token)
    for weak, why in [("12345678", "entirely numeric"), ("password", "too common"), ("newbie-x", None)]:
        r = client.post(
            "/annotate/join/", {"username": "newbie-x" if why is None else "newbie", "password": weak}
        )
        assert r.status_code == 400 and not User.objects.filter(username__startswith="newbie").exists()
        if why:
            assert why in r.content.decode()
    # Django's error reports (DEBUG pages, mail to admins) never show the posted password or token.
    from django.views.debug import SafeExceptionReporterFilter

    posted = SafeExceptionReporterFilter().get_post_parameters(r.wsgi_request)
    assert posted["password"] != "newbie-x" and set("*") == set(posted["password"])
    inv.refresh_from_db()
    assert inv.uses == 0


def test_researcher_creates_starts_and_reads_results(client, researcher, two_runs):
    good, bad = two_runs
    client.force_login(researcher)
    assert "good-run" in client.get("/annotate/campaigns/new/").content.decode()
    r = client.post("/annotate/campaigns/new/", {"name": "web cmp", "runs": [good.pk, bad.pk], "kind": "pairwise",
                                                  "overlap": "3", "pairing": "all_pairs"})  # fmt: skip
    assert r.status_code == 302
    camp = Campaign.objects.get(name="web cmp")
    assert camp.items.count() == 6
    r = client.post(f"/annotate/campaigns/{camp.pk}/", {"action": "start"}, follow=True)
    html = r.content.decode()
    assert "not enough annotators: 0 joined" in html and Campaign.objects.get(pk=camp.pk).status == "draft"
    client.post(f"/annotate/campaigns/{camp.pk}/", {"action": "invite"})
    assert camp.invites.count() == 1
    for i in range(3):
        invites.add_member(camp, make_user(f"a{i}"))
    client.post(f"/annotate/campaigns/{camp.pk}/", {"action": "start"})
    assert Campaign.objects.get(pk=camp.pk).status == "active"
    page = client.get(f"/annotate/campaigns/{camp.pk}/results/")
    assert page.status_code == 200 and "results-data" in page.content.decode()
    data = client.get(f"/annotate/campaigns/{camp.pk}/results.json").json()
    assert data["bradley_terry"]["systems"] == camp.systems
    r = client.post(f"/annotate/campaigns/{camp.pk}/reward-model/", {"name": "rm"}, follow=True)
    assert "need at least 4 decided pairwise judgments" in r.content.decode()
    assert client.get("/annotate/leaderboard/").status_code == 200


def test_malformed_upload_through_the_form_imports_nothing(client, researcher):
    from django.core.files.uploadedfile import SimpleUploadedFile

    client.force_login(researcher)
    body = (
        SECRET_UPLOAD.splitlines()[0] + "\n" + '{"prompt": "x", "outputs": {"A": "y", "B": 5}}\n'
    ).encode()
    r = client.post("/annotate/campaigns/upload/", {"name": "u", "kind": "pairwise", "overlap": "1",
                    "file": SimpleUploadedFile("data.jsonl", body)})  # fmt: skip
    html = r.content.decode()
    assert (
        r.status_code == 400
        and "Nothing was imported" in html
        and "line 2, field &#x27;outputs.B&#x27;" in html
    )
    assert Campaign.objects.count() == 0
    r = client.post("/annotate/campaigns/upload/", {"name": "u", "kind": "pairwise", "overlap": "1",
                    "file": SimpleUploadedFile("data.jsonl", SECRET_UPLOAD.encode())})  # fmt: skip
    assert r.status_code == 302 and Campaign.objects.get().items.count() == 4


def _upload(client, body: bytes, **extra):
    from django.core.files.uploadedfile import SimpleUploadedFile

    post = {"name": "u", "kind": "pairwise", "overlap": "1", "file": SimpleUploadedFile("d.jsonl", body)}
    post.update(extra)
    return client.post("/annotate/campaigns/upload/", post)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # Issue 14: each of these was a 500 (and could half-import); now a 400 naming line and field.
        (
            b'{"prompt": "p", "outputs": {"a": "x", "b": "y"}, "metrics": {"a": {"m": NaN}}}\n',
            "line 1, field &#x27;metrics.a.m&#x27;: NaN is not allowed",
        ),
        (
            b'{"prompt": "p", "outputs": {"a": "x", "b": "y"}, "metrics": {"b": {"m": -Infinity}}}\n',
            "line 1, field &#x27;metrics.b.m&#x27;: -Infinity is not allowed",
        ),
        (
            b'{"prompt": "p", "outputs": {"a": "x", "b": "y"}, "metrics": {"a": {"m": 1e999}}}\n',
            "line 1, field &#x27;metrics.a.m&#x27;: must be a finite number",
        ),
        (
            b'{"prompt": "p", "outputs": {"' + b"s" * 5000 + b'": "x", "b": "y"}}\n',
            "line 1, field &#x27;outputs.ssss",
        ),
        (
            b'{"prompt": "p", "outputs": {"a": "x", "b": "y"}}\n{"prompt": "nul \\u0000 here", "outputs": {"a": "x", "b": "y"}}\n',
            "line 2, field &#x27;prompt&#x27;: contains a NUL character",
        ),
        (
            b'{"prompt": "p", "outputs": {"a": "x\\u0000", "b": "y"}}\n',
            "field &#x27;outputs.a&#x27;: contains a NUL",
        ),
        # Issue 17: upload limits.
        (b"", "the file is empty"),
        (b"\n  \n", "the file is empty"),
        (
            b'{"prompt": "caf\xe9", "outputs": {"a": "x", "b": "y"}}\n',
            "line 1: the file is not UTF-8 text (byte 15)",
        ),
    ],
)
def test_bad_uploads_are_a_400_naming_line_and_field_and_import_nothing(client, researcher, body, expected):
    client.force_login(researcher)
    r = _upload(client, body)
    html = r.content.decode()
    assert r.status_code == 400 and "Nothing was imported" in html and expected in html, html[-600:]
    assert Campaign.objects.count() == 0 and Item.objects.count() == 0


def test_upload_caps_systems_items_lines_and_size(client, researcher, settings):
    client.force_login(researcher)
    # 1,000 systems in a 20 KB file created 499,500 items; the cap stops it at the 51st system.
    many = json.dumps({"prompt": "p", "outputs": {f"s{i}": "x" for i in range(1000)}}).encode() + b"\n"
    r = _upload(client, many)
    assert r.status_code == 400 and "1000 outputs, more than the limit of 50 systems" in r.content.decode()
    spread = b"".join(
        json.dumps({"prompt": f"p{i}", "outputs": {f"s{i}": "x", f"t{i}": "y"}}).encode() + b"\n"
        for i in range(30)
    )
    r = _upload(client, spread)
    assert (
        r.status_code == 400
        and "line 26, field &#x27;outputs&#x27;: system &#x27;s25&#x27; is system number 51"
        in r.content.decode()
    )
    settings.ANNOTATION_MAX_ITEMS = 10
    twelve = b"".join(
        json.dumps({"prompt": f"p{i}", "outputs": {"a": "x", "b": "y", "c": "z"}}).encode() + b"\n"
        for i in range(4)
    )  # 3 pairs per line: line 4 reaches 12 items
    r = _upload(client, twelve)
    assert r.status_code == 400 and "line 4: the campaign would have more than 10 items" in r.content.decode()
    settings.ANNOTATION_MAX_UPLOAD_LINES = 3
    r = _upload(client, twelve)
    assert r.status_code == 400 and "line 4: too many lines (limit 3" in r.content.decode()
    settings.ANNOTATION_MAX_UPLOAD_BYTES = 100
    r = _upload(client, twelve)
    assert r.status_code == 400 and "file too large" in r.content.decode()
    assert Campaign.objects.count() == 0 and Item.objects.count() == 0
    settings.ANNOTATION_MAX_UPLOAD_BYTES = 10_000
    settings.ANNOTATION_MAX_UPLOAD_LINES = 10
    settings.ANNOTATION_MAX_ITEMS = 12
    r = _upload(client, twelve)
    assert r.status_code == 302 and Campaign.objects.get().items.count() == 12  # at the limits: accepted


def test_annotator_sees_special_tokens_as_markers_and_no_draft_wording(client, annotator):
    data = json.dumps(
        {"prompt": "Continue:<|endoftext|>", "outputs": {"X": "Nice.<|endoftext|><pad>", "Y": "Bad</s>"}}
    )
    camp = uploads.create_campaign_from_upload("tokens", data, overlap=1)
    invites.add_member(camp, annotator)
    client.force_login(annotator)
    html = client.get(f"/annotate/c/{camp.pk}/").content.decode()  # not started yet
    assert "not started yet" in html and "draft" not in html.lower()
    campaigns.start_campaign(camp)
    html = client.get(f"/annotate/c/{camp.pk}/").content.decode()
    assert (
        "⟦end of text⟧" in html
        and "⟦padding⟧" in html
        and "<|endoftext|>" not in html
        and "<pad>" not in html
    )
    assert "draft" not in html.lower()
    campaigns.close_campaign(camp)
    html = client.get(f"/annotate/c/{camp.pk}/").content.decode()
    assert "has ended" in html and "draft" not in html.lower()


def test_owner_previews_items_annotators_cannot(client, researcher, annotator):
    data = json.dumps({"prompt": "Prompt<|endoftext|>", "outputs": {"SYS_A": "first <b>bold</b>", "SYS_B": "second</s>"},
                       "metrics": {"SYS_A": {"score": 0.5}}})  # fmt: skip
    camp = uploads.create_campaign_from_upload("preview me", data, overlap=1)
    client.force_login(researcher)
    assert 'id="preview-link"' in client.get(f"/annotate/campaigns/{camp.pk}/").content.decode()
    r = client.get(f"/annotate/campaigns/{camp.pk}/preview/")
    html = r.content.decode()
    assert r.status_code == 200 and html.count('class="card preview-item"') == 1
    assert "first &lt;b&gt;bold&lt;/b&gt;" in html and "⟦end of text⟧" in html and "SYS_A" in html
    client.force_login(annotator)
    invites.add_member(camp, annotator)
    r = client.get(f"/annotate/campaigns/{camp.pk}/preview/")
    assert r.status_code in (302, 403) and "SYS_A" not in r.content.decode()
