"""Tokenizer vs transformers' AutoTokenizer; incremental detokenization; stop strings."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer

from loraplex.engine.tokenizer import (
    ChatTemplateError,
    IncrementalDetokenizer,
    Tokenizer,
    find_stop_string,
)
from loraplex.platform.demo.corpus import DEMO_CORPUS

TEXTS = [
    "The capital of France is",
    "Hello, world! How are you today?",
    "  leading spaces and trailing   ",
    "Ünïcödé: naïve café — “quotes” … 你好，世界 こんにちは",
    "emoji 🙂👍🏽 and a family 👨‍👩‍👧‍👦 in a row",
    "<|im_start|>user\nhi there<|im_end|>\n",
    "tabs\tand\nnewlines\r\n\n",
    "def add(a, b):\n    return a + b",
    "",
]
MESSAGES = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi 🙂"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Name a city."},
    ],
]
CHECKPOINTS = ["llama_checkpoint", "qwen2_checkpoint", "smollm2_checkpoint"]


@pytest.fixture(scope="module", params=CHECKPOINTS)
def pair(request: pytest.FixtureRequest) -> tuple[Tokenizer, object]:
    path: Path = request.getfixturevalue(request.param)
    return Tokenizer.from_model_dir(path), AutoTokenizer.from_pretrained(path)


def test_encode_matches_autotokenizer(pair: tuple[Tokenizer, object]) -> None:
    ours, hf = pair
    for text in TEXTS:
        for add_special_tokens in (True, False):
            expected = hf(text, add_special_tokens=add_special_tokens).input_ids  # type: ignore[operator]
            assert ours.encode(text, add_special_tokens) == expected, (text, add_special_tokens)


def test_decode_matches_autotokenizer(pair: tuple[Tokenizer, object]) -> None:
    ours, hf = pair
    rng = random.Random(0)
    streams = [ours.encode(text) for text in TEXTS]
    streams += [[rng.randrange(ours.vocab_size) for _ in range(20)] for _ in range(20)]
    for ids in streams:
        for skip in (True, False):
            assert ours.decode(ids, skip) == hf.decode(ids, skip_special_tokens=skip)  # type: ignore[attr-defined]


def test_special_ids_match_autotokenizer(pair: tuple[Tokenizer, object]) -> None:
    ours, hf = pair
    assert ours.bos_token_id == hf.bos_token_id  # type: ignore[attr-defined]
    assert ours.eos_token_id == hf.eos_token_id  # type: ignore[attr-defined]
    assert ours.vocab_size == len(hf)  # type: ignore[arg-type]
    assert set(hf.all_special_ids) <= set(ours.all_special_ids)  # type: ignore[attr-defined]


def test_chat_template_matches_autotokenizer(pair: tuple[Tokenizer, object]) -> None:
    ours, hf = pair
    for messages in MESSAGES:
        for add_generation_prompt in (True, False):
            expected = hf.apply_chat_template(  # type: ignore[attr-defined]
                messages, tokenize=False, add_generation_prompt=add_generation_prompt
            )
            assert ours.apply_chat_template(messages, add_generation_prompt) == expected


def test_eos_ids_are_the_union_of_all_configs(llama_checkpoint: Path) -> None:
    tokenizer = Tokenizer.from_model_dir(llama_checkpoint)
    # tokenizer_config eos <|im_end|> = 2 first; generation_config [2, 0]; config.json 0.
    assert tokenizer.eos_token_ids == (2, 0) and tokenizer.eos_token_id == 2
    assert tokenizer.bos_token_id == 0
    assert tokenizer.encode("hi")[0] == 0  # the llama demo tokenizer adds BOS


def test_chat_template_errors(llama_checkpoint: Path, tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    shutil.copytree(llama_checkpoint, path)
    config_path = path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = (
        "{% if messages[0]['role'] != 'user' %}"
        "{{ raise_exception('first message must be from the user') }}"
        "{% endif %}{{ messages | tojson }}{{ bos_token }}"
    )
    config_path.write_text(json.dumps(config))
    tokenizer = Tokenizer.from_model_dir(path)
    assert (
        tokenizer.apply_chat_template([{"role": "user", "content": "é"}])
        == '[{"role": "user", "content": "é"}]<|endoftext|>'
    )
    with pytest.raises(ChatTemplateError, match="first message must be from the user"):
        tokenizer.apply_chat_template([{"role": "assistant", "content": "x"}])
    # The sandbox stops templates from reaching Python internals.
    config["chat_template"] = "{{ messages.__class__.__mro__ }}"
    config_path.write_text(json.dumps(config))
    with pytest.raises(ChatTemplateError):
        Tokenizer.from_model_dir(path).apply_chat_template([])
    del config["chat_template"]
    config_path.write_text(json.dumps(config))
    tokenizer = Tokenizer.from_model_dir(path)
    assert not tokenizer.has_chat_template
    with pytest.raises(ChatTemplateError, match="no chat template"):
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])


def stream(
    tokenizer: Tokenizer,
    prompt: list[int],
    output: list[int],
    seed: int,
    skip_special_tokens: bool = True,
) -> tuple[str, list[str]]:
    """Feed `output` in random-sized chunks; return the detokenizer's text and its deltas."""
    rng = random.Random(seed)
    detok = IncrementalDetokenizer(tokenizer, prompt, skip_special_tokens)
    deltas, i = [], 0
    while i < len(output):
        n = rng.randint(1, 3)
        deltas.append(detok.append(output[i : i + n]))
        i += n
    assert "".join(deltas) == detok.text
    return detok.text, deltas


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_incremental_detokenizer_reproduces_full_decode(
    llama_checkpoint: Path, skip_special_tokens: bool
) -> None:
    tokenizer = Tokenizer.from_model_dir(llama_checkpoint)
    prompt = tokenizer.encode("Tell me a story:")
    flush = tokenizer.encode(" the end", add_special_tokens=False)
    rng = random.Random(1)
    for seed in range(50):
        output = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.randint(1, 30))] + flush
        text, _ = stream(tokenizer, prompt, output, seed, skip_special_tokens)
        assert text == tokenizer.decode(output, skip_special_tokens), seed


