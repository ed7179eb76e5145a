"""``llm-marl serve`` against the real ``openai`` client, on tiny local models.

Two servers run for the module, each a real uvicorn server on a free port of 127.0.0.1: a LoRA
team (``writer`` and ``editor``, adapters made different on purpose, saved as a run's
``final/`` folder and served from it) and one full model (``solo``). What the server answers is
checked against a greedy decode written here (no KV cache, no shared loop), and every error of
docs/serving.md gets its status and OpenAI error body, after which the server still answers.
"""

from __future__ import annotations

import json
import threading

import httpx
import pytest
import torch

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from llm_marl.policies.lora_team import LoRATeam  # noqa: E402
from llm_marl.serve import protocol  # noqa: E402
from llm_marl.serve.agents import agents_in, load_agents  # noqa: E402
from llm_marl.serve.app import create_app  # noqa: E402
from llm_marl.serve.config import ServeConfig  # noqa: E402
from llm_marl.serve.prompts import chat_prompt_ids, text_prompt_ids  # noqa: E402
from llm_marl.serve.scheduler import Scheduler  # noqa: E402
from llm_marl.serve.server import BackgroundServer  # noqa: E402

HELLO = [{"role": "user", "content": "The story of the"}]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return tiny_model_dir  # tests/conftest.py: built once a session


