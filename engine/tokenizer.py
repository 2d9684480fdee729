"""Tokenization for the engine: the checkpoint's `tokenizer.json` through HF `tokenizers`.

`Tokenizer` encodes and decodes like transformers' AutoTokenizer (fast) does for the same files
and renders the checkpoint's chat template in a sandboxed Jinja environment.
`IncrementalDetokenizer` turns a stream of generated ids into text deltas; `find_stop_string`
finds where a stop string cuts the text.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import tokenizers
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken

from loraplex.engine.errors import ChatTemplateError, ModelLoadError

_NAMED_SPECIAL_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
# How many prompt tokens the detokenizer decodes as context before the first output token
# (enough for a multi-byte character or a leading-space marker).
_INITIAL_DETOKENIZATION_OFFSET = 5
_REPLACEMENT_CHAR = "\ufffd"


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: cannot read JSON ({e})") from e
    return data if isinstance(data, dict) else {}


def _token_content(value: Any) -> str | None:
    # tokenizer_config.json writes a special token as a string or as an AddedToken dict.
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, list) else [value]) if v is not None]


def _find_chat_template(root: Path, tokenizer_config: dict[str, Any]) -> str | None:
    # transformers 5 saves it as chat_template.jinja; older versions inside tokenizer_config.json.
    jinja_file = root / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = tokenizer_config.get("chat_template")
    if template is None:
        template = _read_json(root / "chat_template.json").get("chat_template")
    if isinstance(template, list):  # named templates: use "default"
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (assistant-mask markers): renders its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes HTML characters; chat templates expect plain JSON.
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def compile_chat_template(source: str) -> jinja2.Template:
    """Compile a chat template in the sandbox, with the helpers transformers provides."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ModelLoadError(f"the chat template does not compile: {e}") from e


