"""Pages through the Django test client: the researcher/annotator wall, invites, judging, uploads."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User

from annotation import services
from annotation.models import Campaign, Judgment
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
    camp = services.create_campaign_from_upload(name, SECRET_UPLOAD, overlap=overlap)
    for u in members:
        services.add_member(camp, u)
    services.start_campaign(camp)
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
    a = services.next_item(camp, member)
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
    a = services.next_item(camp, annotator)  # the open assignment the page showed
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


def test_invite_link_creates_annotator_only_account(client, researcher):
    camp = services.create_campaign_from_upload("inv", SECRET_UPLOAD, overlap=1)
    inv = services.create_invite(camp, researcher, max_uses=1)
    assert client.get(f"/annotate/join/{inv.token}/").status_code == 200
    r = client.post(f"/annotate/join/{inv.token}/", {"username": "newbie", "password": "a-long-password"})
    assert r.status_code == 302 and r["Location"] == f"/annotate/c/{camp.pk}/"
    user = User.objects.get(username="newbie")
    assert list(user.groups.values_list("name", flat=True)) == ["annotator"] and not user.is_staff
    assert services.is_member(camp, user)
    client.logout()
    r = client.get(f"/annotate/join/{inv.token}/")
    assert r.status_code == 404 and "used up" in r.content.decode()
    assert client.get("/annotate/join/not-a-token/").status_code == 404


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
        services.add_member(camp, make_user(f"a{i}"))
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
