"""The rollout-tree viewer: ``llm-marl view RUN_DIR`` (see llm_marl/runs/recording.py).

:func:`write_page` writes ONE self-contained HTML file (``RUN_DIR/viewer.html`` by default):
scripts and styles inline, nothing fetched from the network. Pick a step (a recorded train batch
or an evaluation) and an item; the tree is drawn root left, one column per turn, expanded joint
actions linked to their children and early-terminated nodes marked; clicking a node shows the
agents' prompts and K answers side by side with each answer's return, reference KL, advantage
after the baseline and after normalization (rows coloured by advantage), and the node's joint
actions with rewards, returns and reward details. A panel draws every curve of
``metrics.jsonl`` with the current step marked.

Large runs stay fast: each step's trees sit in their own inert block (gzipped, base64) that is
inflated and split into lines only when that step is opened, and only the chosen tree's line is
parsed. :func:`serve` (``llm-marl view RUN_DIR --serve``) serves the page on 127.0.0.1 without
the trees inside it: the page fetches one step's file from ``rollouts/`` when it is opened, and
reloading the page picks up steps recorded since.
"""

from llm_marl.viewer.page import build_page, read_metrics, write_page
from llm_marl.viewer.server import make_server, serve

__all__ = ["build_page", "read_metrics", "write_page", "make_server", "serve"]
