"""What a checkpoint directory holds, named once for everyone who reads or writes one.

Why: the trainer writes ``checkpoints/<name>/state.pt``, the checkpoint export reads it back and the
web's gold jobs look for it on disk before exporting. Three copies of the file name could drift
apart; the web process must not pay for torch to learn a file name, so this module imports nothing.
"""

from __future__ import annotations

__all__ = ["STATE_FILE"]

#: The file in every checkpoint directory the trainer writes: the whole training state, tensors and
#: plain values only (loaded with ``weights_only=True``).
STATE_FILE = "state.pt"
