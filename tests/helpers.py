"""Plain helpers shared by tests and benchmarks: no pytest, no Django at import time, so
``bench/outage.py`` can use the same proxy and configs as the tests that assert the same faults.

- ``TcpProxy``: a loopback TCP relay the caller cuts, hangs and restores (outages of PostgreSQL,
  Redis or the dashboard, injected between two real processes).
- ``TINY``: the smallest valid run config, for tests that create runs but never train them.
- ``tiny_run_config``: a tiny run that a real worker trains in seconds.
- ``run_dir_points``: the metric points the engine wrote to a run directory (the ground truth the
  database must match).
"""

from __future__ import annotations

import json
import math
import socket
import struct
import threading
from pathlib import Path
from typing import Any

TINY: dict[str, Any] = {
    "name": "tiny",
    "model": {"name_or_path": "builtin:tiny-gpt2"},
    "task": {"id": "synthetic_increasing_numbers"},
    "reward": {"id": "increasing_numbers"},
    "train": {"n_iters": 2, "prompts_per_iter": 4},
}


def tiny_run_config(n_iters: int, name: str, *, save_every: int = 1, **over: Any) -> dict[str, Any]:
    """A PPO run of the tiny GPT-2 on CPU, small enough for a worker to train an iteration in well
    under a second; ``over`` replaces whole top-level sections (``model=...``)."""
    cfg: dict[str, Any] = {
        "name": name,
        "model": {"name_or_path": "builtin:tiny-gpt2", "device": "cpu"},
        "task": {"id": "synthetic_increasing_numbers", "max_train_samples": 8, "max_eval_samples": 2},
        "reward": {"id": "increasing_numbers"},
        "rollout": {"max_new_tokens": 4, "batch_size": 2},
        "algorithm": {"id": "ppo", "n_epochs": 1, "minibatch_size": 2},
        "train": {
            "n_iters": n_iters,
            "prompts_per_iter": 2,
            "eval_every": 0,
            "save_every": save_every,
            "log_samples": 2,
            "save_final_model": False,
        },
        "eval": {"generation": {"max_new_tokens": 4, "do_sample": False}},
    }
    cfg.update(over)
    return cfg


def run_dir_points(run_dir: Path | str) -> dict[tuple[str, int], float | None]:
    """``{(key, step): value}`` from the run directory's ``metrics.jsonl``, which the engine writes
    synchronously: what a sink that stores points exactly once must end up with. A value the engine
    wrote as null (a NaN) or a non-finite number is ``None``; non-numeric fields are not points."""
    out: dict[tuple[str, int], float | None] = {}
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        obj = json.loads(line)
        step = obj.pop("step")
        obj.pop("phase", None)
        for key, value in obj.items():
            if value is None:
                out[(key, step)] = None
            elif isinstance(value, int | float):
                out[(key, step)] = float(value) if math.isfinite(value) else None
    return out


# SO_LINGER with a zero timeout: close() sends RST instead of FIN (the peer sees "connection reset").
_LINGER_RESET = struct.pack("ii", 1, 0)


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to ``upstream`` (an address, or a loopback port).

    ``cut()``: reset every open connection and every new one at once (a dead server or a network
    partition: the client's next read or connect fails; the listening port stays ours, so nothing
    else can take it while the outage lasts); ``hang()``: accept and read, never answer (a hung
    server); ``restore()``: forward again. ``accepted`` counts connections forwarded, ``refused``
    those reset while cut."""

    def __init__(self, upstream: tuple[str, int] | int):
        self.upstream = ("127.0.0.1", upstream) if isinstance(upstream, int) else upstream
        self.mode = "forward"
        self.accepted = 0
        self.refused = 0
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._server = socket.socket()
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(64)
        self.port: int = self._server.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, name=f"tcp-proxy-{self.port}", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            if self.mode == "cut":
                self.refused += 1
                _reset(client)
                continue
            if self.mode == "hang":
                with self._lock:
                    self._open.append(client)
                threading.Thread(target=self._swallow, args=(client,), daemon=True).start()
                continue
            try:
                up = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                self.accepted += 1
                self._open += [client, up]
            for a, b in ((client, up), (up, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    @staticmethod
    def _swallow(client: socket.socket) -> None:
        try:
            while client.recv(65536):
                pass
        except OSError:
            pass

    def _drop_all(self) -> None:
        with self._lock:
            conns, self._open = self._open, []
        for s in conns:
            _reset(s)

    def cut(self) -> None:
        self.mode = "cut"
        self._drop_all()

    def hang(self) -> None:
        self.mode = "hang"
        self._drop_all()

    def restore(self) -> None:
        self.mode = "forward"

    def close(self) -> None:
        self._closed = True
        self._server.close()
        self._drop_all()


def _reset(s: socket.socket) -> None:
    """Close with RST: the peer sees the connection reset, mid-request or not. The shutdown wakes a
    pump thread blocked in ``recv`` on this socket (a bare close would wait for it)."""
    for op in (
        lambda: s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET),
        lambda: s.shutdown(socket.SHUT_RDWR),
        s.close,
    ):
        try:
            op()
        except OSError:
            pass
