"""Benchmark (not a test): next-item + submit round trips with many concurrent annotators.

Each annotator is a thread with its own PostgreSQL connection doing what the annotate page does:
``next_item`` (reserve the least-judged eligible item) then ``record_judgment`` (validate token,
store, count), until the campaign is exhausted. Reports throughput, latency percentiles, and checks
the invariants: no item over its overlap, every accepted judgment stored, no leaked reservations.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/grue_bench .venv/bin/python bench/annotation.py \
        --annotators 50 --items 400 --overlap 3

The database is migrated if needed; the benchmark's campaign and users are deleted afterwards
(``--keep`` keeps them). Threads share one Python process (GIL), so latencies include Python-side
queueing as a real multi-threaded server would; the target is p95 < 100 ms per operation.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = max(0, min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1)))))
    return xs[k]


def run_share(
    campaign_id: int, user_ids: list[int], seed: int, think: float, start_at: float
) -> dict[str, list]:
    """One process's annotators, one thread each; returns latencies and accepted (user, item) pairs."""
    from django.contrib.auth.models import User
    from django.db import connection

    from annotation import assignment
    from annotation.models import Campaign

    camp = Campaign.objects.get(pk=campaign_id)
    users = list(User.objects.filter(pk__in=user_ids))
    connection.close()
    out: dict[str, list] = {"next": [], "submit": [], "trip": [], "accepted": [], "errors": []}
    lock = threading.Lock()

    def annotator(user, rng: random.Random) -> None:
        n, s, t, acc = [], [], [], []
        try:
            time.sleep(max(0.0, start_at - time.time()))
            while True:
                if think > 0:
                    time.sleep(rng.expovariate(1.0 / think))  # reading the item
                t0 = time.perf_counter()
                a = assignment.next_item(camp, user)
                t1 = time.perf_counter()
                if a is None:
                    break
                assignment.record_judgment(
                    user, a.token, item_id=a.item_id, choice=rng.choice(["left", "right", "tie"])
                )
                t2 = time.perf_counter()
                n.append(t1 - t0)
                s.append(t2 - t1)
                t.append(t2 - t0)
                acc.append((user.pk, a.item_id))
        except Exception as exc:  # noqa: BLE001 - reported by main
            out["errors"].append(f"{type(exc).__name__}: {exc}")
        finally:
            connection.close()
            with lock:
                out["next"] += n
                out["submit"] += s
                out["trip"] += t
                out["accepted"] += acc

    threads = [
        threading.Thread(target=annotator, args=(u, random.Random(seed + i))) for i, u in enumerate(users)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--annotators", type=int, default=50)
    ap.add_argument("--items", type=int, default=400, help="pairwise items (prompts x 1 pair)")
    ap.add_argument("--overlap", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", action="store_true", help="keep the campaign and users")
    ap.add_argument("--processes", type=int, default=1, help="spread the annotator threads over N processes")
    ap.add_argument(
        "--think", type=float, default=0.0, help="mean think time (s) before each item; 0 = stress"
    )
    ap.add_argument("--json", help="also write the results to this JSON file")
    ap.add_argument("--systems", type=int, default=2, help="systems per prompt (all pairs: items per prompt)")
    ap.add_argument(
        "--assignment", choices=["uniform", "adaptive"], default="uniform", help="campaign option"
    )
    args = ap.parse_args()

    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    from django.contrib.auth.models import User

    from annotation import campaigns, invites, uploads
    from annotation.models import Assignment, Campaign, Item, Judgment

    tag = f"bench-{int(time.time())}"
    pairs_per_prompt = args.systems * (args.systems - 1) // 2
    lines = "\n".join(
        json.dumps(
            {
                "prompt": f"bench prompt {i}",
                "outputs": {f"sys{k}": f"answer {k} {i}" for k in range(args.systems)},
            }
        )
        for i in range(-(-args.items // pairs_per_prompt))
    )
    camp = uploads.create_campaign_from_upload(
        tag, lines, overlap=args.overlap, assignment_mode=args.assignment
    )
    users = [User.objects.create_user(f"{tag}-{i}", password=None) for i in range(args.annotators)]
    for u in users:
        invites.add_member(camp, u)
    campaigns.start_campaign(camp)
    connection.close()

    user_ids = [u.pk for u in users]
    n_proc = max(1, min(args.processes, args.annotators))
    shares = [user_ids[i::n_proc] for i in range(n_proc)]
    start = time.perf_counter()
    if n_proc == 1:
        out = run_share(camp.pk, shares[0], args.seed, args.think, start_at=time.time())
    else:
        import multiprocessing as mp

        ctx = mp.get_context("fork")
        q = ctx.Queue()
        start_at = time.time() + 1.0  # all processes begin together
        procs = [
            ctx.Process(
                target=lambda sh=sh, k=k: q.put(
                    run_share(camp.pk, sh, args.seed + 1000 * k, args.think, start_at)
                )
            )
            for k, sh in enumerate(shares)
        ]
        for pr in procs:
            pr.start()
        parts = [q.get() for _ in procs]
        for pr in procs:
            pr.join()
        out = {k: [x for part in parts for x in part[k]] for k in parts[0]}
    wall = time.perf_counter() - start - (1.0 if n_proc > 1 else 0.0)
    lat_next, lat_submit, lat_trip = out["next"], out["submit"], out["trip"]
    accepted = [tuple(x) for x in out["accepted"]]
    errors = out["errors"]

    stored = list(Judgment.objects.filter(campaign=camp).values_list("annotator_id", "item_id"))
    per_item = Counter(i for _, i in stored)
    items = list(Item.objects.filter(campaign=camp).values_list("id", "judgment_count", "slots_taken"))
    over = sum(1 for i, jc, _ in items if per_item[i] > args.overlap or jc > args.overlap)
    leaked = sum(1 for _, jc, st in items if st != jc)
    lost = len(set(accepted) - set(stored))
    extra = len(set(stored) - set(accepted))
    open_left = Assignment.objects.filter(campaign=camp, status="open").count()
    res = {
        "annotators": args.annotators,
        "items": args.items,
        "overlap": args.overlap,
        "processes": n_proc,
        "think_s": args.think,
        "round_trips": len(lat_trip),
        "wall_s": round(wall, 2),
        "throughput_round_trips_per_s": round(len(lat_trip) / wall, 1),
        "next_item_ms": {q: round(1000 * pct(lat_next, q), 1) for q in (50, 95, 99)},
        "submit_ms": {q: round(1000 * pct(lat_submit, q), 1) for q in (50, 95, 99)},
        "round_trip_ms": {q: round(1000 * pct(lat_trip, q), 1) for q in (50, 95, 99)},
        "mean_round_trip_ms": round(1000 * statistics.mean(lat_trip), 1) if lat_trip else None,
        "over_assigned_items": over,
        "lost_judgments": lost,
        "unexpected_judgments": extra,
        "leaked_reservations": leaked,
        "open_assignments_left": open_left,
        "complete_items": sum(1 for i, _, _ in items if per_item[i] == args.overlap),
        "errors": errors[:5],
    }
    print(json.dumps(res, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    if not args.keep:
        Campaign.objects.filter(pk=camp.pk).delete()
        User.objects.filter(username__startswith=f"{tag}-").delete()
    ok = not errors and over == 0 and lost == 0 and extra == 0 and leaked == 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
