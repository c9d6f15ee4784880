#!/usr/bin/env python3
"""Renders every template in tests/fixtures/chat_templates/ with Python Jinja2, the way transformers'
apply_chat_template does (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loop controls,
raise_exception and strftime_now as globals, tojson = json.dumps(ensure_ascii=False)), over a set of
conversations, and writes tests/fixtures/chat_templates/reference.json, the reference of
tests/tokenizer/chat_template_reference_test.cc, and renders the interpreter's unit snippets
(tests/tokenizer/jinja_snippets.py) into tests/fixtures/chat_templates/snippets.json, the reference
of tests/tokenizer/jinja_test.cc. strftime_now formats a fixed date (FIXED_NOW).

Run from the repository root with a python3 that has jinja2 (checked with Jinja2 3.1.6):
    python3 tests/tokenizer/gen_chat_reference.py
"""
import datetime
import json
import os

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

import jinja_snippets

DIR = 'tests/fixtures/chat_templates'
FIXED_NOW = datetime.datetime(2025, 2, 3, 10, 30, 0)

# name -> (bos_token, eos_token) as in each model's tokenizer_config.json / GGUF metadata
# (None: the model defines none, so the variable is undefined in the template).
TEMPLATES = {
    'llama3': ('<|begin_of_text|>', '<|eot_id|>'),
    'llama31': ('<|begin_of_text|>', '<|eot_id|>'),
    'llama32': ('<|begin_of_text|>', '<|eot_id|>'),
    'qwen2': (None, '<|im_end|>'),
    'qwen25': (None, '<|im_end|>'),
    'qwen3': (None, '<|im_end|>'),
    'mistral_v01': ('<s>', '</s>'),
    'mistral_v03': ('<s>', '</s>'),
    'phi3_mini': ('<s>', '<|endoftext|>'),
    'smollm2': ('<|im_start|>', '<|im_end|>'),
}

CONVERSATIONS = {
    'user_only': [{'role': 'user', 'content': 'What is the capital of France?'}],
    'sys_user': [{'role': 'system', 'content': 'You are a helpful assistant.'},
                 {'role': 'user', 'content': 'Hello!'}],
    'multi_turn': [{'role': 'user', 'content': ' Hi there! '},
                   {'role': 'assistant', 'content': '  Hello. How can I help?\n'},
                   {'role': 'user', 'content': 'Tell me a joke.'}],
    'sys_multi_turn': [{'role': 'system', 'content': '\nBe brief.  '},
                       {'role': 'user', 'content': 'Name a color.'},
                       {'role': 'assistant', 'content': 'Blue.'},
                       {'role': 'user', 'content': 'Another one?'}],
    'assistant_last': [{'role': 'user', 'content': 'Say yes.'},
                       {'role': 'assistant', 'content': 'Yes.'}],
    'think': [{'role': 'user', 'content': '2+2?'},
              {'role': 'assistant', 'content': '<think>\nadd them\n</think>\n\n4'},
              {'role': 'user', 'content': 'And 3+3?'},
              {'role': 'assistant', 'content': '<think>\n\nagain\n</think>\n6'}],
    'unicode': [{'role': 'user', 'content': 'héllo 世界 🙂 "quotes" \'apostrophes\' {{ not a tag }} {% raw %}\ttab'}],
    'bad_order': [{'role': 'user', 'content': 'one'}, {'role': 'user', 'content': 'two'}],
    'assistant_first': [{'role': 'assistant', 'content': 'I start.'}, {'role': 'user', 'content': 'ok'}],
    'empty': [],
}

# Extra template variables rendered as separate cases: name -> (template, kwargs).
EXTRAS = {
    'qwen3_no_thinking': ('qwen3', {'enable_thinking': False}),
    'qwen3_thinking': ('qwen3', {'enable_thinking': True}),
    'llama31_date': ('llama31', {'date_string': '11 Nov 2024'}),
}


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return FIXED_NOW.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters['tojson'] = tojson
    env.globals['raise_exception'] = raise_exception
    env.globals['strftime_now'] = strftime_now
    return env


def render(template, bos, eos, messages, gen, extra):
    kwargs = {'messages': messages, 'tools': None, 'documents': None, 'add_generation_prompt': gen}
    if bos is not None:
        kwargs['bos_token'] = bos
    if eos is not None:
        kwargs['eos_token'] = eos
    kwargs.update(extra)
    try:
        return {'text': template.render(**kwargs)}
    except jinja2.exceptions.TemplateError as e:
        kind = 'raise' if type(e) is jinja2.exceptions.TemplateError else 'error'
        return {'error': kind, 'message': str(e)}
    except Exception as e:  # TypeError and friends inside the template
        return {'error': 'error', 'message': f'{type(e).__name__}: {e}'}


def main():
    env = make_env()
    compiled = {}
    for name in TEMPLATES:
        with open(os.path.join(DIR, name + '.jinja'), encoding='utf-8') as f:
            compiled[name] = env.from_string(f.read())
    cases = []
    for name, (bos, eos) in TEMPLATES.items():
        for conv, messages in CONVERSATIONS.items():
            for gen in (True, False):
                case = {'template': name, 'conversation': conv, 'add_generation_prompt': gen, 'extra': {}}
                case.update(render(compiled[name], bos, eos, messages, gen, {}))
                cases.append(case)
    for label, (name, extra) in EXTRAS.items():
        bos, eos = TEMPLATES[name]
        for conv in ('user_only', 'think'):
            for gen in (True, False):
                case = {'template': name, 'conversation': conv, 'add_generation_prompt': gen, 'extra': extra,
                        'label': label}
                case.update(render(compiled[name], bos, eos, CONVERSATIONS[conv], gen, extra))
                cases.append(case)
    out = {
        'generator': 'tests/tokenizer/gen_chat_reference.py, Jinja2 ' + jinja2.__version__,
        'now': FIXED_NOW.strftime('%Y-%m-%d %H:%M:%S'),
        'templates': {n: {'file': n + '.jinja', 'bos_token': b, 'eos_token': e} for n, (b, e) in TEMPLATES.items()},
        'conversations': CONVERSATIONS,
        'cases': cases,
    }
    with open(os.path.join(DIR, 'reference.json'), 'w', encoding='utf-8') as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write('\n')
    print(len(cases), 'cases;', sum('error' in c for c in cases), 'errors')
    snippets = []
    for text in jinja_snippets.SNIPPETS:
        try:
            snippets.append({'template': text, 'text': env.from_string(text).render(**jinja_snippets.CONTEXT)})
        except Exception as e:
            snippets.append({'template': text, 'error': f'{type(e).__name__}: {e}'})
    with open(os.path.join(DIR, 'snippets.json'), 'w', encoding='utf-8') as f:
        json.dump({'generator': out['generator'], 'now': out['now'], 'context': jinja_snippets.CONTEXT,
                   'snippets': snippets}, f, indent=1, ensure_ascii=False)
        f.write('\n')
    print(len(snippets), 'snippets;', sum('error' in c for c in snippets), 'errors')


if __name__ == '__main__':
    main()
