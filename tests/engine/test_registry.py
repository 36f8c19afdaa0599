"""The registries fill themselves on first lookup; the web server makes its first lookups from several
threads at once, which must all see every built-in component."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# In a fresh interpreter (the built-ins not yet imported), eight threads look up at the same moment.
_CONCURRENT_FIRST_LOOKUPS = """
import json, threading
from engine import registry
barrier = threading.Barrier(8)
seen = []
def look():
    barrier.wait()
    seen.append(("ppo" in registry.algorithms, len(registry.rewards.ids())))
threads = [threading.Thread(target=look) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(seen))
"""


def test_concurrent_first_lookups_all_see_the_builtins():
    out = subprocess.run(
        [sys.executable, "-c", _CONCURRENT_FIRST_LOOKUPS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(seen) == 8
    # Before the lock, every thread but the importing one saw an empty registry ("registered: ").
    assert all(has_ppo and n_rewards > 10 for has_ppo, n_rewards in seen), seen