class Tokenizer:
    """A checkpoint's tokenizer: encode/decode, special ids, chat template."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        tokenizer_config: dict[str, Any],
        model_eos_token_ids: Sequence[int] = (),
        model_bos_token_id: int | None = None,
        chat_template: str | None = None,
    ) -> None:
        self.backend = backend
        self.special_tokens_map: dict[str, str] = {}
        for name in _NAMED_SPECIAL_TOKENS:
            content = _token_content(tokenizer_config.get(name))
            if content is not None:
                self.special_tokens_map[name] = content
        extra = (
            tokenizer_config.get("additional_special_tokens")
            or tokenizer_config.get("extra_special_tokens")
            or []
        )
        extra_tokens = extra.values() if isinstance(extra, dict) else extra
        self._register_special_tokens(
            [*self.special_tokens_map.values(), *filter(None, map(_token_content, extra_tokens))]
        )
        # Like transformers 5, tokenizer.json's post-processor alone decides whether BOS/EOS are
        # added: tokenizer_config's add_bos_token/add_eos_token are ignored.
        bos = self.special_tokens_map.get("bos_token")
        self.bos_token_id = backend.token_to_id(bos) if bos is not None else model_bos_token_id
        eos = self.special_tokens_map.get("eos_token")
        eos_id = backend.token_to_id(eos) if eos is not None else None
        ordered = ([eos_id] if eos_id is not None else []) + list(model_eos_token_ids)
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(ordered))
        self.eos_token_id: int | None = self.eos_token_ids[0] if self.eos_token_ids else None
        self.chat_template = chat_template
        self._compiled_template = (
            compile_chat_template(chat_template) if chat_template is not None else None
        )

    @classmethod
    def from_model_dir(cls, model_dir: str | os.PathLike[str]) -> Tokenizer:
        """Load tokenizer.json, tokenizer_config.json, and eos ids from config/generation_config."""
        root = Path(model_dir)
        path = root / "tokenizer.json"
        if not path.is_file():
            raise ModelLoadError(f"{root}: tokenizer.json is missing")
        try:
            backend = tokenizers.Tokenizer.from_file(str(path))
        except Exception as e:  # the Rust side raises plain Exception
            raise ModelLoadError(f"{path}: cannot load ({e})") from e
        tokenizer_config = _read_json(root / "tokenizer_config.json")
        config = _read_json(root / "config.json")
        generation_config = _read_json(root / "generation_config.json")
        eos_ids = _ids(generation_config.get("eos_token_id")) + _ids(config.get("eos_token_id"))
        bos_ids = _ids(generation_config.get("bos_token_id")) + _ids(config.get("bos_token_id"))
        return cls(
            backend,
            tokenizer_config,
            eos_ids,
            bos_ids[0] if bos_ids else None,
            _find_chat_template(root, tokenizer_config),
        )

    def _register_special_tokens(self, contents: Iterable[str]) -> None:
        # As transformers does: named special tokens become special added tokens, so that they
        # are matched whole in text and skipped by decode(skip_special_tokens=True).
        special = {t.content for t in self.backend.get_added_tokens_decoder().values() if t.special}
        missing = [c for c in dict.fromkeys(contents) if c not in special]
        if missing:
            self.backend.add_special_tokens(
                [AddedToken(c, special=True, normalized=False) for c in missing]
            )

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce (base vocabulary plus added tokens)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def all_special_ids(self) -> list[int]:
        return sorted(i for i, t in self.backend.get_added_tokens_decoder().items() if t.special)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Text -> ids, as AutoTokenizer(text).input_ids (BOS added if the tokenizer adds it)."""
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Ids -> text. Ids outside the vocabulary decode to nothing."""
        return self.backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    @property
    def has_chat_template(self) -> bool:
        return self._compiled_template is not None

    def apply_chat_template(
        self,
        messages: Sequence[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        """Render messages ([{"role", "content"}, ...]) with the checkpoint's chat template."""
        if self._compiled_template is None:
            raise ChatTemplateError(
                "this model has no chat template (tokenizer_config.json "
                "chat_template / chat_template.jinja); use completions"
            )
        variables = {**self.special_tokens_map, **kwargs}
        try:
            return self._compiled_template.render(
                messages=[dict(m) for m in messages],
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template error: {e}") from e


class IncrementalDetokenizer:
    """Generated ids -> text deltas, each id decoded in the context of the ones before it.

    vLLM's method: decode a short window `ids[prefix_offset:]` and emit what it adds beyond
    `ids[prefix_offset:read_offset]`. Text ending in U+FFFD (a UTF-8 character split across
    tokens) is held back until the rest arrives.

        ids:  ... p0 p1 p2 p3 p4 | o0 o1 o2
                  ^prefix_offset  ^read_offset   (emitted text covers ids up to read_offset)
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_token_ids: Sequence[int],
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._ids = list(prompt_token_ids[-_INITIAL_DETOKENIZATION_OFFSET:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._chunks: list[str] = []

    @property
    def text(self) -> str:
        """All output text emitted so far."""
        return "".join(self._chunks)

    def append(self, token_ids: Sequence[int]) -> str:
        """Add generated ids; return the text they complete (may be empty)."""
        self._ids.extend(token_ids)
        decode = self._tokenizer.decode
        prefix_text = decode(
            self._ids[self._prefix_offset : self._read_offset], self._skip_special_tokens
        )
        new_text = decode(self._ids[self._prefix_offset :], self._skip_special_tokens)
        if len(new_text) <= len(prefix_text) or new_text.endswith(_REPLACEMENT_CHAR):
            return ""
        if new_text.startswith(prefix_text):
            delta = new_text[len(prefix_text) :]
        else:  # a character split at the prompt boundary, completed by the output
            delta = new_text[len(os.path.commonprefix([prefix_text, new_text])) :]
        # Keep only the window still needed: drop ids before the new prefix offset.
        del self._ids[: self._read_offset]
        self._prefix_offset, self._read_offset = 0, len(self._ids)
        self._chunks.append(delta)
        return delta

    def flush(self) -> str:
        """At the end of a completion: the held-back text (e.g. a lone U+FFFD), if any."""
        decode = self._tokenizer.decode
        prefix_text = decode(
            self._ids[self._prefix_offset : self._read_offset], self._skip_special_tokens
        )
        new_text = decode(self._ids[self._prefix_offset :], self._skip_special_tokens)
        delta = new_text[len(os.path.commonprefix([prefix_text, new_text])) :]
        self._prefix_offset = self._read_offset = len(self._ids)
        self._chunks.append(delta)
        return delta


def find_stop_string(text: str, new_text_len: int, stops: Sequence[str]) -> int | None:
    """Where the earliest stop string that the last `new_text_len` characters completed starts.

    Only the tail that could hold a new match is searched, so a text scanned step by step costs
    O(new text + longest stop) per step. `text[:result]` is the output with the stop removed.
    """
    if new_text_len <= 0:
        return None
    best: int | None = None
    for stop in stops:
        start = max(0, len(text) - new_text_len - len(stop) + 1)
        index = text.find(stop, start)
        if index != -1 and (best is None or index < best):
            best = index
    return best