def test_multibyte_character_is_held_back_until_complete(llama_checkpoint: Path) -> None:
    tokenizer = Tokenizer.from_model_dir(llama_checkpoint)
    emoji = tokenizer.encode("🙂", add_special_tokens=False)
    assert len(emoji) == 4  # one byte per token: not in the tiny vocabulary
    detok = IncrementalDetokenizer(tokenizer, tokenizer.encode("Smile:"))
    deltas = [detok.append([t]) for t in [*emoji, *tokenizer.encode("!", add_special_tokens=False)]]
    assert deltas == ["", "", "", "🙂", "!"]


def test_incremental_detokenizer_keeps_context_spaces() -> None:
    # A SentencePiece-style tokenizer: decode() of a suffix drops the word's leading space.
    backend = HFTokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    backend.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    backend.train_from_iterator(
        DEMO_CORPUS.splitlines(),
        trainers.BpeTrainer(
            vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False
        ),
    )
    tokenizer = Tokenizer(backend, {"bos_token": "<s>", "eos_token": "</s>"})
    prompt = tokenizer.encode("The capital of France")
    output = tokenizer.encode(" is Paris, a city on the river.", add_special_tokens=False)
    assert not tokenizer.decode(output).startswith(" ")  # the naive per-suffix decode
    full = tokenizer.decode(prompt + output)
    for seed in range(5):
        text, _ = stream(tokenizer, prompt, output, seed)
        assert text == " is Paris, a city on the river."
        assert full.endswith(text)


def test_find_stop_string() -> None:
    assert find_stop_string("Hello world", 5, ["wor"]) == 6
    assert find_stop_string("Hello world", 0, ["wor"]) is None
    # "lo w" straddles old and new text: found; a match wholly in old text is not new.
    assert find_stop_string("Hello world", 5, ["lo w"]) == 3
    assert find_stop_string("Hello world", 4, ["lo w"]) is None
    assert find_stop_string("Hello world", 2, ["Hell"]) is None
    assert find_stop_string("a STOP b END", 6, ["END", "b"]) == 7  # earliest wins
    assert find_stop_string("abc", 3, []) is None
    text, cuts = "", []
    for piece in ["The answer", " is 4", "2.\n\nQ", "uestion"]:
        text += piece
        cuts.append(find_stop_string(text, len(piece), ["\n\nQuestion", "42"]))
    assert cuts == [None, None, 14, 17]  # "42" completed by the third piece, then "\n\nQuestion"
