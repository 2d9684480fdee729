"""Inference services: planning, admission, the engine stream, OpenAI formatting."""

from loraplex.platform.services.chat import collect_chat, plan_chat, stream_chat
from loraplex.platform.services.completions import (
    collect_completion,
    plan_completion,
    stream_completion,
)
from loraplex.platform.services.generation import GenerationPlan, GenerationRun, admit

__all__ = [
    "GenerationPlan",
    "GenerationRun",
    "admit",
    "collect_chat",
    "collect_completion",
    "plan_chat",
    "plan_completion",
    "stream_chat",
    "stream_completion",
]
