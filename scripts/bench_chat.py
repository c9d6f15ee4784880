#!/usr/bin/env python3
"""The client of scripts/bench-chat.sh: drives one OpenAI-compatible server with the official
`openai` package and writes one JSON object per measurement (a chat turn, a shared-prefix run) to
stdout. Two workloads:

  chat    multi-turn chat over a long document: turn 1 = the document + a question, then short
          follow-ups, each turn resending the whole conversation (system, user, assistant ...);
          streamed, greedy. Per turn: TTFT, prompt tokens, usage.prompt_tokens_details.cached_tokens,
          and (given --prefill-metrics/--decode-metrics) the tokens the cluster computed.
  shared  N requests, each = one shared system prompt + a distinct question, C at a time; wall
          time, requests/s, TTFT, and the prompt tokens computed (icecache: the prefill workers'
          icecache_prefill_tokens_total + the decode workers'
          icecache_prefix_cache_computed_tokens_total deltas; llama-server: the sum of its
          per-request timings.prompt_n).

  table   markdown tables of a run's JSON lines.
  prepare writes the texts (the document, the shared prefix, the questions) trimmed to token counts
          with a server's /tokenize and /detokenize (llama-server's, on the same GGUF: SmolLM2's
          own tokenizer), so both engines get the same text.
"""
import argparse
import concurrent.futures
import json
import sys
import time
import urllib.request

LICENCES = "/usr/share/common-licenses"


