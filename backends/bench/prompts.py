"""Prompt text of a requested token length, without a tokenizer.

A workload gives each request a ``prompt_len`` in tokens. Without the server's tokenizer we
send ``prompt_len`` common English words joined by spaces: each word below (with or without its
leading space) is a single token in GPT-2-style BPE vocabularies (checked against SmolLM2's
49,152-token vocabulary; Llama, Qwen and Mistral vocabularies hold these words whole as well),
and pre-tokenizers split on spaces, so the words do not merge. The server adds its own
BOS or chat-template tokens on top (a few to a few dozen), which the summary's
``total_input_tokens_server`` (from ``usage.prompt_tokens``) makes visible.

Words are drawn at random per request (seeded by ``(seed, req_id)``), so prompts share no
prefix beyond chance and prefix caching cannot flatter the numbers.
Exact lengths through ``--tokenizer`` (token ids via a Hugging Face tokenizer) are not in this
version.
"""

from __future__ import annotations

import numpy as np

from fastpp.types import Request

# Single tokens in GPT-2-style vocabularies, with and without a leading space (see above).
_WORD_TEXT = """
the of and to in is that for it as was with be by on not he this are or his from at which but
have an had they you were their one all we can her has there been if more when will would who so no
she other its time into only some could new them man two may then do first any now such like our over
also my did these me made after many most must before just where through much your should well way
those very see even because each us great how back years good same under little world life long day
work part water people place home small large light hand house state high city country line point
night word book name year week month number music school family order group table story power game
"""
WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())


def synthetic_prompt(num_tokens: int, seed: int, req_id: int) -> str:
    """About ``num_tokens`` tokens of text: that many random common words, deterministic in
    ``(seed, req_id)``."""
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    rng = np.random.default_rng([seed, req_id])
    return " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), num_tokens))


def make_prompts(requests: list[Request], seed: int) -> list[str]:
    """One prompt per request, in order; built before the run so sending costs no text work."""
    return [synthetic_prompt(r.prompt_len, seed, r.req_id) for r in requests]
