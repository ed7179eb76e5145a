"""Serving trained agents over an OpenAI-compatible HTTP endpoint (``llm-marl serve``).

- :mod:`~llm_marl.serve.protocol`: the OpenAI wire format (requests, responses, errors), pure;
- :mod:`~llm_marl.serve.app`: the ASGI application and its routes;
- :mod:`~llm_marl.serve.scheduler`: the batching scheduler (concurrent requests share decode steps);
- :mod:`~llm_marl.serve.batch`: one shared decode of several requests through the policy's loop;
- :mod:`~llm_marl.serve.agents`: which policies answer (a run's ``final/``, a model, a LoRA team);
- :mod:`~llm_marl.serve.command`: ``llm-marl serve``.

The web stack is Starlette on uvicorn (extra ``serve``: ``pip install llm_marl[serve]``).
Starlette is a small, well-kept ASGI toolkit (Encode; the core of FastAPI) with streaming
responses and no schema layer we would not use (requests are validated by
:mod:`~llm_marl.serve.protocol`, whose errors must be OpenAI's, not a framework's); uvicorn is
the reference ASGI server (h11, graceful shutdown, connection limits). Both are pure Python,
install from PyPI in seconds and pull only anyio, h11 and click.

Importing this package imports neither torch nor the web stack.
"""
