"""``llm-marl serve``: trained (or fresh) agents behind an OpenAI-compatible endpoint.

::

    llm-marl serve runs/x/final                      # the agents a run trained (full models or adapters)
    llm-marl serve --model smollm2-135m --agents writer,editor --lora_r 8   # a fresh LoRA team
    llm-marl serve --model tiny --agents a,b --port 8001
    llm-marl serve runs/x/final --host 0.0.0.0 --api-key "$KEY"   # beyond this machine: a key is required

:func:`add_arguments` declares the flags (the parser in :mod:`llm_marl.cli` calls it, importing
nothing heavy); :func:`run` loads the agents (:mod:`~llm_marl.serve.agents`), builds the app
(:mod:`~llm_marl.serve.app`) and serves it until Ctrl-C. The key may also come from the
environment variable ``LLM_MARL_API_KEY`` (a flag's value shows in the process list).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

__all__ = ["add_arguments", "run"]

API_KEY_VARIABLE = "LLM_MARL_API_KEY"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``llm-marl serve``."""
    parser.add_argument("source", nargs="?", help="a run's final/ folder (one folder per agent: full models or LoRA adapters), or a model folder")
    parser.add_argument("--model", help="instead of SOURCE: 'tiny', a named model (smollm2-135m; `llm-marl models`), a folder or a hub id, served once per agent (--agents)")
    parser.add_argument("--agents", help="comma-separated agent names, one model name each (with --model: required; with SOURCE: a subset of its agents)")
    parser.add_argument("--lora_r", "--lora-r", dest="lora_r", type=int, metavar="R", help="with --model: one base and a fresh LoRA adapter of rank R per agent (a team sharing one decode loop)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; any other needs --api-key)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000; 0: any free port)")
    parser.add_argument("--api-key", "--api_key", dest="api_key", help=f"require 'Authorization: Bearer KEY' on every request (or set {API_KEY_VARIABLE})")
    parser.add_argument("--device", help="where the models run (e.g. cuda; default: the CPU)")
    parser.add_argument("--threads", type=int, metavar="N", help="torch threads (default: those the machine leaves free)")
    parser.add_argument("--max-queue", "--max_queue", dest="max_queue", type=int, default=256, metavar="N", help="requests waiting or decoding at most; more get 429 (default 256)")
    parser.add_argument("--max-batch-rows", "--max_batch_rows", dest="max_batch_rows", type=int, default=64, metavar="N", help="answers decoded together at most (default 64)")
    parser.add_argument("--max-body-bytes", "--max_body_bytes", dest="max_body_bytes", type=int, default=1_048_576, metavar="N", help="largest request body; larger gets 413 (default 1 MiB)")
    parser.add_argument("--timeout", dest="request_timeout", type=float, default=300.0, metavar="SECONDS", help="per-request timeout; past it, 504 (default 300)")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")


def config_of(ns: argparse.Namespace) -> Any:
    """The :class:`~llm_marl.serve.config.ServeConfig` of the parsed flags (a usage error for bad values)."""
    from llm_marl.serve.config import ServeConfig

    key = ns.api_key or os.environ.get(API_KEY_VARIABLE) or None
    try:
        return ServeConfig(
            host=ns.host, port=ns.port, api_key=key, max_queue=ns.max_queue, max_batch_rows=ns.max_batch_rows,
            max_body_bytes=ns.max_body_bytes, request_timeout=ns.request_timeout,
        )
    except ValueError as exc:
        raise ServeUsageError(f"serve: {exc}") from None


class ServeUsageError(ValueError):
    """A flag of ``llm-marl serve`` that cannot be used."""


def _missing_stack() -> str | None:
    for module in ("starlette", "uvicorn"):
        try:
            __import__(module)
        except ImportError:
            return module
    return None


def run(ns: argparse.Namespace) -> int:
    """Serve until Ctrl-C; returns the exit status (2 for a bad flag or model source, said in one line)."""
    from llm_marl.assembly import AssemblyError

    try:
        return _run(ns)
    except (ServeUsageError, AssemblyError) as exc:
        if getattr(ns, "debug", False):
            raise
        print(f"llm-marl: error: {exc}", file=sys.stderr)
        return 2


def _run(ns: argparse.Namespace) -> int:
    config = config_of(ns)
    missing = _missing_stack()
    if missing:
        raise ServeUsageError(f"serve needs {missing}: pip install 'llm_marl[serve]'")
    if ns.threads is not None:
        if ns.threads < 1:
            raise ServeUsageError(f"--threads must be >= 1, got {ns.threads}")
        import torch

        torch.set_num_threads(ns.threads)
    from llm_marl.serve.agents import load_agents
    from llm_marl.serve.app import create_app
    from llm_marl.serve.scheduler import Scheduler
    from llm_marl.serve.server import bind, serve_forever

    agents = [a for a in (ns.agents or "").split(",") if a] or None
    loaded = load_agents(ns.source, model=ns.model, agents=agents, lora_r=ns.lora_r, device=ns.device)
    for line in loaded.lines:
        print(f"llm-marl serve: {line}")
    scheduler = Scheduler(max_queue=config.max_queue, max_batch_rows=config.max_batch_rows)
    app = create_app(loaded, scheduler, config)
    try:
        sock = bind(config.host, config.port)
    except OSError as exc:
        raise ServeUsageError(f"serve: cannot listen on {config.host}:{config.port} ({exc.strerror or exc})") from None
    port = sock.getsockname()[1]
    shown = f"[{config.host}]" if ":" in config.host else config.host
    auth = "Bearer key required" if config.api_key else "no key: this machine only"
    print(f"llm-marl serve: agents {', '.join(loaded.names)} on http://{shown}:{port}/v1 ({auth}); Ctrl-C stops", flush=True)
    serve_forever(app, sock)
    return 0
