"""llama.cpp's logprobs entries against the generated tokens: where they stop lining up.

The shapes are the ones llama-server returned (SmolLM2, greedy, after a RAG prompt): 8 tokens
generated, 2 entries — '華' (3 byte tokens) and '漏'. Which token's figures a character's entry
carries cannot be told from the entry (measured on llama-server: a Korean character spread over
three tokens came with the id and top logprobs of its third), so the entry itself is dropped."""

from spectest.audit.samples import parse_logprobs, whole_tokens


def entry(token_id: int, text: str) -> dict:
    return {"id": token_id, "token": text, "logprob": -0.5, "bytes": list(text.encode()),
            "top_logprobs": [{"id": token_id, "token": text, "logprob": -0.5}]}


def test_a_character_spanning_tokens_cuts_the_entries_from_it_on():
    obj = {"content": [entry(124, "華"), entry(233, "漏")]}
    kept, left_out = whole_tokens(obj, 8)
    assert kept["content"] == [] and left_out == 8
    obj = {"content": [entry(1, "a"), entry(2, " b"), entry(124, "華"), entry(233, "漏")]}
    kept, left_out = whole_tokens(obj, 8)
    assert [p.token for p in parse_logprobs(kept, "x", 1)] == [1, 2] and left_out == 6


def test_ascii_entries_with_a_withheld_tail_all_line_up():
    obj = {"content": [entry(1, "a"), entry(2, " b"), entry(3, "c")]}
    kept, left_out = whole_tokens(obj, 4)  # the 4th token began a character not yet whole
    assert kept is obj and left_out == 1


def test_as_many_entries_as_tokens_is_left_alone():
    obj = {"content": [entry(1, "a"), entry(124, "華")]}
    assert whole_tokens(obj, 2) == (obj, 0)
    openai = {"tokens": ["token_id:1"], "token_logprobs": [-0.1], "top_logprobs": [None]}
    assert whole_tokens(openai, 5) == (openai, 0)  # one entry per token by construction
    assert whole_tokens(None, 3) == (None, 0)
