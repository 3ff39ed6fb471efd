"""The vocabulary a Megatron-LM launch trains with, from the tokenizer it names.

Megatron sizes the embedding from the tokenizer, not from a flag: build_tokenizer then
_set_padded_vocab_size (megatron/core/tokenizers/utils/build_tokenizer.py at the flag table's
commit) pads `tokenizer.vocab_size`. What that number is depends on the tokenizer type:

- HuggingFaceTokenizer and SFTTokenizer: len(tokenizer), the base vocabulary plus added tokens
  (text/libraries/huggingface_tokenizer.py `vocab_size`, sft_tokenizer.py `self._vocab_size`);
- GPT2BPETokenizer: the entries of --vocab-file (the GPT-2 vocab.json) plus --tokenizer-special-tokens;
- Llama2Tokenizer / SentencePiece types: the pieces of the --tokenizer-model .model file;
- TikTokenizer: --vocab-size, else DEFAULT_TIKTOKEN_MAX_VOCAB;
- NullTokenizer: --vocab-size itself.

A launch rarely says --vocab-size, so the number is read from a tokenizer file that exists here
(a HF tokenizer.json, or the GPT-2 vocab.json), else taken from a table of well-known tokenizers
whose length equals the vocab_size of their Hugging Face config.json (each entry cites it). A
sentencepiece .model is not read: that needs the sentencepiece package, which the planner does
not depend on.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecError
from ..inputs import printable, read_regular_file

# entries in the stock GPT-2 BPE vocab.json / gpt2-vocab.json (Radford et al. 2019; HF gpt2
# config.json "vocab_size": 50257)
GPT2_BPE_VOCAB_SIZE = 50257
# Llama 2's tokenizer.model: 32,000 sentencepiece pieces (HF meta-llama/Llama-2-7b-hf config.json
# "vocab_size": 32000); Megatron's Llama2Tokenizer adds none unless --tokenizer-special-tokens
LLAMA2_VOCAB_SIZE = 32000
# Llama 3.x (3, 3.1, 3.2, 3.3 share one tiktoken BPE): 128,000 tokens + 256 reserved special
# tokens (HF meta-llama/Meta-Llama-3-8B and Llama-3.1-8B config.json "vocab_size": 128256)
LLAMA3_VOCAB_SIZE = 128256
# Mistral 7B v0.1 / v0.2 and Mixtral 8x7B v0.1: 32,000 pieces (HF mistralai/Mistral-7B-v0.1 and
# mistralai/Mixtral-8x7B-v0.1 config.json "vocab_size": 32000)
MISTRAL_V01_VOCAB_SIZE = 32000
# Mistral 7B v0.3: the v3 tokenizer, 32,768 pieces (HF mistralai/Mistral-7B-v0.3 config.json
# "vocab_size": 32768)
MISTRAL_V03_VOCAB_SIZE = 32768
# Megatron's TikTokenizer without --vocab-size: DEFAULT_TIKTOKEN_MAX_VOCAB = 2**17
# (megatron/core/tokenizers/text/libraries/tiktoken_tokenizer.py:24, the `vocab_size` default of
# TikTokenizer.__init__ at :86; build_tokenizer.py passes --vocab-size only when given). Its
# --tiktoken-num-special-tokens (default 1000, training_config.py:730) are inside that number.
TIKTOKEN_DEFAULT_VOCAB_SIZE = 2**17
# a tokenizer.json of the largest vocabularies (Gemma's 256k) is ~35 MB; a file past this is not one
MAX_TOKENIZER_FILE_BYTES = 256 * 2**20

# tokenizer types whose vocabulary is their type's alone (the file they read is fixed by it;
# GPT2BPETokenizer's is its --vocab-file, see vocab_of)
_BY_TYPE = {
    "Llama2Tokenizer": (LLAMA2_VOCAB_SIZE, "Llama 2's tokenizer.model"),
    "TikTokenizer": (TIKTOKEN_DEFAULT_VOCAB_SIZE, "Megatron's TikTokenizer default (2**17)"),
}
# Hugging Face ids (the last part, case-insensitive; a fine-tune or quantized copy keeps its
# family's name, e.g. nvidia/Llama-3.1-70B-Instruct-FP8) -> (vocabulary, what it is)
_BY_HF_NAME = (
    (re.compile(r"gpt2(-medium|-large|-xl)?$"), GPT2_BPE_VOCAB_SIZE, "GPT-2's BPE"),
    (re.compile(r"llama-2-"), LLAMA2_VOCAB_SIZE, "Llama 2's tokenizer"),
    # not Llama 3.2 Vision, whose tokenizer adds an <|image|> token
    (re.compile(r"(meta-)?llama-3(\.\d+)?-(?!.*vision)"), LLAMA3_VOCAB_SIZE, "Llama 3's tokenizer"),
    (re.compile(r"mistral-7b(-instruct)?-v0\.[12]$|mixtral-8x7b(-instruct)?-v0\.1$"), MISTRAL_V01_VOCAB_SIZE,
     "Mistral's v1 tokenizer"),
    (re.compile(r"mistral-7b(-instruct)?-v0\.3$"), MISTRAL_V03_VOCAB_SIZE, "Mistral's v3 tokenizer"),
)
# tokenizer types whose vocabulary is len() of the Hugging Face tokenizer named by
# --tokenizer-model (MultimodalTokenizer adds its image tokens to it: not one of them)
HF_TYPES = ("HuggingFaceTokenizer", "SFTTokenizer")
SENTENCEPIECE_TYPES = ("Llama2Tokenizer", "SentencePieceTokenizer", "GPTSentencePieceTokenizer")


@dataclass(frozen=True)
class Vocab:
    size: int
    how: str          # said as assumed: where the number came from


def vocab_flag(tok: str | None, has_vocab_file: bool) -> str | None:
    """The flag that names the file (or Hugging Face id) the vocabulary comes from, for the
    tokenizer type given (None: no --tokenizer-type; a --vocab-file then is GPT-2's BPE)."""
    if tok == "GPT2BPETokenizer" or (tok is None and has_vocab_file):
        return "--vocab-file"
    if tok in HF_TYPES or tok in SENTENCEPIECE_TYPES or tok == "TikTokenizer":
        return "--tokenizer-model"
    return None


def by_table(tok: str | None, name: str | None) -> Vocab | None:
    """A well-known tokenizer's vocabulary: by Hugging Face id for the HF types, by type for
    those whose type fixes it."""
    if tok in HF_TYPES and name:
        last = name.rstrip("/").lower().split("/")[-1]
        for pattern, size, what in _BY_HF_NAME:
            if pattern.match(last):
                return Vocab(size, f"{what} (--tokenizer-model {name})")
        return None
    if tok in _BY_TYPE:
        size, what = _BY_TYPE[tok]
        return Vocab(size, f"{what} (--tokenizer-type {tok})")
    return None


def local_path(value: str | None, search_dirs: tuple[Path, ...]) -> Path | None:
    """`value` as a path that exists here: absolute, or relative to the current folder or one of
    `search_dirs` (the script's folder), as the script, run from either, would find it."""
    if not value:
        return None
    p = Path(os.path.expanduser(value))
    cands = [p] if p.is_absolute() else [p, *(d / p for d in search_dirs)]
    return next((c for c in cands if os.path.lexists(c)), None)


def count_file(path: Path, flag: str) -> Vocab | None:
    """The vocabulary of a tokenizer file or folder here: a HF tokenizer.json (model.vocab plus
    added_tokens, as len(tokenizer) counts them) or a GPT-2 vocab.json (its entries). A folder
    is searched for either; None for anything else (a sentencepiece .model, a tiktoken file)."""
    if path.is_dir():
        files = [path / n for n in ("tokenizer.json", "vocab.json") if (path / n).is_file()]
        return count_file(files[0], flag) if files else None
    if path.suffix != ".json":
        return None
    expected = "a Hugging Face tokenizer.json or a GPT-2 vocab.json"
    data = read_regular_file(path, MAX_TOKENIZER_FILE_BYTES, expected)
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SpecError(printable(path), flag, f"not JSON ({exc}); expected {expected}") from None
    n = _tokenizer_json_size(doc) if isinstance(doc, dict) and "model" in doc else _vocab_json_size(doc)
    if n is None or n < 1:
        raise SpecError(printable(path), flag, f"no vocabulary in it; expected {expected}")
    return Vocab(n, f"counted in {printable(path)} ({flag})")


def _tokenizer_json_size(doc: dict) -> int | None:
    """len(tokenizer) of a HF tokenizer.json: the distinct ids of model.vocab (a token -> id map
    for BPE / WordPiece, a list of [piece, score] for Unigram) and of added_tokens."""
    vocab = doc["model"].get("vocab") if isinstance(doc["model"], dict) else None
    if isinstance(vocab, dict):
        ids = {i for i in vocab.values() if isinstance(i, int)}
    elif isinstance(vocab, list):
        ids = set(range(len(vocab)))
    else:
        return None
    added = doc.get("added_tokens") or []
    ids |= {t["id"] for t in added if isinstance(t, dict) and isinstance(t.get("id"), int)}
    return len(ids)


def _vocab_json_size(doc) -> int | None:
    """A GPT-2 vocab.json: token -> id."""
    if isinstance(doc, dict) and all(isinstance(i, int) for i in doc.values()):
        return len(doc)
    return None


def vocab_of(tok: str | None, tokenizer_model: str | None, vocab_file: str | None, merge_file: str | None = None,
             search_dirs: tuple[Path, ...] = ()) -> Vocab | None:
    """The vocabulary of the tokenizer a launch names: a file here first, then the table; None
    when neither says (the caller asks for --vocab-size)."""
    flag = vocab_flag(tok, bool(vocab_file or merge_file))
    value = vocab_file if flag == "--vocab-file" else tokenizer_model if flag == "--tokenizer-model" else None
    if tok != "TikTokenizer":                 # its vocabulary is --vocab-size or the default, not its file's
        found = local_path(value, search_dirs)
        if found is not None:
            counted = count_file(found, flag)
            if counted is not None:
                return counted
    if flag == "--vocab-file":
        # GPT-2's byte-level BPE is the only tokenizer that reads a vocab.json with merges, and
        # the files every Megatron GPT example downloads are the stock ones
        where = (f"--vocab-file {vocab_file}, not here to count" if vocab_file
                 else f"--tokenizer-type {tok}" if tok else f"--merge-file {merge_file}")
        return Vocab(GPT2_BPE_VOCAB_SIZE, f"the stock GPT-2 BPE vocabulary ({where})")
    return by_table(tok, tokenizer_model)
