"""The Tokenizer wrapper: ids, special tokens, streaming deltas and chat templates.

Chat templates are checked against ``transformers``' own ``apply_chat_template`` on the same
files; streaming against a full decode, on text whose characters are split across tokens.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from spectest.engine.loader import load_hf_tokenizer
from spectest.engine.tokenizer import ChatTemplateError

from checkpoint_factory import CORPUS, write_tokenizer

TEXT = "naïve café — 東京 😀 Ünïcödé ½ ∑ and plain ASCII"
MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is the capital of France? 東京?"},
            {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "And of Japan?"}]
# A template in the style of real ones: bos/eos, raise_exception, tojson, loop controls.
RICH_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
    "{% if m['role'] == 'system' %}{% continue %}{% endif %}"
    "[{{ m['role'] }}] {{ m['content'] | tojson }}{% if m['role'] == 'assistant' %}"
    "{{ eos_token }}{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}")


@pytest.fixture
def tok_dir(tmp_path) -> Path:
    write_tokenizer(tmp_path)
    return tmp_path


def test_encode_decode_round_trip_and_special_tokens(tok_dir):
    tok = load_hf_tokenizer(tok_dir)
    for text in CORPUS + [TEXT]:
        assert tok.decode(tok.encode(text)) == text
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == tok.token_to_id("<|im_start|>") and ids[-1] == tok.token_to_id("<|im_end|>")
    assert tok.decode(ids) == "user\nhi"
    assert tok.decode(ids, skip_special_tokens=False) == "<|im_start|>user\nhi<|im_end|>"
    assert tok.token_text(ids[0]) == "<|im_start|>"
    assert tok.vocab_size == 320


def test_special_token_facts_from_config_files(tok_dir):
    tok = load_hf_tokenizer(tok_dir)
    assert tok.eos_token_ids == (2,) and tok.eos_token == "<|im_end|>"
    assert tok.bos_token_id == 1 and tok.bos_token == "<|im_start|>"
    (tok_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 2]}))
    tok = load_hf_tokenizer(tok_dir, {"eos_token_id": 2, "bos_token_id": 1})
    assert tok.eos_token_ids == (0, 2)
    assert tok.eos_token == "<|im_end|>"  # what the template sees: tokenizer_config's


def test_stream_decoder_never_splits_a_character(tok_dir):
    tok = load_hf_tokenizer(tok_dir)
    ids = tok.encode(TEXT + "<|im_end|>")
    partial = [i for i in ids if "\ufffd" in tok.token_text(i)]
    assert partial, "the test text must put parts of one character in different tokens"
    stream, deltas = tok.stream_decoder(), []
    for n in range(1, len(ids) + 1):
        deltas.append(stream.delta(ids[:n]))
        assert "\ufffd" not in deltas[-1]
    assert "".join(deltas) == tok.decode(ids) == TEXT
    assert "" in deltas  # some steps held bytes back
    assert stream.delta(ids) == ""  # nothing new
    with pytest.raises(ValueError, match="shrank"):
        stream.delta(ids[:-1])
    keep = tok.stream_decoder(skip_special_tokens=False)
    assert keep.delta(ids).endswith("<|im_end|>")


def test_stream_decoder_accepts_several_new_ids_at_once(tok_dir):
    """A speculative round can accept several tokens: deltas come in uneven steps."""
    tok = load_hf_tokenizer(tok_dir)
    ids = tok.encode(TEXT)
    stream, text, n = tok.stream_decoder(), "", 0
    for step in [3, 1, 4, 2, 5, 1] * 20:
        n = min(n + step, len(ids))
        text += stream.delta(ids[:n])
    assert text == TEXT


@pytest.mark.parametrize("template", ["chatml", "rich"])
def test_chat_template_renders_like_transformers(tok_dir, template):
    transformers = pytest.importorskip("transformers")
    if template == "rich":
        config = json.loads((tok_dir / "tokenizer_config.json").read_text())
        config["chat_template"] = RICH_TEMPLATE
        (tok_dir / "tokenizer_config.json").write_text(json.dumps(config))
    ours = load_hf_tokenizer(tok_dir)
    theirs = transformers.AutoTokenizer.from_pretrained(tok_dir)
    for add in (True, False):
        expected = theirs.apply_chat_template(MESSAGES, tokenize=False,
                                              add_generation_prompt=add)
        assert ours.apply_chat_template(MESSAGES, add_generation_prompt=add) == expected
    prompt = ours.apply_chat_template(MESSAGES)
    assert ours.encode(prompt) == theirs.encode(prompt, add_special_tokens=False)


def test_template_errors_are_chat_template_errors(tok_dir):
    config = json.loads((tok_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = RICH_TEMPLATE
    (tok_dir / "tokenizer_config.json").write_text(json.dumps(config))
    tok = load_hf_tokenizer(tok_dir)
    with pytest.raises(ChatTemplateError, match="unknown role tool"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}])
    config["chat_template"] = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    (tok_dir / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ChatTemplateError, match="unsafe"):  # the sandbox refuses
        load_hf_tokenizer(tok_dir).apply_chat_template(MESSAGES)
    config["chat_template"] = "{% for m in messages %}"
    (tok_dir / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ChatTemplateError, match="does not parse"):
        load_hf_tokenizer(tok_dir).apply_chat_template(MESSAGES)


def test_no_template_is_a_clear_error(tmp_path):
    write_tokenizer(tmp_path, chat_template=None)
    tok = load_hf_tokenizer(tmp_path)
    assert not tok.has_chat_template
    with pytest.raises(ChatTemplateError, match="has no chat template"):
        tok.apply_chat_template(MESSAGES)


def test_template_from_chat_template_jinja_and_named_list(tmp_path):
    write_tokenizer(tmp_path / "a", chat_template=None)
    (tmp_path / "a" / "chat_template.jinja").write_text("{{ messages[0]['content'] }}!")
    assert load_hf_tokenizer(tmp_path / "a").apply_chat_template(MESSAGES) == "Be brief.!"
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    (tmp_path / "b" / "chat_template.jinja").unlink()
    config = json.loads((tmp_path / "b" / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "tool_use", "template": "T"},
                               {"name": "default", "template": "D"}]
    (tmp_path / "b" / "tokenizer_config.json").write_text(json.dumps(config))
    assert load_hf_tokenizer(tmp_path / "b").apply_chat_template(MESSAGES) == "D"