@pytest.fixture(scope="module")
def final(tiny, tmp_path_factory):
    """A run's final/ folder of a two-adapter team whose adapters differ (lora_B set from a seed)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(str(tiny))
    team = LoRATeam.from_model(base, AutoTokenizer.from_pretrained(str(tiny)), ["writer", "editor"], r=4, target_modules=["c_attn"])
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in team.model.named_parameters():
            if ".lora_B.writer." in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    folder = tmp_path_factory.mktemp("run") / "final"
    for agent, policy in team.policies.items():
        policy.save_pretrained(folder / agent)
    return folder


def _start(agents, **config):
    scheduler = Scheduler(max_queue=config.pop("max_queue", 256))
    server = BackgroundServer(create_app(agents, scheduler, ServeConfig(**config))).start()
    return server, scheduler


@pytest.fixture(scope="module")
def team_server(final):
    agents = load_agents(str(final))
    server, scheduler = _start(agents, max_body_bytes=4096)
    yield server, scheduler, agents
    server.stop()


@pytest.fixture(scope="module")
def solo_server(tiny):
    agents = load_agents(model=str(tiny), agents=["solo"])
    server, scheduler = _start(agents)
    yield server, scheduler, agents
    server.stop()


def _client(server, key="none"):
    return openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0, timeout=120)


def _greedy(policy, ids, steps):
    """Greedy tokens of ``policy`` after ``ids``: a full forward per token, no cache, no shared loop."""
    runner = policy.runner
    routes = policy._routes(1)
    tokens = []
    with torch.inference_mode():
        for _ in range(steps):
            row = torch.tensor([ids + tokens])
            logits = runner.forward({"input_ids": row, "attention_mask": torch.ones_like(row)}, routes).logits[0, -1]
            token = int(logits.argmax())
            if token in policy.eos_token_ids:
                break
            tokens.append(token)
    return tokens


def test_final_folder_is_served_as_its_agents(team_server, final):
    server, _, agents = team_server
    (final / "critic").mkdir(exist_ok=True)  # a run's central critic is not an agent
    (final / "critic" / "config.json").write_text("{}")
    assert agents_in(str(final)) == ["editor", "writer"]
    assert [m.id for m in _client(server).models.list()] == ["editor", "writer"]
    assert agents.policies["writer"].team is agents.policies["editor"].team  # one base, two adapters


def test_chat_completion_is_the_agents_own_greedy_answer(team_server):
    server, _, agents = team_server
    client = _client(server)
    answers = {}
    for agent in ("writer", "editor"):
        reply = client.chat.completions.create(model=agent, messages=HELLO, temperature=0, max_tokens=12)
        policy = agents.policies[agent]
        ids = chat_prompt_ids(policy, HELLO)
        expected = _greedy(policy, ids, 12)
        assert reply.choices[0].message.content == policy.tokenizer.decode(expected, skip_special_tokens=True)
        assert reply.choices[0].finish_reason == ("length" if len(expected) == 12 else "stop")
        assert reply.usage.prompt_tokens == len(ids) and reply.usage.completion_tokens == len(expected)
        assert reply.model == agent and reply.object == "chat.completion"
        answers[agent] = reply.choices[0].message.content
    assert answers["writer"] != answers["editor"]  # each request ran through its own adapter


def test_completion_with_prompts_and_n(solo_server):
    server, _, agents = solo_server
    policy = agents.policies["solo"]
    reply = _client(server).completions.create(model="solo", prompt=["Once upon a", "The"], max_tokens=5, n=2, temperature=0)
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    for prompt, choices in (("Once upon a", reply.choices[:2]), ("The", reply.choices[2:])):
        expected = policy.tokenizer.decode(_greedy(policy, text_prompt_ids(policy, prompt), 5), skip_special_tokens=True)
        assert [c.text for c in choices] == [expected, expected]  # temperature 0: both answers greedy
    assert reply.usage.prompt_tokens == len(text_prompt_ids(policy, "Once upon a")) + len(text_prompt_ids(policy, "The"))


def test_seed_repeats_an_answer_and_n_answers_differ(solo_server):
    server, _, _ = solo_server
    client = _client(server)

    def ask(seed):
        reply = client.chat.completions.create(model="solo", messages=HELLO, temperature=1.0, max_tokens=16, n=3, seed=seed)
        return [c.message.content for c in reply.choices]

    first = ask(7)
    assert ask(7) == first
    assert ask(8) != first
    assert len(set(first)) > 1  # n answers are n draws, not one answer repeated


def test_stop_cuts_the_answer_before_the_stop_string(solo_server):
    server, _, _ = solo_server
    client = _client(server)
    full = client.completions.create(model="solo", prompt="The story of the", max_tokens=24, temperature=0).choices[0].text
    stop = full[4:7]
    assert len(stop) == 3 and stop.strip()
    cut = client.completions.create(model="solo", prompt="The story of the", max_tokens=24, temperature=0, stop=[stop, "\u2603"]).choices[0]
    assert cut.text == full[: full.find(stop)] and cut.finish_reason == "stop"


def test_max_tokens_ends_with_length(solo_server):
    server, _, _ = solo_server
    client = _client(server)
    whole = client.completions.create(model="solo", prompt="The story of the", max_tokens=24, temperature=0)
    assert whole.usage.completion_tokens > 3  # the greedy answer runs past 3 tokens
    full = whole.choices[0]
    reply = client.completions.create(model="solo", prompt="The story of the", max_tokens=3, temperature=0)
    assert reply.usage.completion_tokens == 3 and reply.choices[0].finish_reason == "length"
    assert full.text.startswith(reply.choices[0].text)
    chat = client.chat.completions.create(model="solo", messages=HELLO, max_completion_tokens=3, temperature=0)
    assert chat.usage.completion_tokens == 3 and chat.choices[0].finish_reason == "length"
    assert full.finish_reason == "stop"  # the greedy answer ends by itself; min_tokens (vLLM's extension) keeps the end token away
    longer = whole.usage.completion_tokens + 3
    forced = client.completions.create(model="solo", prompt="The story of the", max_tokens=longer, temperature=0, extra_body={"min_tokens": longer})
    assert forced.usage.completion_tokens == longer and forced.choices[0].text.startswith(full.text)


def test_streaming_sends_the_answer_in_pieces_then_done(team_server):
    server, _, _ = team_server
    client = _client(server)
    whole = client.chat.completions.create(model="writer", messages=HELLO, max_tokens=10, seed=3).choices[0].message.content
    stream = client.chat.completions.create(model="writer", messages=HELLO, max_tokens=10, seed=3, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(pieces) == whole and len(pieces) > 1
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= len(pieces)
    raw = httpx.post(f"{server.base_url}/chat/completions", json={"model": "writer", "messages": HELLO, "max_tokens": 4, "stream": True}, timeout=60)
    events = [e for e in raw.text.split("\n\n") if e]
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)
    assert json.loads(events[0][6:])["object"] == "chat.completion.chunk"


def test_concurrent_requests_are_decoded_in_one_batch(team_server):
    server, scheduler, _ = team_server
    client = _client(server)
    replies = {}

    def ask(i):
        agent = ("writer", "editor")[i % 2]
        replies[i] = client.chat.completions.create(model=agent, messages=[{"role": "user", "content": f"Item {i}"}], max_tokens=6)

    before = len(scheduler.records)
    with scheduler.hold():
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        assert scheduler.wait_pending(4)
    for thread in threads:
        thread.join(120)
    assert sorted(replies) == [0, 1, 2, 3]
    batches = list(scheduler.records)[before:]
    assert [(b.jobs, b.rows) for b in batches] == [(4, 4)]
    assert set(batches[0].agents) == {"writer", "editor"}  # two adapters, one decode loop


def _status(call):
    with pytest.raises(openai.APIStatusError) as caught:
        call()
    return caught.value.status_code, caught.value.body


def test_every_bad_request_gets_its_error_and_the_server_goes_on(team_server):
    server, _, agents = team_server
    client = _client(server)
    chat = client.chat.completions.create

    def good():
        assert chat(model="writer", messages=HELLO, max_tokens=2).choices[0].message.content is not None

    status, body = _status(lambda: chat(model="nobody", messages=HELLO))
    assert status == 404 and body["code"] == "model_not_found" and body["param"] == "model"
    good()
    for kwargs, param in (
        ({"temperature": 2.5}, "temperature"),
        ({"top_p": -0.1}, "top_p"),
        ({"n": 0}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"seed": "x"}, "seed"),
        ({"logprobs": True}, "logprobs"),
        ({"extra_body": {"surprise": 1}}, "surprise"),
    ):
        status, body = _status(lambda: chat(model="writer", messages=HELLO, **kwargs))
        assert (status, body["type"], body["param"]) == (400, "invalid_request_error", param), kwargs
        good()
    status, body = _status(lambda: chat(model="writer", messages=[{"role": "wizard", "content": "x"}]))
    assert status == 400 and body["param"] == "messages"
    good()
    context = agents.policies["writer"].context_length
    long_prompt = [{"role": "user", "content": " ".join(["word"] * 300)}]
    assert len(chat_prompt_ids(agents.policies["writer"], long_prompt)) > context
    status, body = _status(lambda: chat(model="writer", messages=long_prompt, max_tokens=2))
    assert status == 400 and body["code"] == "context_length_exceeded"
    good()
    status, body = _status(lambda: chat(model="writer", messages=HELLO, max_tokens=context))
    assert status == 400 and body["code"] == "context_length_exceeded" and body["param"] == "max_tokens"
    good()
    status, body = _status(lambda: chat(model="writer", messages=[{"role": "user", "content": "x" * 5000}]))
    assert status == 413 and body["code"] == "request_too_large"
    good()
    raw = httpx.post(f"{server.base_url}/chat/completions", content=b'{"model": "writer", "messages": [', headers={"content-type": "application/json"})
    assert raw.status_code == 400 and "not valid JSON" in raw.json()["error"]["message"]
    raw = httpx.post(f"{server.base_url}/chat/completions", content=b"\xff\xfe", headers={"content-type": "application/json"})
    assert raw.status_code == 400 and "UTF-8" in raw.json()["error"]["message"]
    raw = httpx.get(f"{server.base_url}/embeddings")
    assert raw.status_code == 404 and set(raw.json()["error"]) == {"message", "type", "param", "code"}
    good()


def test_a_failing_batch_is_a_500_for_its_requests_only(team_server, monkeypatch):
    from llm_marl.serve import scheduler as scheduler_module

    server, _, _ = team_server
    real = scheduler_module.decode_jobs
    calls = []

    def fails_once(jobs, lock=None):
        calls.append(len(jobs))
        if len(calls) == 1:
            raise RuntimeError("a decode that fails")
        return real(jobs, lock)

    monkeypatch.setattr(scheduler_module, "decode_jobs", fails_once)
    status, body = _status(lambda: _client(server).chat.completions.create(model="writer", messages=HELLO, max_tokens=2))
    assert status == 500 and body["type"] == "server_error" and "a decode that fails" in body["message"]
    assert _client(server).chat.completions.create(model="writer", messages=HELLO, max_tokens=2).choices


def test_full_queue_is_429_and_a_timeout_is_504(solo_server):
    _, _, agents = solo_server
    server, scheduler = _start(agents, max_queue=1, request_timeout=1.0)
    try:
        client = _client(server)
        outcome = {}

        def first():
            outcome["first"] = _status(lambda: client.chat.completions.create(model="solo", messages=HELLO, max_tokens=2))

        with scheduler.hold():  # the worker takes nothing: the first request waits past its timeout
            thread = threading.Thread(target=first)
            thread.start()
            assert scheduler.wait_pending(1)
            status, body = _status(lambda: client.chat.completions.create(model="solo", messages=HELLO, max_tokens=2))
            assert status == 429 and body["type"] == "rate_limit_error"
            status, _ = _status(lambda: client.chat.completions.create(model="solo", messages=HELLO, max_tokens=2, stream=True))
            assert status == 429  # a stream is refused before it starts, with the status itself
            thread.join(60)
        assert outcome["first"][0] == 504 and outcome["first"][1]["code"] == "timeout"
        assert scheduler.active == 0
        assert client.chat.completions.create(model="solo", messages=HELLO, max_tokens=2).choices
    finally:
        server.stop()


def test_api_key_is_required_when_set(solo_server):
    _, _, agents = solo_server
    server, _ = _start(agents, api_key="s3cret")
    try:
        status, body = _status(lambda: _client(server, key="wrong").models.list())
        assert status == 401 and body["code"] == "invalid_api_key"
        assert [m.id for m in _client(server, key="s3cret").models.list()] == ["solo"]
    finally:
        server.stop()
    with pytest.raises(ValueError, match="needs --api-key"):
        ServeConfig(host="0.0.0.0")
    assert ServeConfig(host="0.0.0.0", api_key="k").host == "0.0.0.0"


def test_command_refuses_another_host_without_a_key(capsys):
    from llm_marl.cli import main

    assert main(["serve", "--model", "tiny", "--agents", "a", "--host", "0.0.0.0"]) == 2
    assert "needs --api-key" in capsys.readouterr().err


def test_protocol_refuses_what_it_does_not_support():
    with pytest.raises(protocol.APIError) as caught:
        protocol.parse_chat_request({"model": "a", "messages": HELLO, "tools": [{"type": "function"}]})
    assert caught.value.status == 400 and caught.value.param == "tools"
    parsed = protocol.parse_chat_request({"model": "a", "messages": HELLO, "max_completion_tokens": 4, "frequency_penalty": 0, "user": "u"})
    assert parsed.max_tokens == 4 and parsed.temperature is None and parsed.n == 1


def test_a_full_model_final_folder_keeps_its_weights_and_settings(solo_server, tmp_path):
    _, _, agents = solo_server
    policy = agents.policies["solo"]
    policy.temperature = 0.7  # saved with the model: the served agent's default
    try:
        policy.save_pretrained(tmp_path / "final" / "solo")
    finally:
        policy.temperature = 1.0
    loaded = load_agents(str(tmp_path / "final"))
    assert loaded.names == ["solo"]
    again = loaded.policies["solo"]
    assert again.temperature == 0.7 and again.top_p == 1.0
    mine = policy.model.state_dict()
    assert all(torch.equal(mine[k], v) for k, v in again.model.state_dict().items())
    with pytest.raises(ValueError, match="no agent folders"):
        load_agents(str(tmp_path))  # a folder holding no agent and no model