def http_json(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def read(name):
    with open(f"{LICENCES}/{name}", encoding="utf-8") as f:
        return f.read()


def prepare(args):
    """Texts of exact token counts, cut at a token boundary by the server's tokenizer."""
    def tokens(text):
        return http_json(args.server + "/tokenize", {"content": text})["tokens"]

    def trim(text, n):
        ids = tokens(text)
        if len(ids) < n:
            raise SystemExit(f"bench_chat: text has {len(ids)} tokens, fewer than {n}")
        out = http_json(args.server + "/detokenize", {"tokens": ids[:n]})["content"]
        return out, len(ids)

    # Chat: GPL-3 (35 kB), with LGPL-3 after it when the target needs more.
    doc, full = trim(read("GPL-3") + "\n\n" + read("LGPL-3"), args.doc_tokens)
    gpl3 = len(tokens(read("GPL-3")))
    # Shared prefix: MPL-2.0, then Apache-2.0.
    prefix, _ = trim(read("MPL-2.0") + "\n\n" + read("Apache-2.0"), args.prefix_tokens)
    # Questions: consecutive runs of GFDL-1.3 (then GFDL-1.2), each q_tokens long with a question
    # after it; distinct from the first token on.
    src = tokens(read("GFDL-1.3") + "\n\n" + read("GFDL-1.2"))
    body = args.question_tokens - 16  # the framing below is ~16 tokens
    questions = []
    for i in range(args.requests):
        part = http_json(args.server + "/detokenize", {"tokens": src[i * body:(i + 1) * body]})["content"]
        questions.append(f"Request {i + 1}. Passage: \"{part.strip()}\"\nWhich section of the licence above is closest to this passage?")
    q_lens = [len(tokens(q)) for q in questions]
    json.dump({"doc": doc, "doc_tokens": args.doc_tokens, "gpl3_tokens": gpl3, "doc_source_tokens": full,
               "prefix": prefix, "prefix_tokens": args.prefix_tokens, "questions": questions,
               "question_tokens": q_lens}, open(args.out, "w"))
    print(f"bench_chat: GPL-3 is {gpl3} tokens; document {args.doc_tokens} tokens ({'GPL-3' if gpl3 >= args.doc_tokens else 'GPL-3 + LGPL-3'} cut), shared "
          f"prefix {args.prefix_tokens} tokens (MPL-2.0 + Apache-2.0 cut), {len(questions)} questions of "
          f"{min(q_lens)}-{max(q_lens)} tokens (GFDL)", file=sys.stderr)


def scrape(urls, names):
    """Sum of every sample of each metric family in `names` over the /metrics pages `urls`."""
    total = {n: 0.0 for n in names}
    for u in urls:
        with urllib.request.urlopen(u, timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("#"):
                    continue
                parts = line.split()
                if len(parts) < 2:
                    continue
                name = parts[0].split("{")[0]
                if name in total:
                    total[name] += float(parts[1])
    return total


PREFILL = "icecache_prefill_tokens_total"
COMPUTED = "icecache_prefix_cache_computed_tokens_total"
REUSED = "icecache_prefix_cache_reused_tokens_total"
HITS = "icecache_prefix_cache_hits_total"


class Counters:
    def __init__(self, args):
        self.prefill = [u for u in (args.prefill_metrics or "").split(",") if u]
        self.decode = [u for u in (args.decode_metrics or "").split(",") if u]

    def read(self):
        if not self.prefill and not self.decode:
            return None
        # The workers copy their engines' counters into /metrics every 0.5 s (decode_server.cc,
        # UpdateMetrics): wait for one copy after the request ended.
        time.sleep(1.2)
        out = scrape(self.prefill, [PREFILL])
        out.update(scrape(self.decode, [COMPUTED, REUSED, HITS]))
        return out

    @staticmethod
    def delta(a, b):
        if a is None or b is None:
            return None
        return {k: b[k] - a[k] for k in a}


def stream_chat(client, model, messages, max_tokens):
    """One streamed, greedy chat completion: (text, ttft_s, total_s, usage, llama.cpp timings)."""
    t0 = time.perf_counter()
    ttft = None
    text = []
    usage = None
    timings = None
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.choices:
            d = chunk.choices[0].delta
            if d is not None and d.content:
                if ttft is None:
                    ttft = time.perf_counter() - t0
                text.append(d.content)
        if chunk.usage is not None:
            usage = chunk.usage
        extra = getattr(chunk, "model_extra", None) or {}
        if extra.get("timings"):
            timings = extra["timings"]  # llama-server: prompt_n (computed), cache_n (reused)
    total = time.perf_counter() - t0
    if ttft is None:
        ttft = total
    u = None
    if usage is not None:
        details = getattr(usage, "prompt_tokens_details", None)
        cached = getattr(details, "cached_tokens", None) if details is not None else None
        u = {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens, "cached_tokens": cached}
    return "".join(text), ttft, total, u, timings


def warm_up(client, model):
    stream_chat(client, model, [{"role": "system", "content": "Warm-up."},
                                {"role": "user", "content": "Say hello."}], 4)


def run_chat(args, client, texts, counters):
    followups = [
        "Summarise your answer in one sentence.",
        "Which section talks about installation information for user products?",
        "Does the licence allow charging a fee for copies?",
    ][:args.turns - 1]
    messages = [{"role": "system", "content": "You are a helpful assistant. Answer briefly."},
                {"role": "user", "content": texts["doc"] + "\n\nQuestion: what does this licence require "
                                            "of someone who distributes the program in object code form?"}]
    warm_up(client, args.model)
    for turn in range(1, len(followups) + 2):
        before = counters.read()
        reply, ttft, total, usage, timings = stream_chat(client, args.model, messages, args.max_tokens)
        after = counters.read()
        row = {"workload": "chat", "engine": args.engine, "turn": turn, "ttft_s": round(ttft, 4),
               "total_s": round(total, 4), "usage": usage, "counters": Counters.delta(before, after),
               "reply": reply}
        c = row["counters"]
        if c is not None and usage is not None:
            # What the cluster computed must be what usage says was not cached.
            computed = c[PREFILL] + c[COMPUTED]
            row["computed_matches_usage"] = computed == usage["prompt_tokens"] - (usage["cached_tokens"] or 0)
            if not row["computed_matches_usage"]:
                print(f"bench_chat: turn {turn}: computed {computed:.0f} tokens, but usage says {usage['prompt_tokens']} "
                      f"prompt tokens of which {usage['cached_tokens']} cached", file=sys.stderr)
        if timings is not None:
            row["llamacpp_prompt_n"] = timings.get("prompt_n")
            row["llamacpp_cache_n"] = timings.get("cache_n")
        print(json.dumps(row), flush=True)
        messages.append({"role": "assistant", "content": reply})
        if turn <= len(followups):
            messages.append({"role": "user", "content": followups[turn - 1]})


def run_shared(args, client, texts, counters):
    questions = texts["questions"][:args.requests]
    warm_up(client, args.model)

    def one(q):
        msgs = [{"role": "system", "content": texts["prefix"]}, {"role": "user", "content": q}]
        try:
            _, ttft, total, usage, timings = stream_chat(client, args.model, msgs, args.max_tokens)
            return {"ttft": ttft, "total": total, "usage": usage, "timings": timings, "error": None,
                    "end": time.perf_counter()}
        except Exception as e:  # reported, not hidden: a failed request is a finding
            return {"ttft": None, "total": None, "usage": None, "timings": None, "error": repr(e)}

    before = counters.read()
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
        results = list(pool.map(one, questions))
    wall = time.perf_counter() - t0
    after = counters.read()
    ok = [r for r in results if r["error"] is None]
    d = Counters.delta(before, after)
    computed = None
    if d is not None:
        computed = d[PREFILL] + d[COMPUTED]
    elif ok and all(r["timings"] for r in ok):
        computed = sum(r["timings"].get("prompt_n", 0) for r in ok)
    ttfts = sorted(r["ttft"] for r in ok)
    # After the first wave (the first `concurrency` requests to finish, which found nothing
    # retained when they started): the steady state.
    ends = sorted(r["end"] - t0 for r in ok)
    c = args.concurrency
    steady = (len(ends) - c) / (ends[-1] - ends[c - 1]) if len(ends) > c and ends[-1] > ends[c - 1] else None
    row = {"workload": "shared", "engine": args.engine, "requests": len(questions), "ok": len(ok),
           "concurrency": args.concurrency, "wall_s": round(wall, 3), "requests_per_s": round(len(ok) / wall, 4),
           "first_wave_s": round(ends[c - 1], 3) if len(ends) >= c else None,
           "requests_per_s_after_first_wave": round(steady, 4) if steady else None,
           "ttft_median_s": round(ttfts[len(ttfts) // 2], 4) if ttfts else None,
           "ttft_max_s": round(ttfts[-1], 4) if ttfts else None,
           "prompt_tokens": sum(r["usage"]["prompt_tokens"] for r in ok if r["usage"]),
           "cached_tokens": sum((r["usage"]["cached_tokens"] or 0) for r in ok if r["usage"]),
           "computed_tokens": computed, "counters": d,
           "errors": [r["error"] for r in results if r["error"] is not None][:5]}
    print(json.dumps(row), flush=True)


def table(args):
    """Markdown tables of a run's JSON lines, for docs/BENCHMARKS.md."""
    rows = [json.loads(line) for line in open(args.jsonl)]
    load = open("/proc/loadavg").read().split()[:3]
    print(f"Command: `{args.command}` (icecache {args.commit}); CPU: {args.cpu}; "
          f"{time.strftime('%Y-%m-%d', time.gmtime())}; llama-server -t {args.threads} -c 32768 -np 4; "
          f"load average at the end {' '.join(load)}.\n")
    chat = [r for r in rows if r["workload"] == "chat"]
    if chat:
        by = {}
        for r in chat:
            by.setdefault(r["engine"], {})[r["turn"]] = r
        ll = by.get("llamacpp", {})

        def ttft(x):
            return f"{x['ttft_s']:.3f} s" if x else "—"

        def ratio(x, t):
            return f"{x['ttft_s'] / ll[t]['ttft_s']:.2f}×" if x and t in ll else "—"

        def cached(x):
            return str(x["usage"]["cached_tokens"]) if x and x.get("usage") else "—"

        def computed(x):
            c = x and x.get("counters")
            return f"{c[PREFILL]:.0f} + {c[COMPUTED]:.0f}" if c else "—"

        print("| turn | prompt tokens | llama-server TTFT (tokens computed / cached) | icecache reuse on: TTFT | "
              "cached_tokens | computed: prefill + decode worker | ratio to llama-server | "
              "icecache reuse off: TTFT | ratio to llama-server |")
        print("|---|---|---|---|---|---|---|---|---|")
        for t in sorted({r["turn"] for r in chat}):
            l, a, b = ll.get(t), by.get("reuse", {}).get(t), by.get("noreuse", {}).get(t)
            pt = next((x["usage"]["prompt_tokens"] for x in (a, b, l) if x and x.get("usage")), "")
            lc = f" ({l.get('llamacpp_prompt_n')} / {l.get('llamacpp_cache_n')})" if l and "llamacpp_cache_n" in l else ""
            print(f"| {t} | {pt} | {ttft(l)}{lc} | {ttft(a)} | {cached(a)} | {computed(a)} | {ratio(a, t)} | "
                  f"{ttft(b)} | {ratio(b, t)} |")
        print()
    shared = [r for r in rows if r["workload"] == "shared"]
    if shared:
        names = {"llamacpp": "llama-server", "reuse": "icecache, reuse on", "noreuse": "icecache, reuse off"}
        off = next((r for r in shared if r["engine"] == "noreuse"), None)
        print("| engine | requests ok | wall | requests/s | vs reuse off | first wave done at | requests/s after it | "
              "TTFT median / max | prompt tokens | cached_tokens (usage) | prompt tokens computed |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in shared:
            vs = f"{r['requests_per_s'] / off['requests_per_s']:.2f}×" if off and off["requests_per_s"] else "—"
            fw = f"{r['first_wave_s']:.1f} s" if r.get("first_wave_s") is not None else "—"
            after = f"{r['requests_per_s_after_first_wave']:.3f}" if r.get("requests_per_s_after_first_wave") else "—"
            comp = f"{r['computed_tokens']:.0f}" if r["computed_tokens"] is not None else "—"
            print(f"| {names.get(r['engine'], r['engine'])} | {r['ok']}/{r['requests']} | {r['wall_s']:.1f} s | "
                  f"{r['requests_per_s']:.3f} | {vs} | {fw} | {after} | {r['ttft_median_s']} / {r['ttft_max_s']} s | "
                  f"{r['prompt_tokens']} | {r['cached_tokens']} | {comp} |")
        print()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload", choices=["prepare", "chat", "shared", "table"])
    p.add_argument("--jsonl", help="table: the JSON lines of a run")
    p.add_argument("--command", default="", help="table: the command that made them")
    p.add_argument("--commit", default="", help="table: icecache's commit")
    p.add_argument("--cpu", default="", help="table: the CPU")
    p.add_argument("--threads", default="2", help="table: llama-server's threads")
    p.add_argument("--server", help="prepare: base URL with /tokenize (llama-server)")
    p.add_argument("--out", help="prepare: where the texts go (JSON)")
    p.add_argument("--texts", help="chat/shared: the JSON that prepare wrote")
    p.add_argument("--base-url", help="chat/shared: the OpenAI API, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--engine", default="", help="a label written into every row")
    p.add_argument("--model", help="default: the first of /v1/models")
    p.add_argument("--prefill-metrics", help="comma-separated /metrics URLs of prefill workers")
    p.add_argument("--decode-metrics", help="comma-separated /metrics URLs of decode workers")
    p.add_argument("--doc-tokens", type=int, default=7000)
    p.add_argument("--prefix-tokens", type=int, default=4000)
    p.add_argument("--question-tokens", type=int, default=100)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=24)
    args = p.parse_args()
    if args.workload == "prepare":
        prepare(args)
        return
    if args.workload == "table":
        table(args)
        return
    import openai  # scripts/setup.sh installs it
    client = openai.OpenAI(base_url=args.base_url, api_key="none", timeout=1800, max_retries=0)
    if not args.model:
        args.model = client.models.list().data[0].id
    texts = json.load(open(args.texts))
    counters = Counters(args)
    (run_chat if args.workload == "chat" else run_shared)(args, client, texts, counters)


if __name__ == "__main__":
    main()
